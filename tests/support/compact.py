"""Read paper C's 16-byte report (``NodeRecord.compact()``) back: the tests' check that the
encoding is exact. Nothing in gpuguard decodes it (Prometheus metrics are the transport)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuguard.noderecord import COMPACT_SIZE, FLOAT_MS_MAX


@dataclass(frozen=True, slots=True)
class CompactRecord:
    """What a 16-byte report carries."""

    state: int
    float_time_s: float
    memory_free_bytes: int


def decode_compact(data: bytes) -> CompactRecord:
    """Read ``NodeRecord.compact()`` back; ValueError when it is not 16 bytes."""
    if len(data) != COMPACT_SIZE:
        raise ValueError(f"a compact record has {COMPACT_SIZE} bytes, got {len(data)}")
    ms = int.from_bytes(data[1:6], "big", signed=True)
    return CompactRecord(
        state=data[0],
        float_time_s=math.inf if ms == FLOAT_MS_MAX else ms / 1000,
        memory_free_bytes=int.from_bytes(data[6:], "big"),
    )
