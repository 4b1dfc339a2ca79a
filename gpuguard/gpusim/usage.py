"""Usage accounting with NVML's meanings, over the intervals the simulator reports.

Device utilization is the share of a sample period during which at least one kernel ran
(so one tiny kernel reads as 100%, as on a real GPU). A process's SM ratio is its share of
SM time over the period: 1/n of the busy time while n kernels time-slice.

Each quantity is kept as a cumulative integral (piecewise linear in time), so the usage over
any window is two look-ups, whatever the number of processes and events in between: the
exporter samples several times a second while a busy device has many short intervals.
"""

from __future__ import annotations

from bisect import bisect_right

from gpuguard.gpusim.contention import Segment

# Checkpoints are pruned in batches of this many records, not on every one.
_PRUNE_EVERY = 256


class Integral:
    """Cumulative amount of one usage rate: checkpoints of (time, total so far, rate after)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.totals: list[float] = []
        self.rates: list[float] = []

    def set_rate(self, t: float, rate: float) -> None:
        """From ``t`` on, the quantity grows at ``rate`` per second."""
        if self.rates and self.rates[-1] == rate:
            return
        total = self.value(t)
        if self.times and self.times[-1] == t:
            self.totals[-1], self.rates[-1] = total, rate
        else:
            self.times.append(t)
            self.totals.append(total)
            self.rates.append(rate)

    def value(self, t: float) -> float:
        """The total accumulated up to ``t``."""
        i = bisect_right(self.times, t) - 1
        if i < 0:
            return 0.0
        return self.totals[i] + self.rates[i] * (t - self.times[i])

    def prune(self, before: float) -> None:
        """Forget checkpoints no longer needed for times at or after ``before``."""
        keep_from = max(0, bisect_right(self.times, before) - 1)
        if keep_from:
            del self.times[:keep_from], self.totals[:keep_from], self.rates[:keep_from]

    @property
    def idle_since(self) -> float | None:
        """When the rate last dropped to 0 (None while it is not 0)."""
        return self.times[-1] if self.rates and self.rates[-1] == 0.0 else None


class UsageHistory:
    """Busy time of one device and of each process on it, over the last ``horizon`` seconds."""

    def __init__(self, horizon: float) -> None:
        self.horizon = horizon
        self.busy = Integral()
        self.sm: dict[int, Integral] = {}
        self.copy: dict[int, Integral] = {}
        self.last_kernel: dict[int, float] = {}
        self.recorded_until: float | None = None
        self._records = 0

    def record(self, segment: Segment) -> None:
        """Account one interval (simulator callback); intervals arrive in time order."""
        if self.recorded_until is not None and segment.start > self.recorded_until:
            self._set_rates(self.recorded_until, {}, {})  # a gap is idle time
        self._set_rates(segment.start, segment.sm_share, segment.copy_share)
        for pid in segment.sm_share:
            self.last_kernel[pid] = segment.end
        self.recorded_until = segment.end
        self._records += 1
        if self._records % _PRUNE_EVERY == 0:
            self._prune(segment.end - self.horizon)

    def _set_rates(self, t: float, sm: dict[int, float], copy: dict[int, float]) -> None:
        self.busy.set_rate(t, 1.0 if sm else 0.0)
        for shares, integrals in ((sm, self.sm), (copy, self.copy)):
            for pid, integral in integrals.items():
                if pid not in shares:
                    integral.set_rate(t, 0.0)
            for pid, share in shares.items():
                integrals.setdefault(pid, Integral()).set_rate(t, share)

    def _prune(self, before: float) -> None:
        self.busy.prune(before)
        for integrals in (self.sm, self.copy):
            for pid in list(integrals):
                idle_since = integrals[pid].idle_since
                if idle_since is not None and idle_since < before:
                    del integrals[pid]
                else:
                    integrals[pid].prune(before)
        for pid in [pid for pid, t in self.last_kernel.items() if t < before]:
            del self.last_kernel[pid]

    def _ratio(self, integral: Integral | None, start: float, end: float) -> float:
        if integral is None or end <= start or self.recorded_until is None:
            return 0.0
        # Nothing after the last recorded interval has happened yet.
        hi, lo = min(end, self.recorded_until), min(start, self.recorded_until)
        return min(1.0, max(0.0, (integral.value(hi) - integral.value(lo)) / (end - start)))

    def utilization(self, start: float, end: float) -> float:
        """Share of ``[start, end]`` during which at least one kernel ran."""
        return self._ratio(self.busy, start, end)

    def sm_ratio(self, pid: int, start: float, end: float) -> float:
        """Share of SM time ``pid`` got during ``[start, end]``."""
        return self._ratio(self.sm.get(pid), start, end)

    def copy_ratio(self, pid: int, start: float, end: float) -> float:
        """Share of copy bandwidth (both directions added, capped at 1) ``pid`` got."""
        return self._ratio(self.copy.get(pid), start, end)

    def kernel_pids_since(self, t: float) -> dict[int, float]:
        """Processes that ran a kernel after ``t``, with the time they last did."""
        return {pid: last for pid, last in self.last_kernel.items() if last > t}
