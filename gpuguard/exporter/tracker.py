"""Task tracker: the life cycle of each GPU task, its deadline, and finished-task history.

``Tracker.update`` takes one poll's join (attributed processes, containers, devices)
and turns successive polls into tasks (``starting -> input -> computing -> draining ->
ended``, by each container's task mode: ``process``, ``memory`` or ``burst``), deadline
counters, events and a per-container demand (SM share while computing alone). Tasks are
keyed by (container, pid, process start ticks, n) and queued by their own start; a task
is judged against its deadline only where its boundaries are real (``TaskBoundary``). No
task is endless outside ``process`` mode, and nothing of a process is kept once it leaves
the device. Why the modes, boundaries and timing are as they are: docs/design-notes.md,
"Tasks", "What NVML's samples can see, and which tasks are judged" and "The task
tracker".
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from gpuguard.contract import (
    RUNNING_PHASES,
    ActivitySource,
    EventType,
    Phase,
    TaskBoundary,
    TaskMode,
)
from gpuguard.exporter.activity import SAME_CALL_S, ContainerActivity
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.model import AttributedProcess, ContainerInfo, Joined
from gpuguard.exporter.samples import BUSY_SHARE

PHASES = RUNNING_PHASES

# A task computes alone when the rest of the device's SM share is below this.
_ALONE_SLACK = 0.01
DEMAND_EWMA_ALPHA = 0.3
#: samples alone a running task needs before its share stands for its container's demand
RUNNING_DEMAND_SAMPLES = 6
#: ``longest_run`` looks at this many of a container's last tasks
LONGEST_OF = 32

RUN_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)

DeviceKey = tuple[str, int, int]  # (gpu, pid, start ticks)


@dataclass(frozen=True, slots=True)
class TaskRules:
    """What a task is (``--task.*`` flags)."""

    default_mode: TaskMode = TaskMode.BURST
    idle_gap_s: float = 0.5
    idle_timeout_s: float = 2.0


class TaskView(NamedTuple):
    """A task as reported (running or finished); times are wall clock seconds.

    A named tuple, not a frozen dataclass: every running task gets a new view each poll.
    """

    task_id: str
    container_id: str | None
    pid: int
    gpu: str
    gpu_index: int
    mig_index: int | None
    proc_start_ticks: int
    order: tuple[float, int, int]
    mode: TaskMode
    phase: Phase
    started_at: float
    memory_bytes: int | None
    sm_ratio: float
    deadline_s: float | None
    overrun: bool
    ended_at: float | None = None
    #: Its run time so far counts up to here (its last visible activity); None: up to now.
    busy_until: float | None = None
    #: Whether its start and end are one task's (only ``exact`` tasks meet or miss).
    boundary: TaskBoundary = TaskBoundary.EXACT
    #: Its container's name while it ran: a finished task keeps it once the container is gone.
    container_name: str | None = None
    #: What its boundaries come from: ``launch`` (the probe: first launch, last wait's
    #: return) or ``nvml`` (the samples).
    timed_by: ActivitySource = ActivitySource.NVML

    @property
    def absolute_deadline(self) -> float | None:
        return None if self.deadline_s is None else self.started_at + self.deadline_s

    @property
    def run_s(self) -> float | None:
        return None if self.ended_at is None else self.ended_at - self.started_at

    @property
    def judged(self) -> bool:
        """Whether it counts against its deadline: a hit, a miss, the node record."""
        return self.boundary is TaskBoundary.EXACT

    @property
    def met_deadline(self) -> bool | None:
        if self.deadline_s is None or self.run_s is None or not self.judged:
            return None
        return not self.overrun and self.run_s <= self.deadline_s

    def elapsed_s(self, now: float) -> float:
        end = self.ended_at if self.ended_at is not None else self.busy_until
        return max(0.0, (now if end is None else end) - self.started_at)

    def slack_s(self, now: float) -> float | None:
        if self.deadline_s is None:
            return None
        return self.deadline_s - self.elapsed_s(now)


@dataclass(frozen=True, slots=True)
class ContainerStats:
    """Per-container counters (monotonic while the container exists)."""

    finished: int = 0
    hits: int = 0
    misses: int = 0
    paused_s: float = 0.0  # time the container spent paused, at poll resolution
    resumes: int = 0  # times it was resumed (a best-effort container's thaws)
    busy_periods: int = 0  # merged bursts: busy time that may hold several tasks
    busy_s: float = 0.0  # their run time


@dataclass(frozen=True, slots=True)
class RunHistogram:
    """Cumulative histogram of task run times on one GPU."""

    buckets: tuple[int, ...]  # cumulative counts per RUN_SECONDS_BUCKETS bound, then +Inf
    total: float
    count: int


class _Task:
    """Mutable state of one running task (internal to the tracker)."""

    __slots__ = (
        "alone_n",
        "alone_sm",
        "base_memory",
        "blind",
        "calls",
        "computed",
        "container_id",
        "container_name",
        "copied",
        "deadline_s",
        "exact_start",
        "floor",
        "gap_seen",
        "gpu",
        "gpu_index",
        "in_probe",
        "input_at",
        "input_broken",
        "input_seen",
        "inputs_seen",
        "last_active",
        "memory",
        "merged",
        "mig_index",
        "mode",
        "order",
        "overrun",
        "paused",
        "phase",
        "pid",
        "probed",
        "sm",
        "start_ticks",
        "started_at",
        "task_id",
        "thawing",
        "waited",
    )

    def __init__(
        self, proc: AttributedProcess, task_id: str, order: tuple[float, int, int], mode: TaskMode
    ) -> None:
        self.task_id = task_id
        self.container_id = proc.container_id
        self.pid = proc.pid
        self.gpu = proc.gpu
        self.gpu_index = proc.gpu_index
        self.mig_index = proc.mig_index
        self.start_ticks = proc.start_ticks
        self.order = order
        self.mode = mode
        self.phase = Phase.STARTING
        self.base_memory = proc.used_memory_bytes
        self.memory = proc.used_memory_bytes
        self.floor = 0  # memory the process held before this task (memory mode)
        self.sm = 0.0
        self.computed = False
        self.started_at = order[0]
        self.last_active = order[0]  # newest visible activity (end placement)
        self.paused = False
        self.waited = False  # its container was paused at some poll during the task
        self.blind = False  # on a device whose activity cannot be seen (this poll)
        self.deadline_s: float | None = None
        self.container_name: str | None = None
        self.overrun = False
        self.alone_sm = 0.0
        self.alone_n = 0
        self.exact_start = True  # it began after an idle that was seen (bursts)
        self.gap_seen = False  # a visible idle since its last fresh activity
        self.merged = False  # activity went on after a visible idle inside it
        self.thawing = False  # paused since its last fresh activity: idle is waiting
        self.probed = False  # its boundaries are the launch probe's (first launch, last wait)
        self.in_probe = False  # begun while the probe saw its container: its launch times it
        #: begun with its own input (memory grew for it before its first launch): its busy
        #: periods are its kernels, host work between them, until it frees that memory,
        #: exits or idles for the idle gap; its start stays its first sight
        self.input_seen = False
        self.input_at = order[0]  # its last input activity seen (growth, a copy, frozen)
        self.copied = False  # the probe counted copies of its input
        self.input_broken = False  # idle for the idle gap before a copy: not its input
        #: its container's launches and copies as the probe counted them when it began,
        #: then at the last poll (where the probe times it)
        self.calls = (0, 0)
        self.inputs_seen = 0  # its container's next inputs when the probe began timing it

    @property
    def boundary(self) -> TaskBoundary:
        """What is known of its boundaries while it runs (docs/design-notes.md, "The task
        tracker")."""
        if self.mode != TaskMode.BURST:
            return TaskBoundary.EXACT
        if self.probed:  # one busy period of the probe's: begun after an idle it saw, and
            # holding one request (not a launch after another's output inside it)
            exact = self.exact_start and not self.merged
            return TaskBoundary.EXACT if exact else TaskBoundary.MERGED
        if self.merged or not self.exact_start or self.blind:
            return TaskBoundary.MERGED
        return TaskBoundary.OPEN

    def final_boundary(self) -> TaskBoundary:
        """Its boundary once it ended."""
        if self.mode != TaskMode.PROCESS and not (self.computed or self.blind or self.overrun):
            return TaskBoundary.NO_KERNEL  # never ran a kernel (an overrun already counted)
        boundary = self.boundary
        return TaskBoundary.EXACT if boundary is TaskBoundary.OPEN else boundary

    @property
    def busy_until(self) -> float | None:
        """Up to when it is known to have run: None (now) in process mode, while paused, or
        where activity cannot be seen."""
        if self.mode == TaskMode.PROCESS or self.paused or (self.blind and not self.probed):
            return None
        return self.last_active

    def view(self, ended_at: float | None = None, boundary: TaskBoundary | None = None) -> TaskView:
        return TaskView(
            task_id=self.task_id,
            container_id=self.container_id,
            pid=self.pid,
            gpu=self.gpu,
            gpu_index=self.gpu_index,
            mig_index=self.mig_index,
            proc_start_ticks=self.start_ticks,
            order=self.order,
            mode=self.mode,
            phase=Phase.ENDED if ended_at is not None else self.phase,
            started_at=self.started_at,
            memory_bytes=self.memory,
            sm_ratio=self.sm,
            deadline_s=self.deadline_s,
            overrun=self.overrun,
            ended_at=ended_at,
            busy_until=None if ended_at is not None else self.busy_until,
            boundary=self.boundary if boundary is None else boundary,
            container_name=self.container_name,
            timed_by=ActivitySource.LAUNCH if self.probed else ActivitySource.NVML,
        )


class _Process:
    """What the tracker keeps about one process while it is on one device."""

    __slots__ = ("last_end", "memory", "task")

    def __init__(self) -> None:
        self.memory: int | None = 0  # at the previous poll; 0 before it appeared
        self.task: _Task | None = None
        self.last_end: float | None = None  # where its last task ended


class _Seen:
    """One process in one poll, as the mode rules need it (a plain class: one per process
    per poll, and a frozen dataclass costs several times as much to make)."""

    __slots__ = (
        "active_at", "alone", "appeared", "blind", "dropped", "grew", "info", "proc", "sm",
    )  # fmt: skip

    def __init__(
        self,
        proc: AttributedProcess,
        info: ContainerInfo | None,
        appeared: bool,
        before: int | None,
        device_sm: float,
        now: float,
        blind: bool,
    ) -> None:
        memory = proc.used_memory_bytes
        self.proc = proc
        self.blind = blind
        self.info = info
        self.appeared = appeared
        # NVML cannot always tell memory (None): appearing with it counts as growth
        self.grew = (memory is None and appeared) or _more(memory, before)
        self.dropped = _more(before, memory)
        self.sm = sm = proc.sm_ratio or 0.0
        # newest SM activity this poll, None without any (a held sample is nothing new)
        self.active_at = min(proc.active_at or now, now) if sm > 0 and not proc.held else None
        # the only process with SM activity on its device, all through a sample period
        self.alone = sm > 0 and device_sm - sm <= _ALONE_SLACK and not proc.edge


class Tracker:
    """Turns successive joins into task life cycles, deadline counters and events."""

    def __init__(
        self, events: EventLog, history_size: int = 256, rules: TaskRules | None = None
    ) -> None:
        self._events = events
        self.rules = rules or TaskRules()
        self._processes: dict[DeviceKey, _Process] = {}
        self._task_numbers = itertools.count(1)
        self._last_poll: float | None = None
        self._paused: set[str] = set()  # containers paused at the last poll
        self._containers: Mapping[str, ContainerInfo] = {}
        self.recent: deque[TaskView] = deque(maxlen=history_size)
        self.stats: dict[str, ContainerStats] = {}
        self.demand: dict[str, float] = {}  # container id -> expected SM share (EWMA)
        self.typical_run: dict[str, float] = {}  # container id -> a task's run time (EWMA)
        #: container id -> its last ``LONGEST_OF`` run times, and the longest of them
        #: (``longest_run``: kept as each run is learnt, not recomputed every poll)
        self._runs: dict[str, deque[float]] = {}
        self._longest: dict[str, float] = {}
        self._hist: dict[str, list[float]] = {}  # gpu -> per-bucket counts + [sum, count]
        #: container id -> the start of the newest probe busy period already in a task
        self._probe_mark: dict[str, float] = {}
        #: probed tasks whose process left while the probe's view had not yet shown their
        #: end: (task, where the samples place the end, when it left)
        self._leaving: list[tuple[_Task, float, float]] = []

    # -- per poll ---------------------------------------------------------------------

    def update(
        self,
        joined: Joined,
        now: float,
        containers: Mapping[str, ContainerInfo],
        activity: Mapping[str, ContainerActivity] | None = None,
    ) -> None:
        """Apply one successful GPU sample taken at wall time ``now``.

        ``activity``: the attached launch probe's view per container id (None or empty: no
        probe). A container it saw launch, with one process on the devices, gets its tasks'
        boundaries from it (first launch, last wait's return); every other container is
        tracked from the samples alone.
        """
        self._containers = containers
        prev = self._last_poll
        change_at = now if prev is None else (prev + now) / 2
        probed = _probed(joined, activity or {})
        seen: set[DeviceKey] = set()
        for proc in joined.processes:
            key = (proc.gpu, proc.pid, proc.start_ticks)
            seen.add(key)
            record = self._processes.get(key)
            if record is None:
                record = self._returned(key)
            appeared = record is None
            if record is None:
                record = self._processes[key] = _Process()
            act = probed.get(proc.container_id) if proc.container_id else None
            self._step(
                record,
                self._seen(proc, record, appeared, joined, now),
                now,
                change_at,
                act if act is not None and act.launches > 0 else None,
                act.copies if act is not None else None,
            )
            record.memory = proc.used_memory_bytes
        for key in [k for k in self._processes if k not in seen]:
            gone = self._processes.pop(key)  # nothing of a process stays once it left
            if gone.task is not None:
                self._leaving.append((gone.task, change_at, now))
        self._settle_leaving(activity or {}, now)
        self.check_deadlines(now)
        self._count_pauses(containers, now, prev)
        self._last_poll = now

    def _count_pauses(
        self, containers: Mapping[str, ContainerInfo], now: float, prev: float | None
    ) -> None:
        """Time paused (since the poll before, if paused then) and resumes, per container."""
        paused = {cid for cid, info in containers.items() if info.paused}
        for cid in self._paused | paused:
            was, gone = cid in self._paused, cid not in containers
            dt = now - prev if was and prev is not None else 0.0
            resumed = was and cid not in paused and not gone
            if dt or resumed:
                old = self.stats.get(cid, ContainerStats())
                self.stats[cid] = replace(
                    old, paused_s=old.paused_s + dt, resumes=old.resumes + resumed
                )
        self._paused = paused

    def check_deadlines(self, now: float) -> None:
        """Count an overrun the moment a running task passes its deadline (once per task).

        Only tasks whose boundaries are exact while they run (``process``, ``memory``, a
        burst timed by the launch probe): any other burst is judged when it ends
        (docs/design-notes.md, "The task tracker"). Also called when the GPU sample failed:
        the deadlines of tasks whose run time counts up to now (process mode, paused
        containers) keep running without a sample.
        """
        for task in self._tasks():
            if task.overrun or task.deadline_s is None:
                continue
            if task.mode == TaskMode.BURST and task.boundary is not TaskBoundary.EXACT:
                continue
            busy_until = task.busy_until
            if (now if busy_until is None else busy_until) - task.started_at > task.deadline_s:
                task.overrun = True
                self._count(task.container_id, misses=1)
                self._emit(EventType.DEADLINE_OVERRUN, task, now, deadline_s=task.deadline_s)

    def forget_containers(self, alive: Mapping[str, ContainerInfo]) -> None:
        """Drop counters of removed containers: a removed container leaves no series."""
        tables = (
            self.stats, self.demand, self.typical_run, self._runs, self._longest,
            self._probe_mark,
        )  # fmt: skip
        for table in tables:
            for cid in [c for c in table if c not in alive]:
                del table[cid]

    # -- snapshots --------------------------------------------------------------------

    def running(self) -> tuple[TaskView, ...]:
        """Running tasks in queue order (task start, then process start, then number)."""
        tasks = sorted(self._tasks(), key=lambda t: t.order)
        return tuple(t.view() for t in tasks)

    def histograms(self) -> dict[str, RunHistogram]:
        out = {}
        for gpu, acc in self._hist.items():
            n = len(RUN_SECONDS_BUCKETS) + 1
            cumulative = tuple(int(x) for x in itertools.accumulate(acc[:n]))
            out[gpu] = RunHistogram(cumulative, acc[n], int(acc[n + 1]))
        return out

    def table_sizes(self) -> dict[str, int]:
        """Entries in each internal table (bounded by what is alive: checked under churn)."""
        return {
            "processes": len(self._processes),
            "stats": len(self.stats),
            "demand": len(self.demand),
            "typical_run": len(self.typical_run),
            "runs": len(self._runs),
            "histograms": len(self._hist),
            "probe_marks": len(self._probe_mark),
            "leaving": len(self._leaving),
            "recent": len(self.recent),
        }

    # -- the mode rules ---------------------------------------------------------------

    def _mode(self, info: ContainerInfo | None) -> TaskMode:
        mode = info.task_mode if info is not None else None
        return mode or self.rules.default_mode

    def _seen(
        self, proc: AttributedProcess, record: _Process, appeared: bool, joined: Joined, now: float
    ) -> _Seen:
        info = self._containers.get(proc.container_id) if proc.container_id else None
        device_sm = joined.device_sm_ratio.get(proc.gpu, 0.0) if proc.sm_ratio else 0.0
        blind = proc.gpu in joined.unsampled
        return _Seen(proc, info, appeared, record.memory, device_sm, now, blind)

    def _step(
        self,
        record: _Process,
        seen: _Seen,
        now: float,
        change_at: float,
        act: ContainerActivity | None = None,
        copies: int | None = None,
    ) -> None:
        task = record.task
        if task is not None and not task.probed:
            self._track_input(task, now, copies)
        if task is not None and task.in_probe and act is None:
            # the probe lost sight of it: the samples' rules to its end
            task.probed = task.in_probe = False
        if task is not None and act is not None and not task.probed:
            # begun before its first launch: timed from that launch on; if it copied its
            # input before it (its own input phase), its start and queue place stay its
            # first sight and its kernels are one task; one the samples saw compute before
            # the probe saw it stays theirs
            period = self._unclaimed(record, seen, act)
            if period is not None and (task.in_probe or not task.computed):
                self._refresh(task, seen)
                task.input_seen = task.copied and not task.input_broken
                self._adopt(record, task, seen, act, now, period)
                return
        if task is not None and task.probed and act is not None and not task.input_seen:
            self._refresh(task, seen)
            self._step_probed(record, task, seen, act, now)
            return
        if task is not None:
            self._refresh(task, seen)
            if task.probed and act is not None:
                if self._next_input_began(task, act):
                    self._start_next_input(record, task, seen, act, now)
                    return
                end_at = self._input_task_end(task, seen, act, now)
                if end_at is None:
                    self._observe_probed(task, seen, act, now)
                    return
            else:
                end_at = self._end_at(task, seen, now, change_at)
                if end_at is None:
                    self._observe(task, seen, now, change_at)
                    return
            self._end(task, end_at)
            record.task = None
            record.last_end = end_at
            ended_at: float | None = end_at
        else:
            ended_at = None
        if act is not None:
            self._start_probed(record, seen, act, now)
            if record.task is not None:
                return
        mode = self._mode(seen.info)
        if mode == TaskMode.PROCESS:
            starts = True  # paper A: being on the device is the task
        else:
            # new activity starts a task; a held sample is only the last one standing; where
            # the probe sees the container, only its launches start one by a kernel
            fresh = seen.active_at is not None and act is None
            starts = (seen.grew or fresh) and seen.proc.used_memory_bytes != 0
        if starts:
            floor = 0 if seen.appeared else record.memory
            started_at = change_at
            if mode != TaskMode.PROCESS and not seen.grew and seen.proc.active_since is not None:
                # started by a kernel: where in its sample period that activity began
                started_at = max(seen.proc.active_since, ended_at or 0.0)
            record.task = self._start(seen, mode, floor, started_at)
            record.task.in_probe = act is not None
            if act is not None:
                record.task.calls = (act.launches, act.copies)
            # Seen quiet before: at an earlier poll with no task, or a new input phase after
            # its last task's kernel. At the exporter's first poll nobody saw it begin.
            record.task.exact_start = not (seen.appeared and self._last_poll is None)
            self._observe(record.task, seen, now, change_at)

    def _track_input(self, task: _Task, now: float, copies: int | None) -> None:
        """Whether a task begun by memory growth copies its own input before its first
        launch: copies counted by the probe (``copies``: its container's, None where the
        probe does not see it) with nothing idle for the idle gap since its first sight
        (waiting frozen is not idle). Copies after such an idle (a server's start-up, then a
        request's copy in) are not its input."""
        if task.input_broken:
            return
        if task.paused:
            task.input_at = now
        if copies is None or copies <= task.calls[1]:
            return
        if now - task.input_at > self.rules.idle_gap_s:
            task.input_broken = True
        else:
            task.input_at, task.copied = now, True
        task.calls = (task.calls[0], copies)

    @staticmethod
    def _refresh(task: _Task, seen: _Seen) -> None:
        """What a poll says of a running task's container and device, in every mode."""
        task.paused = seen.info is not None and seen.info.paused
        task.blind = seen.blind
        if seen.info is not None:
            task.container_name = seen.info.name
        if task.deadline_s is None and seen.info is not None:
            # the container index may sync after the task was first seen
            task.deadline_s = seen.info.deadline_s

    # -- tasks timed by the launch probe (docs/design-notes.md, "Tasks from the probe") --

    def _step_probed(
        self, record: _Process, task: _Task, seen: _Seen, act: ContainerActivity, now: float
    ) -> None:
        """A probed task goes on while its busy period does (in ``process`` mode, until the
        process leaves); else it ends at the period's last wait's return."""
        if task.mode != TaskMode.PROCESS and act.busy_since != task.started_at:
            last = act.last_task
            # its period is the last finished one, unless more than one ended since the
            # poll before (then only its last activity seen is known)
            end = last[1] if last is not None and last[0] == task.started_at else task.last_active
            if last is not None and last[0] == task.started_at and act.last_merged:
                task.merged = True  # it held several requests back to back
            self._end_probed(record, task, end, seen, act, now)
            return
        self._observe_probed(task, seen, act, now)

    def _unclaimed(
        self, record: _Process, seen: _Seen, act: ContainerActivity
    ) -> tuple[float, float | None] | None:
        """The earliest busy period that no task holds yet, as (first launch, end or None
        while it runs): one that began and ended since the poll before, else the running one."""
        cid = seen.proc.container_id or ""
        after = max(self._probe_mark.get(cid, -1.0), record.last_end or -1.0)
        last = act.last_task
        if last is not None and last[0] > after:
            return last
        if act.busy_since is not None and act.busy_since > after:
            return act.busy_since, None
        return None

    def _start_probed(
        self, record: _Process, seen: _Seen, act: ContainerActivity, now: float
    ) -> None:
        """Start a task at each busy period the probe saw begin that no task holds yet."""
        period = self._unclaimed(record, seen, act)
        if period is None:
            return
        mode = self._mode(seen.info)
        floor = 0 if seen.appeared else record.memory
        phase = _probed_phase(act, period[1] is None)
        task = self._start(seen, mode, floor, period[0], phase=phase)
        task.in_probe = True
        if seen.grew and act.copied_before and period[1] is None:
            # its memory and its first launch seen at one poll, with copies before that
            # launch: it began with its own input (shorter than a poll), so its program's
            # next input starts the next task
            task.input_seen = task.copied = True
        self._adopt(record, task, seen, act, now, period)

    def _adopt(
        self,
        record: _Process,
        task: _Task,
        seen: _Seen,
        act: ContainerActivity,
        now: float,
        period: tuple[float, float | None],
    ) -> None:
        """Time ``task`` by the probe from ``period``'s first launch on; a period already
        over ends it there (outside ``process`` mode), and the next one starts its own."""
        begin, end = period
        task.probed = task.computed = True
        task.calls = (act.launches, act.copies)
        task.inputs_seen = act.next_inputs
        if task.input_seen:
            # its input (and any wait frozen in it) is part of it, as in the program's own
            # log, and its queue place is where it arrived: re-timed to its launch, a task
            # admitted after a wait would queue behind every task that arrived meanwhile
            task.last_active = max(task.last_active, begin if end is None else end)
            if task.phase != Phase.COMPUTING:
                task.phase = Phase.COMPUTING
                self._emit(EventType.TASK_PHASE, task, now, phase=task.phase)
        else:
            task.started_at = task.last_active = begin
            task.order = (begin, task.order[1], task.order[2])
            # at the exporter's first poll nobody saw the idle before it
            task.exact_start = self._last_poll is not None
        record.task = task
        self._probe_mark[seen.proc.container_id or ""] = begin
        if end is not None and not task.input_seen:
            task.merged = act.last_merged and act.last_task == period
        elif not task.input_seen:
            task.merged = act.merged
        if end is not None and task.mode != TaskMode.PROCESS and not task.input_seen:
            task.last_active = end
            self._end_probed(record, task, end, seen, act, now)
            return
        self._observe_probed(task, seen, act, now)

    def _end_probed(
        self,
        record: _Process,
        task: _Task,
        end: float,
        seen: _Seen,
        act: ContainerActivity,
        now: float,
    ) -> None:
        """End the process's probed task at ``end`` and start its next from what follows."""
        self._end(task, end)
        record.task = None
        record.last_end = end
        self._start_probed(record, seen, act, now)

    def _observe_probed(self, task: _Task, seen: _Seen, act: ContainerActivity, now: float) -> None:
        task.memory = seen.proc.used_memory_bytes
        if not task.input_seen and act.busy_since == task.started_at and act.merged:
            task.merged = True  # a launch after its output: the next request, back to back
        cid = seen.proc.container_id or ""
        newest = act.busy_since if act.busy_since is not None else None
        if newest is None and act.last_task is not None:
            newest = act.last_task[0]
        if newest is not None:  # every period while it runs is its own (process mode)
            self._probe_mark[cid] = max(self._probe_mark.get(cid, newest), newest)
        if act.busy:
            seen_until = act.ending if act.ending is not None else act.timestamp
            task.last_active = max(task.last_active, seen_until)
        elif act.last_task is not None:
            task.last_active = max(task.last_active, act.last_task[1])
        if seen.active_at is not None and seen.alone:
            task.alone_sm += seen.sm
            task.alone_n += 1
        if task.paused:
            task.last_active = now  # waiting is part of the task
            task.waited = True
        launched = act.launches > task.calls[0]
        task.calls = (act.launches, act.copies)
        task.computed = task.computed or launched
        if task.paused:
            # frozen inside its wait, the process cannot return from it, so the probe keeps
            # its kernel in flight until the thaw; the device still finishes that kernel,
            # and NVML's samples show when it did (a queue waits behind a frozen kernel)
            phase = Phase.COMPUTING if act.in_flight and seen.sm > 0 else Phase.DRAINING
        elif not task.input_seen:
            phase = _probed_phase(act, True)
        elif act.busy and act.in_flight:
            phase = Phase.COMPUTING
        elif act.copied_since_launch and task.computed:
            phase = Phase.DRAINING  # copies after its last launch: its output
        elif launched:
            phase = Phase.COMPUTING
        else:
            phase = task.phase  # host work between two kernels holds the device still
        task.sm = seen.sm if phase == Phase.COMPUTING else 0.0
        if phase != task.phase:
            task.phase = phase
            self._emit(EventType.TASK_PHASE, task, now, phase=phase)

    def _returned(self, key: DeviceKey) -> _Process | None:
        """A process back on the device while its probed task is still leaving (missing
        from one poll: a program that re-creates its context between runs): the task goes
        on, as its busy period did."""
        for i, (task, _placed, _left) in enumerate(self._leaving):
            if task.probed and (task.gpu, task.pid, task.start_ticks) == key:
                del self._leaving[i]
                record = self._processes[key] = _Process()
                record.task, record.memory = task, task.memory
                return record
        return None

    def _settle_leaving(self, activity: Mapping[str, ContainerActivity], now: float) -> None:
        """End the tasks whose process left the device: at the samples' placement (half-way
        between polls) unless the probe times it, then at its last wait's return once the
        probe's view shows the period over (it may lag the samples by a tick), at most
        ``idle_gap_s`` later (a process that died inside a wait: the placement)."""
        keep = []
        for task, placed, left in self._leaving:
            act = activity.get(task.container_id) if task.probed and task.container_id else None
            last = act.last_task if act is not None else None
            if act is None:
                end = placed
            elif (
                last is not None
                and last[1] >= task.started_at
                and (not act.busy or (act.busy_since or 0.0) > placed)
            ):
                # over in the probe's view (a period begun since is another's; one begun
                # before it holds it when it began at a next input)
                end = last[1]
            elif now - left > self.rules.idle_gap_s:
                end = act.ending if act.ending is not None else placed
            else:
                keep.append((task, placed, left))
                continue
            self._end(task, end)
        self._leaving = keep

    @staticmethod
    def _next_input_began(task: _Task, act: ContainerActivity) -> bool:
        """Whether a probed task begun with its input saw the next task's input begin: a
        host-to-device copy after its output, which followed one of its own launches."""
        at, after = act.next_input, act.next_input_after
        return (
            task.mode != TaskMode.PROCESS
            and at is not None
            and after is not None
            and at > task.started_at + SAME_CALL_S
            and after >= task.started_at - SAME_CALL_S
        )

    def _start_next_input(
        self, record: _Process, task: _Task, seen: _Seen, act: ContainerActivity, now: float
    ) -> None:
        """End ``task`` where the next input began and start the next task there: begun
        with its own input, timed by the probe, queued from that copy (before its launch,
        so admission can hold it back). More than one next input since the task began: it
        held several runs, not judged."""
        at = act.next_input
        assert at is not None
        if act.next_inputs - task.inputs_seen > 1:
            task.merged = True
        self._end(task, at)
        record.last_end = at
        # launched since (the poll came after its launch): computing, or its output if it
        # copied since its last launch
        launched = act.last_launch is not None and act.last_launch > at
        if act.in_flight:
            phase = Phase.COMPUTING
        elif launched:
            phase = Phase.DRAINING if act.copied_since_launch else Phase.COMPUTING
        else:
            phase = Phase.INPUT
        following = self._start(seen, task.mode, task.floor, at, phase=phase)
        following.probed = following.in_probe = True
        following.input_seen = following.copied = True
        following.computed = act.in_flight or launched
        following.calls = (act.launches, act.copies)
        following.inputs_seen = act.next_inputs
        following.input_at = now
        record.task = following
        self._observe_probed(following, seen, act, now)

    def _input_task_end(
        self, task: _Task, seen: _Seen, act: ContainerActivity, now: float
    ) -> float | None:
        """When a probed task begun with its input ended, if this poll shows that it did:
        the busy period in which it copied its output is over (``burst``), or as the
        samples' rules say (memory freed, re-allocated after its kernels, idle for the idle
        gap); placed at its last wait's return (None: it goes on)."""
        if task.mode == TaskMode.PROCESS:
            return None  # only leaving the device ends it
        memory = seen.proc.used_memory_bytes
        mark = self._probe_mark.get(task.container_id or "", -1.0)
        newer = act.busy and act.busy_since is not None and act.busy_since > mark
        if act.busy and not newer:  # its last wait's return, if its period has settled
            end = act.ending if act.ending is not None else task.last_active
        else:
            end = act.last_task[1] if act.last_task is not None else task.last_active
        end = max(end, task.started_at)
        if task.mode == TaskMode.BURST and task.phase == Phase.DRAINING and (not act.busy or newer):
            return end  # its output's busy period is over (a newer one is the next task's)
        if task.mode == TaskMode.BURST and newer and act.copied_before and task.computed:
            # a busy period begun with an input of its own: the next task's (a task that has
            # not launched yet, begun at a next input, takes it as its own)
            return end
        if memory == 0 or (seen.grew and task.phase == Phase.DRAINING):
            return end  # freed all, or a new input after its output: a new task
        if task.mode == TaskMode.MEMORY:
            if memory is not None and memory <= task.floor < (task.base_memory or 0):
                return end
            if seen.dropped and not act.in_flight:
                return end  # freeing after its kernels: paper B's end of a task
        if act.busy or task.paused or seen.grew:
            return None
        limit = self.rules.idle_gap_s if task.mode == TaskMode.BURST else self.rules.idle_timeout_s
        return end if now - end > limit else None

    def _end_at(self, task: _Task, seen: _Seen, now: float, change_at: float) -> float | None:
        """When this task ended, if this poll shows that it did (None: it goes on)."""
        if task.mode == TaskMode.PROCESS:
            return None  # only leaving the device ends it
        memory = seen.proc.used_memory_bytes
        if memory == 0:
            return change_at
        active = seen.sm > 0 or seen.grew
        if seen.grew and task.phase == Phase.DRAINING:
            return change_at  # a new input phase after the kernel: re-allocation, a new task
        if task.mode == TaskMode.MEMORY:
            if memory is not None and memory <= task.floor < (task.base_memory or 0):
                return change_at  # it freed all it had allocated
            if seen.dropped and seen.active_at is None and task.computed:
                return change_at  # freeing after its kernel: paper B's end of a task
            if active and task.phase == Phase.DRAINING:
                return change_at  # re-allocated or computing again after a visible gap
        if active or task.paused or task.blind:
            return None  # busy, waiting, or nobody can tell
        idle = now - task.last_active
        limit = (
            self.rules.idle_gap_s
            if task.computed and task.mode == TaskMode.BURST
            else self.rules.idle_timeout_s
        )
        return max(task.last_active, task.started_at) if idle > limit else None

    def _observe(self, task: _Task, seen: _Seen, now: float, change_at: float) -> None:
        task.memory = seen.proc.used_memory_bytes
        fresh = seen.active_at is not None
        if seen.active_at is not None:
            # computing again after an idle it showed: a request may have ended there
            task.merged = task.merged or (task.gap_seen and task.computed)
            task.gap_seen = task.thawing = False
            task.last_active = max(task.last_active, seen.active_at)
            task.computed = True
            if seen.alone:
                task.alone_sm += seen.sm
                task.alone_n += 1
        if seen.grew:
            task.last_active = max(task.last_active, change_at)
        if task.paused:
            task.last_active = now  # waiting is part of the task, not idleness
            task.waited = True
        phase = task.phase
        if fresh and seen.proc.stopped:
            phase = Phase.DRAINING  # its newest sample shows its kernels stopping
        elif fresh or (seen.sm > 0 and phase == Phase.COMPUTING):
            phase = Phase.COMPUTING  # new activity, or its last sample still stands
        elif phase == Phase.STARTING and _more(task.memory, task.base_memory):
            phase = Phase.INPUT
        elif phase == Phase.COMPUTING:
            phase = Phase.DRAINING  # no sample stands: its kernels have stopped
        # a sample held over from the process's previous task is not this one's
        task.sm = seen.sm if phase == Phase.COMPUTING else 0.0
        if task.paused:
            # a frozen process's idle, until it computes again, is waiting, not a boundary
            task.thawing, task.gap_seen = True, False
        elif not task.thawing and (
            phase == Phase.DRAINING or (fresh and seen.alone and seen.sm < BUSY_SHARE)
        ):
            # no sample stands, its kernels stopped, or alone it left part of a period idle
            task.gap_seen = True
        if phase != task.phase:
            task.phase = phase
            self._emit(EventType.TASK_PHASE, task, now, phase=phase)

    # -- internals --------------------------------------------------------------------

    def _tasks(self) -> list[_Task]:
        running = [r.task for r in self._processes.values() if r.task is not None]
        return running + [task for task, _placed, _left in self._leaving]

    def _start(
        self,
        seen: _Seen,
        mode: TaskMode,
        floor: int | None,
        started_at: float,
        phase: Phase | None = None,
    ) -> _Task:
        proc = seen.proc
        n = next(self._task_numbers)
        cid12 = proc.container_id[:12] if proc.container_id else "-"
        task_id = f"{cid12}:{proc.pid}:{proc.start_ticks}:{n}"
        task = _Task(proc, task_id, (started_at, proc.start_ticks, n), mode)
        task.floor = floor or 0
        if seen.active_at is not None:
            task.phase = Phase.COMPUTING
        elif seen.grew and not seen.appeared:
            task.phase = Phase.INPUT
        if phase is not None:
            task.phase = phase
        info = seen.info
        task.deadline_s = info.deadline_s if info is not None else None
        task.container_name = info.name if info is not None else None
        task.paused = info is not None and info.paused
        task.waited = task.paused
        task.blind = seen.blind
        self._emit(
            EventType.TASK_STARTED, task, started_at, phase=task.phase, deadline_s=task.deadline_s
        )
        return task

    def _end(self, task: _Task, ended_at: float) -> None:
        ended_at = max(ended_at, task.started_at)
        boundary = task.final_boundary()
        view = task.view(ended_at, boundary)
        run_s = view.run_s or 0.0
        if boundary is TaskBoundary.EXACT:
            if view.deadline_s is not None and not view.overrun:
                # an overrun was already counted as a miss while the task ran
                met = bool(view.met_deadline)
                self._count(task.container_id, hits=int(met), misses=int(not met))
            self._count(task.container_id, finished=1)
            self._observe_run(task.gpu, run_s)
            self._learn_run_time(task, view.run_s)
        elif boundary is TaskBoundary.MERGED:
            self._count(task.container_id, busy_periods=1, busy_s=run_s)
        self._learn_demand(task)
        self.recent.append(view)
        self._emit(
            EventType.TASK_ENDED, task, ended_at, run_s=view.run_s, deadline_s=view.deadline_s,
            boundary=boundary,
        )  # fmt: skip

    def demand_view(self) -> dict[str, float]:
        """Each container's expected SM share: learnt from its finished tasks, else, for a
        task that runs on and on (a busy server's one long busy period), from its own
        samples so far (at least ``RUNNING_DEMAND_SAMPLES`` of them alone)."""
        out = dict(self.demand)
        for task in self._tasks():
            cid = task.container_id
            if cid is not None and cid not in out and task.alone_n >= RUNNING_DEMAND_SAMPLES:
                out[cid] = task.alone_sm / task.alone_n
        return out

    def _learn_demand(self, task: _Task) -> None:
        if task.container_id is None or task.alone_n == 0:
            return
        share = task.alone_sm / task.alone_n
        old = self.demand.get(task.container_id)
        self.demand[task.container_id] = (
            share if old is None else DEMAND_EWMA_ALPHA * share + (1 - DEMAND_EWMA_ALPHA) * old
        )

    def _learn_run_time(self, task: _Task, run_s: float | None) -> None:
        """A task's run time, learnt from tasks that computed and never waited paused (the
        actuator's preemption test weighs what a waiter and a holder still need)."""
        if task.container_id is None or run_s is None or not task.computed or task.waited:
            return
        old = self.typical_run.get(task.container_id)
        self.typical_run[task.container_id] = (
            run_s if old is None else DEMAND_EWMA_ALPHA * run_s + (1 - DEMAND_EWMA_ALPHA) * old
        )
        runs = self._runs.get(task.container_id)
        if runs is None:
            runs = self._runs[task.container_id] = deque(maxlen=LONGEST_OF)
        runs.append(run_s)
        self._longest[task.container_id] = max(runs)

    def longest_run(self) -> dict[str, float]:
        """Each container's longest run of its last ``LONGEST_OF`` tasks (as ``typical_run``
        learns them): a server's requests are heavy-tailed, and the actuator keeps a freeze
        short enough for the long ones too, not for the mean."""
        return dict(self._longest)

    def _count(
        self,
        container_id: str | None,
        finished: int = 0,
        hits: int = 0,
        misses: int = 0,
        busy_periods: int = 0,
        busy_s: float = 0.0,
    ) -> None:
        if container_id is None:
            return
        old = self.stats.get(container_id, ContainerStats())
        self.stats[container_id] = replace(
            old,
            finished=old.finished + finished,
            hits=old.hits + hits,
            misses=old.misses + misses,
            busy_periods=old.busy_periods + busy_periods,
            busy_s=old.busy_s + busy_s,
        )

    def _observe_run(self, gpu: str, run_s: float) -> None:
        n = len(RUN_SECONDS_BUCKETS) + 1
        acc = self._hist.setdefault(gpu, [0.0] * (n + 2))
        index = next((i for i, bound in enumerate(RUN_SECONDS_BUCKETS) if run_s <= bound), n - 1)
        acc[index] += 1
        acc[n] += run_s
        acc[n + 1] += 1

    def _emit(self, type_: EventType, task: _Task, ts: float, **fields: Any) -> None:
        info = self._containers.get(task.container_id) if task.container_id else None
        self._events.append(
            type_,
            ts=ts,
            task_id=task.task_id,
            container_id=task.container_id,
            container=info.name if info is not None else task.container_name,
            gpu=task.gpu_index,
            phase=fields.pop("phase", None),
            **fields,
        )


def _probed(
    joined: Joined, activity: Mapping[str, ContainerActivity]
) -> dict[str, ContainerActivity]:
    """The probe's view of each container it saw call the driver and that has one process
    on the devices (a busy period is the container's, so it can time only a lone process's
    tasks); those it saw launch are the ones it times."""
    if not activity:
        return {}
    count: dict[str, int] = {}
    for proc in joined.processes:
        if proc.container_id is not None:
            count[proc.container_id] = count.get(proc.container_id, 0) + 1
    return {cid: act for cid, act in activity.items() if count.get(cid) == 1}


def _probed_phase(act: ContainerActivity, running: bool) -> Phase:
    """A probed task computes while a kernel of it is launched and not waited for."""
    return Phase.COMPUTING if running and act.busy and act.in_flight else Phase.DRAINING


def _more(a: int | None, b: int | None) -> bool:
    """``a > b`` where both are known."""
    return a is not None and b is not None and a > b
