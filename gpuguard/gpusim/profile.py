"""Device profiles: the contention model's parameters for one kind of GPU, as JSON.

A profile holds what a real GPU was measured to do, so that gpusim behaves like it: the
kernel time of n concurrent reference matmuls (the context-switch overhead curve), copy
bandwidth each way, NVML's utilization sample period, memory, the context's own memory and
the depth of a context's launch queue. ``paper-b`` (paper B's RTX 3090, its Table 1) ships
with gpusim and is the default; a kit run on a real GPU writes another one (``--profile
h100.json``). The format is in docs/interfaces.md section 1.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuguard import loader
from gpuguard.gpusim.contention import matmul_flops
from gpuguard.gpusim.units import parse_size
from gpuguard.slowdown import slowdown_factor

PROFILE_FORMAT = 1
DEFAULT_PROFILE = "paper-b"
PROFILES_DIR = Path(__file__).parent / "profiles"
MAX_PROFILE_BYTES = 1 << 20  # a shipped profile is under 1 kB


@dataclass(frozen=True)
class DeviceProfile:
    """The measured behaviour of one kind of GPU (see the module docstring)."""

    name: str
    description: str
    reference_matmul_size: int
    concurrent_kernel_s: tuple[float, ...]
    copy_in_bytes_per_s: float
    copy_out_bytes_per_s: float
    sample_period_s: float
    memory_bytes: int
    context_memory_bytes: int
    launch_queue_depth: int

    @property
    def flops_per_s(self) -> float:
        """Throughput of one kernel alone: the reference matmul's flops over its time."""
        return matmul_flops(self.reference_matmul_size) / self.concurrent_kernel_s[0]

    def slowdown_factor(self, n: int) -> float:
        """Context-switch overhead of ``n`` time-sliced kernels on this GPU."""
        return slowdown_factor(n, self.concurrent_kernel_s)

    def to_json(self) -> dict[str, Any]:
        """The profile as its JSON document (what ``load_profile`` reads back)."""
        return {
            "format": PROFILE_FORMAT,
            "name": self.name,
            "description": self.description,
            "reference_matmul_size": self.reference_matmul_size,
            "concurrent_kernel_s": list(self.concurrent_kernel_s),
            "copy_in_bytes_per_s": self.copy_in_bytes_per_s,
            "copy_out_bytes_per_s": self.copy_out_bytes_per_s,
            "sample_period_s": self.sample_period_s,
            "memory": self.memory_bytes,
            "context_memory": self.context_memory_bytes,
            "launch_queue_depth": self.launch_queue_depth,
        }


def _number(doc: dict[str, Any], key: str, integer: bool = False) -> float:
    value = doc.get(key)
    number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
    if not math.isfinite(number) or number <= 0 or (integer and not number.is_integer()):
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{key!r} must be {kind} > 0, got {json.dumps(value)}")
    return number


def _size(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key)
    if isinstance(value, str):
        size = parse_size(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        raise ValueError(f"{key!r} must be bytes or a size such as '24GiB', got {value!r}")
    if size <= 0:
        raise ValueError(f"{key!r} must be > 0")
    return size


def parse_profile(doc: Any) -> DeviceProfile:
    """Validate a profile document; ValueError names the first bad key."""
    if not isinstance(doc, dict):
        raise ValueError("a profile must be a JSON object")
    if doc.get("format") != PROFILE_FORMAT:
        raise ValueError(f"'format' must be {PROFILE_FORMAT}, got {doc.get('format')!r}")
    known = set(DeviceProfile.__dataclass_fields__) - {"memory_bytes", "context_memory_bytes"}
    unknown = set(doc) - known - {"format", "memory", "context_memory"}
    if unknown:
        raise ValueError(f"unknown profile keys: {', '.join(sorted(unknown))}")
    name, description = doc.get("name"), doc.get("description", "")
    if not isinstance(name, str) or not name or not isinstance(description, str):
        raise ValueError("'name' must be a non-empty string, 'description' a string")
    curve = doc.get("concurrent_kernel_s")
    if not isinstance(curve, list) or not curve:
        raise ValueError("'concurrent_kernel_s' must be a non-empty list (seconds, n = 1, 2, ...)")
    times = tuple(_number({"concurrent_kernel_s[]": t}, "concurrent_kernel_s[]") for t in curve)
    return DeviceProfile(
        name=name,
        description=description,
        reference_matmul_size=int(_number(doc, "reference_matmul_size", integer=True)),
        concurrent_kernel_s=times,
        copy_in_bytes_per_s=_number(doc, "copy_in_bytes_per_s"),
        copy_out_bytes_per_s=_number(doc, "copy_out_bytes_per_s"),
        sample_period_s=_number(doc, "sample_period_s"),
        memory_bytes=_size(doc, "memory"),
        context_memory_bytes=_size(doc, "context_memory"),
        launch_queue_depth=int(_number(doc, "launch_queue_depth", integer=True)),
    )


def load_profile(name_or_path: str) -> DeviceProfile:
    """A shipped profile by name (``paper-b``), or a JSON file by path (``./h100.json``)."""
    is_path = "/" in name_or_path or name_or_path.endswith(".json")
    path = Path(name_or_path) if is_path else PROFILES_DIR / f"{name_or_path}.json"
    if not is_path and not path.is_file():
        shipped = sorted(p.stem for p in PROFILES_DIR.glob("*.json"))
        raise ValueError(f"no profile {name_or_path!r}; shipped: {', '.join(shipped)}")
    doc = loader.read_json(path, "--profile", MAX_PROFILE_BYTES)  # ConfigError: a ValueError
    try:
        return parse_profile(doc)
    except ValueError as exc:
        raise ValueError(f"profile {path}: {exc}") from None


def default_profile() -> DeviceProfile:
    """The shipped ``paper-b`` profile."""
    return load_profile(DEFAULT_PROFILE)
