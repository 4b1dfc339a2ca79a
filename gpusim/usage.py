"""Usage accounting with NVML's meanings, over the busy intervals the simulator reports.

Device utilization is the share of a sample period during which at least one kernel ran
(so one tiny kernel reads as 100%, as on a real GPU). A process's SM ratio is its share of
SM time over the period: 1/n of the busy time while n kernels time-slice.
"""

from __future__ import annotations

from collections import deque

from gpusim.model import Segment


def _overlap(segment: Segment, start: float, end: float) -> float:
    return max(0.0, min(segment.end, end) - max(segment.start, start))


class UsageHistory:
    """Busy intervals of one device over the last ``horizon`` seconds."""

    def __init__(self, horizon: float) -> None:
        self.horizon = horizon
        self.segments: deque[Segment] = deque()
        self.last_kernel: dict[int, float] = {}

    def record(self, segment: Segment) -> None:
        """Add a busy interval (simulator callback); merges with an identical neighbour."""
        last = self.segments[-1] if self.segments else None
        if (
            last is not None
            and last.end == segment.start
            and last.sm_share == segment.sm_share
            and last.copy_share == segment.copy_share
        ):
            self.segments[-1] = Segment(last.start, segment.end, last.sm_share, last.copy_share)
        else:
            self.segments.append(segment)
        for pid in segment.sm_share:
            self.last_kernel[pid] = segment.end
        self._prune(segment.end - self.horizon)

    def _prune(self, before: float) -> None:
        while self.segments and self.segments[0].end < before:
            self.segments.popleft()
        for pid in [pid for pid, t in self.last_kernel.items() if t < before]:
            del self.last_kernel[pid]

    def utilization(self, start: float, end: float) -> float:
        """Share of ``[start, end]`` during which at least one kernel ran."""
        if end <= start:
            return 0.0
        busy = sum(_overlap(s, start, end) for s in self.segments if s.sm_share)
        return min(1.0, busy / (end - start))

    def sm_ratio(self, pid: int, start: float, end: float) -> float:
        """Share of SM time ``pid`` got during ``[start, end]``."""
        if end <= start:
            return 0.0
        used = sum(_overlap(s, start, end) * s.sm_share.get(pid, 0.0) for s in self.segments)
        return min(1.0, used / (end - start))

    def copy_ratio(self, pid: int, start: float, end: float) -> float:
        """Share of copy bandwidth (both directions added, capped at 1) ``pid`` got."""
        if end <= start:
            return 0.0
        used = sum(_overlap(s, start, end) * s.copy_share.get(pid, 0.0) for s in self.segments)
        return min(1.0, used / (end - start))

    def kernel_pids_since(self, t: float) -> dict[int, float]:
        """Processes that ran a kernel after ``t``, with the time they last did."""
        return {pid: last for pid, last in self.last_kernel.items() if last > t}
