"""Per-process SM samples held until the next one is due, and what each says of its period.

``SampleHold.apply`` sits between the GPU backend and the join: it takes each poll's
``GpuSample`` and returns it with every process's newest sample standing until the next
is overdue (sample time + period x (1 + ``HOLD_MARGIN``)), dropped when a newer instant
of its device came without it, and not held when it shows the kernels stopping. Held
samples are marked: they keep a task computing but are not new activity. Fresh samples
carry where in their period the activity began (``began_us``) or ended (``ended_us``).
The period is learnt per device, 1/6 s until then; each device of the returned sample says
what was learnt (``sample_period_s``), which the state publishes for the actuator. Why:
docs/design-notes.md, "Tasks" ("Samples") and "Held samples".
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from gpuguard.exporter.model import DeviceSample, GpuSample, ProcessUtilization

DEFAULT_PERIOD_S = 1.0 / 6.0
HOLD_MARGIN = 0.25
#: a device whose processes' shares at one instant add up to less than this was idle for
#: part of the period
BUSY_SHARE = 0.95
#: a share below this part of the one before is a fall
STOP_DROP = 0.8
#: learnt periods stay within these bounds (a gap outside them is not a period)
MIN_PERIOD_S = 0.005
MAX_PERIOD_S = 2.0
_GAPS_KEPT = 32

Key = tuple[str, int]  # (device, pid)


class SampleHold:
    """Stateful filter between the GPU backend and the join (one per poller)."""

    def __init__(self, default_period_s: float = DEFAULT_PERIOD_S) -> None:
        self.default_period_s = default_period_s
        self._last: dict[Key, ProcessUtilization] = {}  # newest fresh sample
        self._before: dict[Key, ProcessUtilization] = {}  # the one before it
        self._run: dict[Key, int] = {}  # instants in a row it had a sample
        self._busy: dict[tuple[str, int], float] = {}  # (device, instant) -> shares added
        self._gaps: dict[str, deque[float]] = {}
        self._newest: dict[str, int] = {}  # the device's newest sample instant so far
        self._pids: dict[str, frozenset[int]] = {}  # the device's processes, last poll

    def period(self, device: str) -> float:
        """The device's sample period as learnt so far."""
        return self.learnt_period(device) or self.default_period_s

    def learnt_period(self, device: str) -> float | None:
        """The device's sample period as learnt from its samples; None before any gap."""
        gaps = self._gaps.get(device)
        return min(gaps) if gaps else None

    def apply(self, sample: GpuSample) -> GpuSample:
        """The sample with fresh samples annotated and held copies added."""
        devices = tuple(self._device(d, sample.timestamp) for d in sample.devices)
        keys = {d.key for d in sample.devices}
        for table in (self._gaps, self._newest, self._pids):
            for key in [k for k in table if k not in keys]:
                del table[key]
        return replace(sample, devices=devices)

    def _device(self, device: DeviceSample, now: float) -> DeviceSample:
        key = device.key
        fresh = self._new(key, device.process_samples)
        for s in fresh:  # every share of an instant first: whether it stops needs them all
            self._busy[(key, s.timestamp_us)] = self._busy.get((key, s.timestamp_us), 0.0)
            self._busy[(key, s.timestamp_us)] += s.sm_ratio
        period = self.period(key)
        gaps: list[float] = []
        fresh = [self._learn(key, s, period, gaps) for s in fresh]
        if gaps:  # one gap a poll: the smallest is all the period estimate needs
            self._gaps.setdefault(key, deque(maxlen=_GAPS_KEPT)).append(min(gaps))
            period = self.period(key)
        pids = frozenset(p.pid for p in device.processes)
        if pids != self._pids.get(key):
            self._forget_processes(key, pids)
            self._pids[key] = pids
        if fresh:
            self._newest[key] = max(self._newest.get(key, 0), fresh[-1].timestamp_us)
        newest_us = self._newest.get(key, 0)
        self._forget_instants(key, newest_us - int(4e6 * period))
        sampled = {s.pid for s in fresh}
        held = []
        for p in device.processes:
            last = self._last.get((key, p.pid))
            if p.pid in sampled or last is None:
                continue
            if now > last.timestamp_us / 1e6 + period * (1 + HOLD_MARGIN):
                continue  # overdue: it ran nothing since
            if newest_us >= last.timestamp_us + 0.5e6 * period:
                continue  # the driver sampled again, and it had run nothing
            if last.ended_us is None:
                held.append(replace(last, held=True))
        learnt = self.learnt_period(key)
        return replace(device, process_samples=(*fresh, *held), sample_period_s=learnt)

    def _new(self, key: str, samples: tuple[ProcessUtilization, ...]) -> list[ProcessUtilization]:
        """Samples not seen before (a backend may repeat some), oldest first."""
        ordered = sorted(samples, key=lambda s: s.timestamp_us)
        out = []
        for s in ordered:
            last = self._last.get((key, s.pid))
            if last is None or s.timestamp_us > last.timestamp_us:
                out.append(s)
        return out

    def _learn(
        self, key: str, s: ProcessUtilization, period: float, gaps: list[float]
    ) -> ProcessUtilization:
        """Remember a fresh sample; returns it with where its activity began or ended (and
        adds its gap from the one before to ``gaps``)."""
        pk = (key, s.pid)
        last = self._last.get(pk)
        run = 1
        if last is not None:
            gap = (s.timestamp_us - last.timestamp_us) / 1e6
            if MIN_PERIOD_S <= gap <= MAX_PERIOD_S:
                gaps.append(gap)
            self._before[pk] = last
            if gap <= 1.5 * period:  # the instant after its last one: the run goes on
                run = self._run.get(pk, 0) + 1
        self._run[pk] = run
        period_us = 1e6 * period
        if run == 1:  # it began within this period, at about its share before the instant
            s = replace(s, began_us=int(s.timestamp_us - min(1.0, s.sm_ratio) * period_us))
        elif self._stopping(key, s):
            idle = 1.0 - self._busy.get((key, s.timestamp_us), 1.0)
            s = replace(s, ended_us=int(s.timestamp_us - max(0.0, idle) * period_us))
        self._last[pk] = s
        return s

    def _stopping(self, key: str, s: ProcessUtilization) -> bool:
        """This sample shows the process's kernels stopping within its period (design notes,
        "Held samples")."""
        if self._busy.get((key, s.timestamp_us), 1.0) >= BUSY_SHARE:
            return False  # busy all along: whoever ran may run on
        before = self._before[(key, s.pid)]  # in a run of two or more: there is one
        return before.sm_ratio >= BUSY_SHARE or s.sm_ratio < STOP_DROP * before.sm_ratio

    @staticmethod
    def _next(before: ProcessUtilization, after: ProcessUtilization, period: float) -> bool:
        """Samples of two instants in a row."""
        return after.timestamp_us - before.timestamp_us <= 1.5e6 * period

    def _forget_processes(self, key: str, on_device: frozenset[int]) -> None:
        for gone in [k for k in self._last if k[0] == key and k[1] not in on_device]:
            for table in (self._last, self._before, self._run):
                table.pop(gone, None)

    def _forget_instants(self, key: str, before_us: int) -> None:
        """Keep the shares of the instants a held sample may still come from."""
        for instant in [i for i in self._busy if i[0] == key and i[1] < before_us]:
            del self._busy[instant]
