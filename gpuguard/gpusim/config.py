"""The daemon's configuration: devices, MIG instances and scales, parsed from command lines.

Defaults come from the device profile (``--profile``, paper B's GPU unless told).
"""

from __future__ import annotations

import re
import uuid as uuid_mod
from dataclasses import dataclass, field
from functools import cache

from gpuguard.gpusim.profile import DeviceProfile, default_profile
from gpuguard.gpusim.units import parse_size, positive_float

__all__ = [
    "DaemonConfig",
    "DeviceSpec",
    "MigSpec",
    "parse_device_spec",
    "parse_size",
    "positive_float",
]

#: Compute slices of a MIG-capable GPU (A100, H100): a ``3g`` instance has 3 of 7.
MIG_SLICES = 7
_MIG_PROFILE = re.compile(r"^([1-7])g\.([0-9]+)gb$")

_PAPER_B = cache(default_profile)
DEFAULT_MEMORY = 24 * 2**30
DEFAULT_CONTEXT_MEMORY = 300 * 2**20
DEFAULT_SAMPLE_PERIOD_S = 1.0 / 6.0


def _derived_uuid(prefix: str, key: str) -> str:
    # Stable per device, so a restarted daemon shows the same device.
    return f"{prefix}-{uuid_mod.uuid5(uuid_mod.NAMESPACE_DNS, key)}"


@dataclass(frozen=True)
class MigSpec:
    """One MIG instance, named like NVIDIA's profiles: ``3g.40gb`` (3 of 7 slices, 40 GiB)."""

    profile: str
    slices: int
    memory_bytes: int

    @property
    def compute_fraction(self) -> float:
        return self.slices / MIG_SLICES


def parse_mig_profile(text: str) -> MigSpec:
    """``3g.40gb`` as a MigSpec (memory taken as GiB)."""
    match = _MIG_PROFILE.match(text.strip().lower())
    if match is None:
        raise ValueError(f"invalid MIG profile {text!r} (examples: 1g.10gb, 3g.40gb, 7g.80gb)")
    return MigSpec(match.group(0), int(match.group(1)), int(match.group(2)) * 2**30)


@dataclass(frozen=True)
class DeviceSpec:
    """One simulated GPU; with ``mig`` set it is in MIG mode and only its instances run work."""

    index: int
    name: str = "gpusim"
    memory_bytes: int = DEFAULT_MEMORY
    uuid: str = ""
    mig: tuple[MigSpec, ...] = ()

    def __post_init__(self) -> None:
        if not self.uuid:
            object.__setattr__(
                self, "uuid", _derived_uuid("GPU", f"gpusim-{self.index}-{self.name}")
            )
        if sum(m.slices for m in self.mig) > MIG_SLICES:
            raise ValueError(f"device {self.index}: MIG instances use more than 7 slices")
        if sum(m.memory_bytes for m in self.mig) > self.memory_bytes:
            raise ValueError(f"device {self.index}: MIG instances need more memory than it has")

    def mig_uuid(self, mig_index: int) -> str:
        """UUID of MIG instance ``mig_index`` (``MIG-...``, as NVML names them)."""
        return _derived_uuid("MIG", f"{self.uuid}/{mig_index}")


def parse_device_spec(text: str, index: int, memory_bytes: int = DEFAULT_MEMORY) -> DeviceSpec:
    """``name=sim0,memory=80GiB,uuid=GPU-...,mig=3g.40gb+3g.40gb`` (every key optional)."""
    values: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in ("name", "memory", "uuid", "mig") or not value:
            raise ValueError(
                f"invalid device spec {text!r}: use name=...,memory=...,uuid=...,mig=...+..."
            )
        values[key] = value
    memory = parse_size(values["memory"]) if "memory" in values else memory_bytes
    if memory <= 0:
        raise ValueError(f"device memory must be > 0 in {text!r}")
    mig = tuple(parse_mig_profile(p) for p in values["mig"].split("+")) if "mig" in values else ()
    return DeviceSpec(index, values.get("name", "gpusim"), memory, values.get("uuid", ""), mig)


@dataclass(frozen=True)
class DaemonConfig:
    """Everything ``gpusim serve`` needs besides the socket path."""

    devices: tuple[DeviceSpec, ...] = field(default_factory=lambda: (DeviceSpec(0),))
    time_scale: float = 1.0
    copy_time_scale: float = 1.0
    context_memory_bytes: int = DEFAULT_CONTEXT_MEMORY
    sample_period_s: float = DEFAULT_SAMPLE_PERIOD_S
    profile: DeviceProfile = field(default_factory=_PAPER_B)
    launch_queue_depth: int = 1024

    def __post_init__(self) -> None:
        if self.launch_queue_depth < 1:
            raise ValueError("launch queue depth must be >= 1")
