"""Placements the records do not show yet, so a burst of requests does not pile up.

Records reach the placer one scrape late, and a container needs a moment to start and take
its memory: for ``settle_s`` after a placement its node's record cannot show it. Until a
record of that node is at least ``settle_s`` newer than the placement, the placement counts
as one more task and its memory on the GPU (``ranking.Pending``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from gpuguard.placer.ranking import Pending

DEFAULT_SETTLE_S = 10.0
#: A placement whose node never reports again is forgotten after this many settle times.
_FORGET_AFTER_SETTLES = 12


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    gpu: str
    memory_bytes: int
    at: float


class Reservations:
    """Recent placements by (node, GPU); thread-safe."""

    def __init__(self, settle_s: float = DEFAULT_SETTLE_S) -> None:
        self.settle_s = settle_s
        self._placements: list[Placement] = []
        self._lock = threading.Lock()

    def add(self, node: str, gpu: str, memory_bytes: int, at: float) -> None:
        with self._lock:
            self._placements.append(Placement(node, gpu, memory_bytes, at))

    def pending(
        self, record_times: Mapping[str, float], now: float
    ) -> dict[tuple[str, str], Pending]:
        """What each GPU has pending, given each node's newest record time.

        A placement is settled (and forgotten) once its node's record is ``settle_s`` newer;
        on a node that stopped reporting it is forgotten after 12 settle times.
        """
        out: dict[tuple[str, str], Pending] = {}
        forget_before = now - _FORGET_AFTER_SETTLES * self.settle_s
        with self._lock:
            kept = []
            for p in self._placements:
                seen = record_times.get(p.node)
                if p.at < forget_before or (seen is not None and seen >= p.at + self.settle_s):
                    continue
                kept.append(p)
                old = out.get((p.node, p.gpu), Pending())
                out[(p.node, p.gpu)] = Pending(old.tasks + 1, old.memory_bytes + p.memory_bytes)
            self._placements = kept
        return out

    def __len__(self) -> int:
        return len(self._placements)
