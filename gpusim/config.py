"""The daemon's configuration: devices and scales, parsed from command-line strings."""

from __future__ import annotations

import math
import re
import uuid as uuid_mod
from dataclasses import dataclass, field

from gpuguard.gpusim.model import COPY_IN_BYTES_PER_S, COPY_OUT_BYTES_PER_S

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")

DEFAULT_MEMORY = 24 * 2**30
DEFAULT_CONTEXT_MEMORY = 300 * 2**20
DEFAULT_SAMPLE_PERIOD_S = 1.0 / 6.0


def parse_size(text: str) -> int:
    """Bytes from ``"24GiB"``, ``"300MiB"``, ``"1.5GB"`` or a plain integer."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"invalid size {text!r} (examples: 24GiB, 300MiB, 1048576)")
    return int(float(match.group(1)) * _UNITS[unit])


def positive_float(text: str, what: str) -> float:
    """A finite float > 0, or ValueError naming ``what``."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be > 0, got {text!r}")
    return value


@dataclass(frozen=True)
class DeviceSpec:
    """One simulated device."""

    index: int
    name: str = "gpusim"
    memory_bytes: int = DEFAULT_MEMORY
    uuid: str = ""

    def __post_init__(self) -> None:
        if not self.uuid:
            # Stable per index, so a restarted daemon shows the same device.
            derived = uuid_mod.uuid5(uuid_mod.NAMESPACE_DNS, f"gpusim-{self.index}-{self.name}")
            object.__setattr__(self, "uuid", f"GPU-{derived}")


def parse_device_spec(text: str, index: int) -> DeviceSpec:
    """``name=sim0,memory=24GiB,uuid=GPU-...`` (every key optional) as device ``index``."""
    values: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in ("name", "memory", "uuid") or not value:
            raise ValueError(f"invalid device spec {text!r}: use name=...,memory=...,uuid=...")
        values[key] = value
    memory = parse_size(values["memory"]) if "memory" in values else DEFAULT_MEMORY
    if memory <= 0:
        raise ValueError(f"device memory must be > 0 in {text!r}")
    return DeviceSpec(index, values.get("name", "gpusim"), memory, values.get("uuid", ""))


@dataclass(frozen=True)
class DaemonConfig:
    """Everything ``gpusim serve`` needs besides the socket path."""

    devices: tuple[DeviceSpec, ...] = field(default_factory=lambda: (DeviceSpec(0),))
    time_scale: float = 1.0
    copy_time_scale: float = 1.0
    context_memory_bytes: int = DEFAULT_CONTEXT_MEMORY
    sample_period_s: float = DEFAULT_SAMPLE_PERIOD_S
    copy_in_bytes_per_s: float = COPY_IN_BYTES_PER_S
    copy_out_bytes_per_s: float = COPY_OUT_BYTES_PER_S
