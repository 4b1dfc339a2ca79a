"""Containers' GPU activity from the launch probe: owners -> pure join -> tracker -> view.

``ActivityFeed.on_tick`` runs once per probe tick (every ``--probe.interval``): new PIDs get
their container through the same ``/proc/<pid>/cgroup`` reader as the poll, ``group`` joins
processes to containers (pure), and ``ActivityTracker`` turns each container's calls into
busy periods. A busy period starts at its first launch and ends at the return of the wait
that left nothing launched unwaited for (or at its last launch after ``idle_timeout`` without
a wait); two periods less than ``task_gap`` apart are one task (a one-shot's kernels, each
synchronized). Each start and end goes on the event stream at once, timed by the probe
(``gpu_busy``, ``gpu_idle``); ``view`` is the frozen state the poll snapshot carries.
``ActivityFeed.on_wake`` takes the probe's wakes between ticks: an idle container's launch
starts its busy period (and its ``gpu_busy``) then, not at the next tick. A busy period's
end is asked for the same way: at each wait's return after a launch (``on_quiet``), and
after each tick where one is settled, the feed asks the probe for a read when the task gap
after it is over, so its ``gpu_idle`` comes then.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from gpuguard.contract import ActivitySource, EventType, ProbeReason
from gpuguard.exporter.cgroup import ProcReader
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.launchprobe import LaunchSample, ProbeStatus, ProcLaunches, Wake
from gpuguard.exporter.model import ContainerInfo, ProcessOwner

#: two call times closer than this are one call's, read at two ticks (each tick turns the
#: probe's monotonic times into wall time with its own clock offset)
SAME_CALL_S = 0.001
#: a tick asked for at a busy period's end comes this much later, so its clock is past it
TICK_MARGIN_S = 0.0005


@dataclass(frozen=True, slots=True)
class ContainerActivity:
    """One container's driver calls and busy periods, as of ``timestamp``."""

    container_id: str
    timestamp: float
    launches: int
    copies: int
    waits: int
    wait_s: float
    busy: bool
    busy_since: float | None  # the running task's first launch
    busy_s: float  # finished tasks' run time plus the running one's so far
    tasks: int  # finished tasks
    last_task: tuple[float, float] | None  # (first launch, last wait's return)
    #: a kernel launched and not yet waited for (within a busy period, its copies are not)
    in_flight: bool = False
    #: the running task's end if no launch comes within the task gap (its last wait's return)
    ending: float | None = None
    #: copies issued since its last launch, at the probe's tick resolution (a copy in the
    #: tick of a launch counts as that launch's input): a task's output
    copied_since_launch: bool = False
    #: the running busy period may hold several requests: inside it, a launch after a wait
    #: returned came with copies issued since the launches before it (the next request's
    #: input), not only kernels each waited for (a one-shot's)
    merged: bool = False
    #: as ``merged``, of the last finished busy period (``last_task``)
    last_merged: bool = False
    #: the running busy period began after copies issued since the last one ended (its
    #: own input: a request's, not a kernel after host work)
    copied_before: bool = False
    #: next inputs its live processes began: a host-to-device copy after a device-to-host
    #: copy that followed a launch (input, kernels, output, then the next task's input);
    #: the newest one's first copy, and the last launch before it
    next_inputs: int = 0
    next_input: float | None = None
    next_input_after: float | None = None
    #: its live processes' last launch
    last_launch: float | None = None
    #: its newest step seen whole: a burst of launches to the wait that returned after it
    #: (``(first launch, wait's return)``; a training step), from two ticks of one process
    #: between which exactly that wait returned; None until one is
    last_step: tuple[float, float] | None = None


def source_of(
    activity: ContainerActivity | None, probe: ProbeStatus | None, gauge_read: bool = False
) -> tuple[ActivitySource, ProbeReason | None]:
    """How a container is seen: ``launch`` once the probe saw it call the driver (a launch
    or a copy: its calls are seen, so no kernel in flight means none runs), else ``gauge``
    where its own in-flight gauge was read, else ``nvml``; with why not ``launch`` (the
    probe's reason, or ``no_calls``)."""
    if activity is not None and (activity.launches or activity.copies):
        return ActivitySource.LAUNCH, None
    reason = probe.reason if probe is not None and probe.reason else ProbeReason.NO_CALLS
    return (ActivitySource.GAUGE if gauge_read else ActivitySource.NVML), reason


def group(
    procs: Iterable[ProcLaunches], owners: Mapping[int, ProcessOwner | None]
) -> dict[str, list[ProcLaunches]]:
    """Processes by container id; those in no container (or unknown) are left out."""
    grouped: dict[str, list[ProcLaunches]] = {}
    for proc in procs:
        owner = owners.get(proc.pid)
        if owner is not None and owner.container_id is not None:
            grouped.setdefault(owner.container_id, []).append(proc)
    return grouped


@dataclass(slots=True)
class _Totals:
    launches: int = 0
    copies: int = 0
    waits: int = 0
    wait_s: float = 0.0

    def add(self, p: ProcLaunches) -> None:
        self.launches += p.launches
        self.copies += p.copies
        self.waits += p.waits
        self.wait_s += p.wait_s


@dataclass(slots=True)
class _State:
    retired: _Totals = field(default_factory=_Totals)  # processes that exited
    live: list[ProcLaunches] = field(default_factory=list)
    busy_since: float | None = None
    exited_at: float | None = None  # the last call of its processes that exited
    ending: float | None = None  # when the running task ends unless a launch comes
    end: float = 0.0  # the last task's end
    busy_s: float = 0.0
    tasks: int = 0
    last_task: tuple[float, float] | None = None
    calls: tuple[int, int] = (0, 0)  # launches and copies at the last tick
    copied_since_launch: bool = False
    merged: bool = False  # the running period's (``ContainerActivity.merged``)
    last_merged: bool = False
    #: the running period's newest launch after a wait returned, and the copies by then
    sub: tuple[float, int] | None = None
    copies_at_end: int = 0  # copies when the last period ended
    copied_before: bool = False  # the running period's (``ContainerActivity``)
    before: dict[int, ProcLaunches] = field(default_factory=dict)  # last tick's, by pid
    last_step: tuple[float, float] | None = None


class ActivityTracker:
    """Busy periods per container; thread-safe ``view``."""

    def __init__(
        self,
        events: EventLog,
        task_gap_s: float,
        idle_timeout_s: float,
        names: Callable[[str], str | None] = lambda _cid: None,
    ) -> None:
        self._events = events
        self.task_gap_s = task_gap_s
        self.idle_timeout_s = idle_timeout_s
        self._names = names
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()
        self._view: Mapping[str, ContainerActivity] = MappingProxyType({})
        self._pending: list[tuple[EventType, dict[str, Any]]] = []

    def update(
        self, now: float, grouped: Mapping[str, list[ProcLaunches]], exited: Iterable[ProcLaunches]
    ) -> None:
        """One tick: ``grouped`` live processes by container; ``exited`` (their last record)
        keep counting in their container's totals."""
        for proc_cid, proc in self._exited_with_owner(exited):
            state = self._states.setdefault(proc_cid, _State())
            state.retired.add(proc)
            # its last call: a process that died in a wait ended by this tick at the latest
            times = [t for t in (proc.last, proc.wait_end) if t is not None]
            last = now if proc.waiting_since is not None else max(times, default=now)
            state.exited_at = max(state.exited_at or 0.0, last)
        for cid, state in self._states.items():
            state.live = grouped.get(cid, [])
        for cid, procs in grouped.items():
            self._states.setdefault(cid, _State()).live = procs
        for cid, state in self._states.items():
            self._step(cid, state, now)
            self._track_calls(state)
            _track_steps(state)
        view = {cid: self._activity(cid, s, now) for cid, s in self._states.items()}
        with self._lock:
            self._view = MappingProxyType(view)
        self._publish()

    def idle_due(self) -> float | None:
        """When the earliest running busy period ends if no launch comes before: its last
        wait's return plus the task gap (None where none is settled)."""
        dues = [
            s.ending + self.task_gap_s
            for s in self._states.values()
            if s.busy_since is not None and s.ending is not None
        ]
        return min(dues, default=None)

    def _publish(self) -> None:
        # edges go out once the view shows them: a state read after an edge reflects it
        pending, self._pending = self._pending, []
        for type_, fields in pending:
            self._events.append(type_, **fields)

    def wake(self, cid: str, at: float) -> None:
        """A launch of ``cid``'s at ``at``, sent before the next tick: if the container is
        idle, its busy period starts here (the tick that follows goes on from it)."""
        state = self._states.setdefault(cid, _State())
        if state.busy_since is not None or at <= state.end:
            return
        state.busy_since, state.ending = at, None
        state.copied_since_launch = state.merged = False  # the next tick sees its copies
        seen = self._activity(cid, state, at)
        # the launch is not in the last tick's table yet
        seen = replace(seen, launches=seen.launches + 1, in_flight=True)
        with self._lock:
            self._view = MappingProxyType({**self._view, cid: seen})
        self._emit(EventType.GPU_BUSY, cid, at)
        self._publish()

    def _exited_with_owner(self, exited: Iterable[ProcLaunches]) -> list[tuple[str, ProcLaunches]]:
        found = []
        for proc in exited:
            for cid, state in self._states.items():
                if any(p.pid == proc.pid for p in state.live):
                    found.append((cid, proc))
                    break
        return found

    def _step(self, cid: str, state: _State, now: float) -> None:
        procs = state.live
        launched = [p.last for p in procs if p.last is not None]
        last_launch = max(launched, default=None)
        waiting = any(p.waiting_since is not None for p in procs)
        if state.busy_since is None:
            if last_launch is not None and last_launch > state.end:
                starts = [p.period for p in procs if p.period is not None and p.period > state.end]
                state.busy_since = min(starts, default=last_launch)
                state.ending = None
                state.copied_since_launch = state.merged = False
                self._emit(EventType.GPU_BUSY, cid, state.busy_since)
            return
        settled = not waiting and all(
            p.wait_end is not None and p.wait_end >= p.last for p in procs if p.last is not None
        )
        if settled and procs:
            state.ending = max(p.wait_end for p in procs if p.wait_end is not None)
        elif not procs:
            state.ending = state.exited_at if state.exited_at is not None else now
        elif not waiting and (last_launch or 0.0) <= now - self.idle_timeout_s:
            state.ending = last_launch if last_launch is not None else now
        else:
            state.ending = None
        if state.ending is not None and (now - state.ending >= self.task_gap_s or not procs):
            start, end = state.busy_since, max(state.ending, state.busy_since)
            state.busy_s += end - start
            state.tasks += 1
            state.last_task = (start, end)
            state.last_merged = state.merged
            state.busy_since, state.ending, state.end = None, None, end
            self._emit(EventType.GPU_IDLE, cid, end, busy_since=start, run_s=end - start)

    def _activity(self, cid: str, s: _State, now: float) -> ContainerActivity:
        totals = _Totals(s.retired.launches, s.retired.copies, s.retired.waits, s.retired.wait_s)
        for proc in s.live:
            totals.add(proc)
        running = max(0.0, now - s.busy_since) if s.busy_since is not None else 0.0
        in_flight = any(
            p.last is not None and (p.wait_end is None or p.wait_end < p.last) for p in s.live
        )
        newest = max(
            (p for p in s.live if p.input_start is not None),
            key=lambda p: p.input_start or 0.0,
            default=None,
        )
        return ContainerActivity(
            cid, now, totals.launches, totals.copies, totals.waits, totals.wait_s,
            s.busy_since is not None, s.busy_since, s.busy_s + running, s.tasks, s.last_task,
            in_flight=in_flight and s.busy_since is not None,
            ending=s.ending if s.busy_since is not None else None,
            copied_since_launch=s.copied_since_launch,
            merged=s.merged and s.busy_since is not None, last_merged=s.last_merged,
            copied_before=s.copied_before and s.busy_since is not None,
            next_inputs=sum(p.inputs for p in s.live),
            next_input=newest.input_start if newest is not None else None,
            next_input_after=newest.input_after if newest is not None else None,
            last_launch=max((p.last for p in s.live if p.last is not None), default=None),
            last_step=s.last_step,
        )  # fmt: skip

    def _track_calls(self, s: _State) -> None:
        """Per tick: copies after the last launch, and the running period's sub-periods."""
        launches = s.retired.launches + sum(p.launches for p in s.live)
        copies = s.retired.copies + sum(p.copies for p in s.live)
        if launches > s.calls[0]:
            s.copied_since_launch = False
        elif copies > s.calls[1]:
            s.copied_since_launch = True
        s.calls = (launches, copies)
        self._sub_periods(s, copies)

    @staticmethod
    def _sub_periods(s: _State, copies: int) -> None:
        """Whether the running busy period holds several requests: a launch after a wait
        returned (the probe's ``period``) with copies issued since the last such launch's
        tick. A one-shot's kernels, each waited for, copy nothing between them; a server's
        next request copies its input first (one served back to back, within the task gap)."""
        if s.busy_since is None:
            if s.sub is not None:
                s.copies_at_end = copies  # it ended at this tick
            s.sub = None
            return
        if s.sub is None or s.sub[0] < s.busy_since:
            s.copied_before = copies > s.copies_at_end
            s.sub = (s.busy_since, copies)
            return
        period = max((p.period for p in s.live if p.period is not None), default=None)
        # a record printed again is converted to wall time with that tick's clock offset
        if period is not None and period > s.sub[0] + SAME_CALL_S:
            s.merged = s.merged or copies > s.sub[1]
            s.sub = (period, copies)

    def _emit(self, type_: EventType, cid: str, ts: float, **fields: float) -> None:
        self._pending.append((type_, {
            "ts": ts, "container_id": cid, "container": self._names(cid),
            "source": ActivitySource.LAUNCH.value, **fields,
        }))  # fmt: skip

    def forget(self, live_ids: Iterable[str]) -> None:
        """Drop idle containers without live processes that are not in ``live_ids``."""
        keep = set(live_ids)
        idle = [c for c, s in self._states.items() if not s.live and s.busy_since is None]
        for cid in [c for c in idle if c not in keep]:
            del self._states[cid]

    def probed(self, container_id: str) -> bool:
        """Whether the probe has seen the container call the driver."""
        seen = self.view().get(container_id)
        return seen is not None and seen.launches > 0

    def view(self) -> Mapping[str, ContainerActivity]:
        """The latest per-container activity (read-only)."""
        with self._lock:
            return self._view


class ActivityFeed:
    """Joins each probe tick to containers and feeds the tracker (the probe's thread)."""

    def __init__(
        self,
        proc: ProcReader,
        containers: Callable[[], Mapping[str, ContainerInfo]],
        tracker: ActivityTracker,
    ) -> None:
        self._proc = proc
        self._containers = containers
        self.tracker = tracker
        self._owners: dict[int, ProcessOwner | None] = {}
        self._last: dict[int, ProcLaunches] = {}
        self._ticks = 0
        #: asks the probe for a tick at a wall time (``LaunchProbe.tick_at``), if it can
        self.ask_tick: Callable[[float], None] | None = None

    def on_wake(self, wake: Wake) -> None:
        """A wake from the probe (its thread, between ticks)."""
        if wake.pid not in self._owners:
            self._owners[wake.pid] = self._proc.owner(wake.pid)
        owner = self._owners[wake.pid]
        if owner is not None and owner.container_id is not None:
            self.tracker.wake(owner.container_id, wake.at)

    def on_quiet(self, quiet: Wake) -> None:
        """A wait's return after a launch (the probe's thread, between ticks): a busy period
        may end there, so a read is asked for when the task gap after it is over."""
        if self.ask_tick is not None:
            self.ask_tick(quiet.at + self.tracker.task_gap_s + TICK_MARGIN_S)

    def on_tick(self, sample: LaunchSample) -> None:
        self._ticks += 1
        refresh = self._ticks % 100 == 0  # about once a second
        for pid in sample.procs:
            if refresh or pid not in self._owners:
                # owner() checks the start time, so a reused PID is seen; one that just
                # exited keeps its container until the probe reports it gone
                owner = self._proc.owner(pid)
                if owner is not None or pid not in self._owners:
                    self._owners[pid] = owner
        exited = [self._last[pid] for pid in sample.gone if pid in self._last]
        for pid in sample.gone:
            self._owners.pop(pid, None)
        self._last = dict(sample.procs)
        self.tracker.update(sample.timestamp, group(sample.procs.values(), self._owners), exited)
        due = self.tracker.idle_due()
        if due is not None and self.ask_tick is not None:
            # the idle edge at the task gap's end, not at the interval's next read
            self.ask_tick(due + TICK_MARGIN_S)
        if refresh:
            self._proc.retain(set(self._owners))
            self.tracker.forget(self._containers())


def step_between(before: ProcLaunches, now: ProcLaunches) -> tuple[float, float] | None:
    """The step one process finished between two ticks, where exactly one wait returned in
    between: from the first launch of the burst that wait ended to its return. The burst
    began at ``now.period`` if nothing was launched since the return, else at the burst
    ``before`` saw running (None if it began and ended unseen, or if that wait followed no
    launch since the wait before it)."""
    end = now.wait_end
    if now.waits != before.waits + 1 or end is None or now.period is None:
        return None
    start = now.period if now.period <= end else before.period
    returned = before.wait_end if before.wait_end is not None else -math.inf
    if start is None or start <= returned or end <= returned:
        return None
    return (start, end)


def _track_steps(s: _State) -> None:
    """Per tick: the newest step seen whole among the container's live processes."""
    for proc in s.live:
        before = s.before.get(proc.pid)
        found = step_between(before, proc) if before is not None else None
        if found is not None and (s.last_step is None or found[1] > s.last_step[1]):
            s.last_step = found
    s.before = {p.pid: p for p in s.live}
