"""Paper C's node record, as the exporter publishes it and the placer ranks it.

The types both sides share: a node's per-GPU records and paper C's node-level summary
(state 0/1, float time, free GPU memory). How the exporter computes them from a poll is
``gpuguard/exporter/record.py``; what each field means is docs/interfaces.md §3 and §5.

Table 3's report is 1 + 5 + 10 bytes: ``NodeRecord.compact()`` encodes state, float time
(ms) and free memory (bytes) in exactly that layout; Prometheus metrics are the transport.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpuguard.contract import StateReason

COMPACT_SIZE = 16
#: Float time in ms, signed 40 bits: also what "unbounded" (``inf``) encodes to.
FLOAT_MS_MAX = 2**39 - 1
MEMORY_MAX = 2**80 - 1


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """One GPU's part of the record."""

    gpu: str
    model: str
    state: int
    reasons: tuple[StateReason, ...]
    float_time_s: float  # inf: no task with a deadline in the window
    deadline_tasks: int  # tasks whose float time is summed
    recent_misses: int
    running_tasks: int
    min_slack_s: float | None  # least slack of a running task with a deadline
    busy_ratio: float
    memory_free_bytes: int
    memory_total_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "model": self.model,
            "state": self.state,
            "reasons": [str(r) for r in self.reasons],
            "float_time_s": _finite_or_none(self.float_time_s),
            "deadline_tasks": self.deadline_tasks,
            "recent_misses": self.recent_misses,
            "running_tasks": self.running_tasks,
            "min_slack_s": self.min_slack_s,
            "busy_ratio": self.busy_ratio,
            "memory_free_bytes": self.memory_free_bytes,
            "memory_total_bytes": self.memory_total_bytes,
        }


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node's record: the per-GPU records and paper C's node-level summary."""

    node: str
    timestamp: float
    gpus: tuple[GpuRecord, ...]

    @property
    def state(self) -> int:
        return int(any(g.state for g in self.gpus))

    @property
    def reasons(self) -> tuple[StateReason, ...]:
        """Why the node is in state 0 (empty in state 1)."""
        if not self.gpus:
            return (StateReason.NO_GPU,)
        if self.state:
            return ()
        return tuple(r for r in StateReason if any(r in g.reasons for g in self.gpus))

    @property
    def float_time_s(self) -> float:
        return math.fsum(g.float_time_s for g in self.gpus) if self.gpus else 0.0

    @property
    def memory_free_bytes(self) -> int:
        return sum(g.memory_free_bytes for g in self.gpus)

    def compact(self) -> bytes:
        """Table 3's 16-byte report: state (1 byte), float time in ms (5), free memory (10)."""
        float_ms = self.float_time_s * 1000
        ms = FLOAT_MS_MAX if float_ms >= FLOAT_MS_MAX else max(-FLOAT_MS_MAX, int(float_ms))
        return (
            self.state.to_bytes(1, "big")
            + ms.to_bytes(5, "big", signed=True)
            + min(self.memory_free_bytes, MEMORY_MAX).to_bytes(10, "big")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "timestamp": self.timestamp,
            "state": self.state,
            "reasons": [str(r) for r in self.reasons],
            "float_time_s": _finite_or_none(self.float_time_s),
            "memory_free_bytes": self.memory_free_bytes,
            "compact": self.compact().hex(),
            "gpus": [g.to_json() for g in self.gpus],
        }


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
