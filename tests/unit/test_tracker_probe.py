"""Tasks timed by the launch probe: the task tracker fed 100 ms polls and, between them, the
real activity tracker ticked every 10 ms from scripted driver calls (launch, wait return)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from gpuguard.contract import EventType, Phase, TaskBoundary, TaskMode
from gpuguard.exporter.activity import ActivityTracker, group
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.join import join
from gpuguard.exporter.launchprobe import ProcLaunches
from gpuguard.exporter.model import ContainerInfo, ProcessOwner
from gpuguard.exporter.samples import SampleHold
from gpuguard.exporter.tracker import TaskRules, TaskView, Tracker
from tests.unit.exporter_fakes import GIB, cid, container, sample

CTX = 300 * 2**20
PROCESS, MEMORY, BURST = TaskMode.PROCESS, TaskMode.MEMORY, TaskMode.BURST
TICK = 0.01


class Driver:
    """A process's driver calls: busy spans (first launch, last wait's return; the wait is
    in progress from the launch on), and its exit. ``copies_in`` and ``copies_out`` are
    copies with a direction, each waited for: (issued, its wait's return)."""

    def __init__(
        self,
        *spans: tuple[float, float],
        exit_at: float | None = None,
        copies: tuple[float, ...] = (),
        copies_in: tuple[tuple[float, float], ...] = (),
        copies_out: tuple[tuple[float, float], ...] = (),
        directed: bool = True,
    ) -> None:
        self.spans = list(spans)
        self.exit_at = exit_at
        self.copies = copies  # when it issued an asynchronous copy (counted, no task)
        self.copies_in = copies_in
        self.copies_out = copies_out
        self.directed = directed  # False: through cuMemcpyAsync, which says no direction

    def record(self, pid: int, now: float) -> ProcLaunches | None:
        spans = [(a, b) for a, b in self.spans if a <= now]
        if not spans:
            return None
        copied = [(a, b) for a, b in (*self.copies_in, *self.copies_out) if a <= now]
        waited = spans + copied
        done = [b for _a, b in waited if b <= now]
        wait_end = max(done, default=None)
        waiting = min((a for a, b in waited if b > now), default=None)
        later = [a for a, _b in spans if wait_end is None or a > wait_end]
        copies = sum(1 for t in self.copies if t <= now) + len(copied)
        inputs, input_ns, input_after = self._next_inputs(now)
        return ProcLaunches(
            pid, len(spans), copies, spans[0][0], spans[-1][0], min(later, default=spans[-1][0]),
            len(done), sum(b - a for a, b in waited if b <= now), waiting, wait_end,
            inputs, input_ns, input_after,
        )  # fmt: skip

    def _next_inputs(self, now: float) -> tuple[int, float | None, float | None]:
        """As the probe's kernel side counts them: a copy in after a copy out after a launch."""
        if not self.directed:
            return 0, None, None
        calls = sorted(
            [(a, "launch") for a, _b in self.spans]
            + [(a, "in") for a, _b in self.copies_in]
            + [(a, "out") for a, _b in self.copies_out]
        )
        inputs, at, after, last, stage = 0, None, None, None, 0
        for t, call in calls:
            if t > now:
                break
            if call == "launch":
                stage, last = 1, t
            elif call == "out" and stage:
                stage = 2
            elif call == "in" and stage == 2:
                inputs, at, after, stage = inputs + 1, t, last, 0
        return inputs, at, after


class Probed:
    """Feeds a tracker 100 ms polls and the probe's view, like the poller does."""

    def __init__(self, *containers: ContainerInfo, **rules: object) -> None:
        self.events = EventLog(100_000)
        self.tracker = Tracker(self.events, 64, TaskRules(**rules))  # type: ignore[arg-type]
        self.activity = ActivityTracker(EventLog(100_000), 0.02, 0.5)
        self.containers = {c.id: c for c in containers}
        self.owners: dict[int, ProcessOwner] = {}
        self.drivers: dict[int, Driver] = {}
        self.hold = SampleHold()
        self.attached = True
        self.lag = 0.0  # how far the probe's view is behind the poll
        self.clock = 0.0
        self._last: dict[int, ProcLaunches] = {}

    def own(self, pid: int, container_n: int, ticks: int) -> None:
        self.owners[pid] = ProcessOwner(cid(container_n), ticks)

    def calls(self, pid: int, driver: Driver) -> None:
        self.drivers[pid] = driver

    def _tick(self, now: float) -> None:
        procs: dict[int, ProcLaunches] = {}
        for pid, driver in self.drivers.items():
            if driver.exit_at is not None and driver.exit_at <= now:
                continue
            rec = driver.record(pid, now)
            if rec is not None:
                procs[pid] = rec
        exited = [rec for pid, rec in self._last.items() if pid not in procs]
        self._last = procs
        owners: Mapping[int, ProcessOwner | None] = self.owners
        self.activity.update(now, group(procs.values(), owners), exited)

    def poll(
        self, t: float, procs: Mapping[int, int | None], sm: Mapping[int, float] | None = None
    ) -> None:
        while self.clock + TICK <= t - self.lag + 1e-9:
            self.clock = round(self.clock + TICK, 6)
            self._tick(self.clock)
        joined = join(self.hold.apply(sample(t, procs, sm)), self.owners, self.containers)
        view = self.activity.view() if self.attached else None
        self.tracker.update(joined, t, self.containers, view)

    def of(self, type_: EventType) -> list[dict]:
        return [e for e in self.events.since(0).events if e["type"] == type_]

    def ended(self) -> list[TaskView]:
        return list(self.tracker.recent)


def polls(h: Probed, start: float, stop: float, procs: Mapping[int, int | None]) -> None:
    t = start
    while t <= stop + 1e-9:
        h.poll(round(t, 3), procs)
        t += 0.1


# --- one-shots: first launch to last wait's return, in every mode -------------------------


@pytest.mark.parametrize("mode", list(TaskMode))
@pytest.mark.parametrize(("deadline", "met"), [(0.3, False), (0.4, True)])
def test_one_shot_runs_from_its_first_launch_to_its_last_wait_in_every_mode(
    mode: TaskMode, deadline: float, met: bool
) -> None:
    h = Probed(container(1, deadline_s=deadline, task_mode=mode))
    h.own(100, 1, 5000)
    h.calls(100, Driver((0.23, 0.57), exit_at=0.65))
    h.poll(0.0, {})
    h.poll(0.1, {100: CTX})  # context up: a task as today, before any launch
    h.poll(0.2, {100: CTX + GIB})  # input
    (early,) = h.tracker.running()
    assert early.phase in (Phase.STARTING, Phase.INPUT)  # admission sees it before its kernel
    h.poll(0.3, {100: CTX + 2 * GIB})  # launched at 0.23; NVML shows no sample yet
    (task,) = h.tracker.running()
    assert task.task_id == early.task_id  # the same task, now timed by its first launch
    assert task.started_at == pytest.approx(0.23) and task.order[0] == pytest.approx(0.23)
    assert task.phase == Phase.COMPUTING and task.boundary is TaskBoundary.EXACT
    polls(h, 0.4, 0.6, {100: CTX + 2 * GIB})
    h.poll(0.7, {})  # exited
    (view,) = h.ended()
    assert view.started_at == pytest.approx(0.23) and view.ended_at == pytest.approx(0.57)
    assert view.run_s == pytest.approx(0.34)
    assert view.boundary is TaskBoundary.EXACT and view.met_deadline is met
    assert view.timed_by == "launch" and early.timed_by == "nvml"
    stats = h.tracker.stats[cid(1)]
    assert (stats.finished, stats.hits, stats.misses) == (1, int(met), int(not met))
    assert len(h.of(EventType.TASK_STARTED)) == 1


def test_a_probed_burst_past_its_deadline_is_a_miss_at_once() -> None:
    h = Probed(container(1, deadline_s=0.25))
    h.own(100, 1, 5000)
    h.calls(100, Driver((0.23, 0.9)))
    h.poll(0.0, {})
    polls(h, 0.1, 0.4, {100: CTX})
    assert not h.of(EventType.DEADLINE_OVERRUN)  # 0.17 s so far
    polls(h, 0.5, 0.5, {100: CTX})  # 0.27 s, still in its wait
    assert len(h.of(EventType.DEADLINE_OVERRUN)) == 1
    (task,) = h.tracker.running()
    assert task.overrun and task.slack_s(0.5) == pytest.approx(0.25 - 0.27)
    polls(h, 0.6, 1.0, {100: CTX})
    (view,) = h.ended()
    assert view.ended_at == pytest.approx(0.9) and view.met_deadline is False
    assert h.tracker.stats[cid(1)].misses == 1  # counted once


# --- a server's requests: each its own exact task -----------------------------------------


def test_server_requests_closer_than_the_idle_gap_are_each_an_exact_task() -> None:
    spans = [(1.0, 1.1), (1.25, 1.35), (1.5, 1.62), (2.01, 2.03), (2.06, 2.09)]
    h = Probed(container(1, deadline_s=0.11))
    h.own(100, 1, 5000)
    h.calls(100, Driver(*spans))
    h.poll(0.0, {})
    polls(h, 0.1, 2.5, {100: CTX + GIB})  # the server holds its memory all along
    got = [(v.started_at, v.ended_at, v.boundary, v.met_deadline) for v in h.ended()]
    want = [(a, b, TaskBoundary.EXACT, b - a <= 0.11) for a, b in spans]
    assert got == [(pytest.approx(a), pytest.approx(b), k, m) for a, b, k, m in want]
    stats = h.tracker.stats[cid(1)]
    assert (stats.finished, stats.hits, stats.misses, stats.busy_periods) == (5, 4, 1, 0)
    ids = [v.task_id for v in h.ended()]
    assert len(set(ids)) == 5 and all(i.startswith(f"{cid(1)[:12]}:100:5000:") for i in ids)


def test_a_servers_start_up_is_not_its_first_requests_input() -> None:
    # its memory grew at start-up; 0.9 s later each request copies its input and launches:
    # copies after an idle longer than the idle gap are a request's, not the start-up's input
    spans = [(1.0, 1.1), (1.25, 1.35), (1.5, 1.62)]
    h = Probed(container(1, deadline_s=0.11))
    h.own(100, 1, 5000)
    h.calls(100, Driver(*spans, copies=(0.99, 1.24, 1.49)))
    h.poll(0.0, {})
    polls(h, 0.1, 2.0, {100: CTX + GIB})
    got = [(v.started_at, v.ended_at, v.boundary) for v in h.ended()]
    assert got == [(pytest.approx(a), pytest.approx(b), TaskBoundary.EXACT) for a, b in spans]


def test_requests_right_after_a_servers_start_up_are_each_a_task_of_their_own() -> None:
    # the model upload (0.12) is followed within the idle gap by the first request: that
    # one is taken for the start-up task's kernels, but each later request copies its
    # input before its launch, so it starts a task of its own
    spans = [(0.3, 0.4), (0.6, 0.7), (0.9, 1.0)]
    h = Probed(container(1, deadline_s=0.2))
    h.own(100, 1, 5000)
    # each copy out is issued with its kernel (before the wait), as CUDA programs do
    h.calls(100, Driver(*spans, copies=(0.12, 0.29, 0.3, 0.58, 0.6, 0.88, 0.9)))
    h.poll(0.0, {})
    polls(h, 0.1, 1.6, {100: CTX + GIB})
    got = [(v.started_at, v.ended_at, v.boundary) for v in h.ended()]
    assert got == [
        (pytest.approx(0.05), pytest.approx(0.4), TaskBoundary.EXACT),  # start-up and #1
        (pytest.approx(0.6), pytest.approx(0.7), TaskBoundary.EXACT),
        (pytest.approx(0.9), pytest.approx(1.0), TaskBoundary.EXACT),
    ]


def test_the_same_requests_seen_only_by_nvml_stay_one_merged_busy_period() -> None:
    # without the probe nothing changes: one burst over the three requests, never judged
    h = Probed(container(1, deadline_s=0.11))
    h.attached = False
    h.own(100, 1, 5000)
    h.calls(100, Driver((1.0, 1.1), (1.25, 1.35), (1.5, 1.62)))
    h.poll(0.0, {})
    polls(h, 0.1, 0.9, {100: CTX + GIB})
    for t, sm in [(1.1, 1.0), (1.2, 0.0), (1.3, 0.5), (1.4, 0.5), (1.5, 0.0), (1.6, 1.0)]:
        h.poll(t, {100: CTX + GIB}, sm={100: sm} if sm else None)
    polls(h, 1.7, 2.5, {100: CTX + GIB})
    (view,) = h.ended()
    assert view.boundary is TaskBoundary.MERGED and view.met_deadline is None
    assert view.timed_by == "nvml"


# --- a repeater keeping its memory: its next task starts at its launch --------------------


def test_repeaters_next_task_with_cached_memory_starts_at_its_first_launch() -> None:
    h = Probed(container(1, deadline_s=1.0))
    h.own(100, 1, 5000)
    h.calls(100, Driver((0.52, 0.8), (1.43, 1.7)))
    h.poll(0.0, {})
    polls(h, 0.1, 1.4, {100: CTX + GIB})
    assert h.tracker.running() == ()  # the first task ended, memory kept
    h.poll(1.5, {100: CTX + GIB})  # no SM sample, no memory growth: only the probe saw it
    (task,) = h.tracker.running()
    assert task.started_at == pytest.approx(1.43) and task.phase == Phase.COMPUTING
    assert task.order[0] == pytest.approx(1.43)  # queued by its first launch
    polls(h, 1.6, 1.9, {100: CTX + GIB})
    assert [(v.started_at, v.ended_at) for v in h.ended()] == [
        (pytest.approx(0.52), pytest.approx(0.8)),
        (pytest.approx(1.43), pytest.approx(1.7)),
    ]


# --- PID reuse, exits mid-task, one poll holding a whole task -----------------------------


def test_a_reused_pid_gets_a_task_of_its_own_with_its_own_boundaries() -> None:
    h = Probed(container(1, deadline_s=1.0))
    h.own(100, 1, 5000)
    h.calls(100, Driver((0.13, 0.34), exit_at=0.4))
    h.poll(0.0, {})
    polls(h, 0.1, 0.3, {100: CTX})
    h.poll(0.4, {})
    h.own(100, 1, 6000)  # the same PID, a new process
    h.calls(100, Driver((0.75, 0.93), exit_at=1.0))
    polls(h, 0.5, 0.9, {100: CTX})
    h.poll(1.0, {})
    got = [(v.task_id.split(":")[2], v.started_at, v.ended_at) for v in h.ended()]
    assert got == [
        ("5000", pytest.approx(0.13), pytest.approx(0.34)),
        ("6000", pytest.approx(0.75), pytest.approx(0.93)),
    ]


def test_a_process_that_exits_in_its_wait_ends_its_task_where_it_left() -> None:
    h = Probed(container(1, deadline_s=1.0))
    h.own(100, 1, 5000)
    h.calls(100, Driver((0.13, 9.0), exit_at=0.46))  # killed in its wait
    h.poll(0.0, {})
    polls(h, 0.1, 0.4, {100: CTX})
    h.poll(0.5, {})
    (view,) = h.ended()
    assert view.started_at == pytest.approx(0.13)
    assert 0.45 <= (view.ended_at or 0) <= 0.5  # the probe's exit tick or the half-way poll
    assert h.tracker.running() == ()


def test_a_process_gone_before_the_probes_view_shows_its_end_ends_at_its_last_wait() -> None:
    h = Probed(container(1, deadline_s=1.0))
    h.own(100, 1, 5000)
    h.calls(100, Driver((0.13, 0.47), exit_at=0.48))
    h.poll(0.0, {})
    polls(h, 0.1, 0.4, {100: CTX})
    h.lag = 0.04  # the view is of 0.46: still in its last wait
    h.poll(0.5, {})  # NVML: gone
    (task,) = h.tracker.running()  # not ended half-way between polls (0.45)
    assert h.ended() == []
    h.lag = 0.0
    h.poll(0.6, {})
    (view,) = h.ended()
    assert (view.started_at, view.ended_at) == (pytest.approx(0.13), pytest.approx(0.47))
    assert view.task_id == task.task_id and h.tracker.table_sizes()["leaving"] == 0


def test_a_task_begun_and_ended_between_two_polls_is_still_one_task() -> None:
    h = Probed(container(1, deadline_s=0.05))
    h.own(100, 1, 5000)
    h.calls(100, Driver((0.32, 0.36)))
    h.poll(0.0, {})
    polls(h, 0.1, 0.6, {100: CTX})
    (view,) = h.ended()
    assert (view.started_at, view.ended_at) == (pytest.approx(0.32), pytest.approx(0.36))
    assert view.met_deadline is True
    assert [e["ts"] for e in h.of(EventType.TASK_ENDED)] == [pytest.approx(0.36)]


# --- the probe attaching and detaching mid-life -------------------------------------------


def test_probe_attaching_mid_task_leaves_that_task_to_nvml_and_times_the_next() -> None:
    h = Probed(container(1, deadline_s=2.0))
    h.attached = False
    h.own(100, 1, 5000)
    h.calls(100, Driver((0.1, 0.45), (1.53, 1.7)))
    h.poll(0.0, {})
    for t, sm in [(0.1, 0.0), (0.2, 1.0), (0.3, 1.0)]:
        h.poll(t, {100: CTX + GIB if t > 0.1 else CTX}, sm={100: sm} if sm else None)
    (nvml_task,) = h.tracker.running()
    h.attached = True  # attaches in the middle of it
    h.poll(0.4, {100: CTX + GIB}, sm={100: 1.0})
    assert h.tracker.running()[0].task_id == nvml_task.task_id  # the same task goes on
    polls(h, 0.5, 1.9, {100: CTX + GIB})
    first, second = h.ended()
    assert first.task_id == nvml_task.task_id and first.started_at == nvml_task.started_at
    assert (second.started_at, second.ended_at) == (pytest.approx(1.53), pytest.approx(1.7))
    assert second.boundary is TaskBoundary.EXACT
    assert (first.timed_by, second.timed_by) == ("nvml", "launch")


def test_probe_detaching_mid_task_hands_it_to_nvml_which_ends_it() -> None:
    h = Probed(container(1, deadline_s=5.0))
    h.own(100, 1, 5000)
    h.calls(100, Driver((0.13, 0.6)))
    h.poll(0.0, {})
    polls(h, 0.1, 0.3, {100: CTX})
    (task,) = h.tracker.running()
    h.attached = False
    for t in (0.4, 0.5, 0.6):
        h.poll(t, {100: CTX}, sm={100: 1.0})
    polls(h, 0.7, 2.0, {100: CTX})  # idle past the idle gap
    (view,) = h.ended()
    assert view.task_id == task.task_id and view.started_at == pytest.approx(0.13)
    assert view.ended_at == pytest.approx(0.6)  # its last SM sample
    assert h.tracker.running() == ()
    h.attached = True  # attached again: the next period is the probe's own task
    h.calls(100, Driver((0.13, 0.6), (2.23, 2.4)))
    polls(h, 2.1, 2.6, {100: CTX})
    assert [(v.timed_by, v.started_at) for v in h.ended()][1:] == [("launch", pytest.approx(2.23))]


# --- what the probe does not time -------------------------------------------------------


def test_a_container_with_two_processes_keeps_nvml_tasks() -> None:
    def run(attached: bool) -> list[tuple[float, float | None]]:
        h = Probed(container(1, deadline_s=5.0))
        h.attached = attached
        h.own(100, 1, 5000)
        h.own(101, 1, 5001)
        h.calls(100, Driver((0.13, 0.5)))
        h.poll(0.0, {})
        for t in (0.1, 0.2, 0.3, 0.4, 0.5):
            h.poll(t, {100: CTX, 101: CTX + GIB}, sm={100: 1.0} if t > 0.1 else None)
        polls(h, 0.6, 2.0, {100: CTX, 101: CTX + GIB})
        return [(v.started_at, v.ended_at) for v in h.ended()]

    assert run(True) == run(False)


def test_probe_marks_stay_bounded_under_container_churn() -> None:
    h = Probed()
    t = 0.0
    for n in range(200):
        h.containers = {cid(n % 5 + 1): container(n % 5 + 1)}
        h.own(1000 + n, n % 5 + 1, n)
        h.calls(1000 + n, Driver((t + 0.05, t + 0.12), exit_at=t + 0.15))
        h.poll(round(t + 0.1, 3), {1000 + n: CTX})
        h.poll(round(t + 0.2, 3), {})
        h.tracker.forget_containers(h.containers)
        t += 0.3
    assert h.tracker.table_sizes()["probe_marks"] <= 1
    assert len(h.ended()) == 64  # every one a task (history holds the last 64)


def test_a_paused_probed_task_waits_inside_its_task_and_its_run_is_not_learnt() -> None:
    h = Probed(container(1, deadline_s=5.0))
    h.own(100, 1, 5000)
    h.calls(100, Driver((0.13, 1.47)))  # its wait returns late: frozen from 0.4 to 1.3
    h.poll(0.0, {})
    polls(h, 0.1, 0.3, {100: CTX})
    h.containers = {cid(1): container(1, deadline_s=5.0, state="paused")}
    polls(h, 0.4, 1.2, {100: CTX})
    (task,) = h.tracker.running()
    assert task.busy_until is None and task.elapsed_s(1.2) == pytest.approx(1.07)
    h.containers = {cid(1): container(1, deadline_s=5.0)}
    polls(h, 1.3, 1.7, {100: CTX})
    (view,) = h.ended()
    assert (view.started_at, view.ended_at) == (pytest.approx(0.13), pytest.approx(1.47))
    assert cid(1) not in h.tracker.typical_run  # it waited: not what it needs alone


# --- admission's view: a frozen task, a task's queue place, host work between kernels -------


def test_a_frozen_task_with_a_kernel_in_flight_drains_as_nvml_sees_its_kernel_end() -> None:
    # frozen inside its wait, the process cannot return from it: the probe's view keeps the
    # kernel in flight until it is thawed, while the device finishes the kernel (NVML's
    # samples stop). A waiter queued behind a frozen kernel must see it drain.
    h = Probed(container(1, deadline_s=5.0))
    h.own(100, 1, 5000)
    h.calls(100, Driver((0.13, 1.47)))  # its wait returns only once thawed at 1.4
    h.poll(0.0, {})
    for t in (0.1, 0.2, 0.3):
        h.poll(t, {100: CTX + GIB}, sm={100: 1.0} if t > 0.1 else None)
    h.containers = {cid(1): container(1, deadline_s=5.0, state="paused")}
    h.poll(0.4, {100: CTX + GIB}, sm={100: 1.0})  # frozen: its kernel still runs
    (task,) = h.tracker.running()
    assert task.phase == Phase.COMPUTING and task.timed_by == "launch"
    polls(h, 0.5, 1.3, {100: CTX + GIB})  # the kernel is done: no sample stands for it
    (task,) = h.tracker.running()
    assert task.phase == Phase.DRAINING and task.busy_until is None  # waiting, not idle
    assert h.activity.view()[cid(1)].in_flight  # the probe still cannot see it return
    h.containers = {cid(1): container(1, deadline_s=5.0)}
    polls(h, 1.4, 1.7, {100: CTX + GIB})
    (view,) = h.ended()
    assert (view.started_at, view.ended_at) == (pytest.approx(0.13), pytest.approx(1.47))


def test_a_task_seen_in_its_input_keeps_its_start_and_queue_place_when_it_launches() -> None:
    # A waits frozen in its input; B arrives, then A is let run and launches: A's start (its
    # first sight) stays where it was, so it stays ahead of B in FIFO order, and its wait
    # and input count in its run time, as in the workload's own log.
    h = Probed(container(1, deadline_s=1.0), container(2, deadline_s=1.0))
    h.own(100, 1, 5000)
    h.own(200, 2, 5001)
    h.calls(100, Driver((1.23, 1.58), copies=(1.12, 1.17), exit_at=1.65))  # input, kernel
    h.poll(0.0, {})
    h.containers[cid(1)] = container(1, deadline_s=1.0, state="paused")
    polls(h, 0.1, 0.5, {100: CTX + GIB})
    polls(h, 0.6, 1.0, {100: CTX + GIB, 200: CTX + GIB})
    h.containers[cid(1)] = container(1, deadline_s=1.0)
    polls(h, 1.1, 1.6, {100: CTX + 2 * GIB, 200: CTX + GIB})
    a, b = h.tracker.running()
    assert (a.container_id, b.container_id) == (cid(1), cid(2))
    assert a.started_at == pytest.approx(0.05) and a.order[0] == pytest.approx(0.05)
    assert a.timed_by == "launch" and b.timed_by == "nvml"
    h.poll(1.7, {200: CTX + GIB})
    (view,) = h.ended()
    assert (view.started_at, view.ended_at) == (pytest.approx(0.05), pytest.approx(1.58))
    assert view.met_deadline is False and view.boundary is TaskBoundary.EXACT
    assert len(h.of(EventType.TASK_STARTED)) == 2


def test_host_work_between_kernels_stays_inside_the_task_computing_until_its_output() -> None:
    # paper C's light inference task: 8 kernels of 20 ms with 30 ms of host work between
    # them (longer than the probe's task gap, so 8 busy periods), then its output copies
    spans = [(round(0.2 + 0.05 * k, 3), round(0.22 + 0.05 * k, 3)) for k in range(8)]
    copies = (0.58, 0.62, 0.66)  # its output, after its last kernel (0.55 to 0.57)
    h = Probed(container(1, deadline_s=1.0))
    h.own(100, 1, 5000)
    h.calls(100, Driver(*spans, copies=(0.12, 0.16, *copies), exit_at=0.75))
    h.poll(0.0, {})
    phases = []
    for t in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7):
        h.poll(t, {100: CTX + GIB})
        phases += [task.phase for task in h.tracker.running()]
    assert phases[1:5] == [Phase.COMPUTING] * 4  # between its kernels too
    assert phases[5:] == [Phase.DRAINING]  # copying its output, then over (at 0.7)
    h.poll(0.8, {})
    (view,) = h.ended()
    assert (view.started_at, view.ended_at) == (pytest.approx(0.05), pytest.approx(0.57))
    assert view.boundary is TaskBoundary.EXACT and view.timed_by == "launch"


def test_a_task_that_copied_its_input_ends_once_its_outputs_busy_period_is_over() -> None:
    # a program keeping its memory: input, kernel, output (copies after its last launch),
    # then a request of its own later: the first task ends where its output's period did
    h = Probed(container(1, deadline_s=1.0))
    h.own(100, 1, 5000)
    spans = [(0.2, 0.24), (0.33, 0.37), (0.71, 0.78)]  # two kernels, a later request
    h.calls(100, Driver(*spans, copies=(0.12, 0.16, 0.35, 0.36)))  # input, output
    h.poll(0.0, {})
    polls(h, 0.1, 0.6, {100: CTX + GIB})
    (first,) = h.ended()
    assert (first.started_at, first.ended_at) == (pytest.approx(0.05), pytest.approx(0.37))
    polls(h, 0.7, 1.0, {100: CTX + GIB})
    assert [(v.started_at, v.ended_at) for v in h.ended()][1:] == [
        (pytest.approx(0.71), pytest.approx(0.78))
    ]


def test_requests_served_back_to_back_in_one_busy_period_are_busy_time_not_a_miss() -> None:
    # queued requests: the next one's copy in and launch follow the last one's output within
    # the probe's task gap, so one busy period holds three requests; each met its own 0.11 s
    # deadline, the period (0.3 s) would not: it is not judged
    spans = [(1.0, 1.1), (1.115, 1.2), (1.215, 1.3), (2.0, 2.08)]
    copies = (0.99, 1.102, 1.112, 1.202, 1.212, 1.302, 1.99, 2.082)  # in, out per request
    h = Probed(container(1, deadline_s=0.11))
    h.own(100, 1, 5000)
    h.calls(100, Driver(*spans, copies=copies))
    h.poll(0.0, {})
    polls(h, 0.1, 2.5, {100: CTX + GIB})
    got = [(v.started_at, v.ended_at, v.boundary, v.met_deadline) for v in h.ended()]
    assert got == [
        (pytest.approx(1.0), pytest.approx(1.3), TaskBoundary.MERGED, None),
        (pytest.approx(2.0), pytest.approx(2.08), TaskBoundary.EXACT, True),
    ]
    stats = h.tracker.stats[cid(1)]
    assert (stats.finished, stats.hits, stats.misses, stats.busy_periods) == (1, 1, 0, 1)


# --- runs back to back: the next input after an output starts the next task ---------------


def _repeater(runs: int, kernel: float = 0.3, copy: float = 0.04, directed: bool = True) -> Driver:
    """A program that copies its input (two copies of ``copy`` s), computes, copies its
    output and goes straight on, from 0.1 s; each copy is waited for, so one busy period
    holds every run."""
    spans, ins, outs = [], [], []
    t = 0.1
    for _ in range(runs):
        ins += [(round(t, 3), round(t + copy, 3)), (round(t + copy, 3), round(t + 2 * copy, 3))]
        t += 2 * copy
        spans.append((round(t, 3), round(t + kernel, 3)))
        t += kernel
        outs.append((round(t, 3), round(t + copy + 0.01, 3)))
        t += copy + 0.01
    return Driver(*spans, copies_in=tuple(ins), copies_out=tuple(outs), directed=directed)


@pytest.mark.parametrize("mode", [BURST, MEMORY])
def test_runs_back_to_back_are_each_a_task_from_their_own_input(mode: TaskMode) -> None:
    # input 0.1-0.18, kernel 0.18-0.48, output 0.48-0.53; then 0.53-0.61, 0.61-0.91,
    # 0.91-0.96; then 0.96-1.04, 1.04-1.34, 1.34-1.39: one busy period, three tasks
    h = Probed(container(1, deadline_s=0.5, task_mode=mode))
    h.own(100, 1, 5000)
    h.calls(100, _repeater(3))
    h.poll(0.0, {})
    h.poll(0.1, {100: CTX + GIB})  # its memory: the first task, before any copy
    phases = []
    t = 0.2
    while t <= 1.6:
        h.poll(round(t, 3), {100: CTX + GIB})
        phases.append([(v.started_at, v.phase) for v in h.tracker.running()])
        t += 0.1
    h.poll(1.7, {})  # exited
    got = [(v.started_at, v.ended_at, v.boundary, v.met_deadline) for v in h.ended()]
    # each ends where the next input began, the last at its output's wait's return
    assert got == [
        (pytest.approx(0.05), pytest.approx(0.53), TaskBoundary.EXACT, True),
        (pytest.approx(0.53), pytest.approx(0.96), TaskBoundary.EXACT, True),
        (pytest.approx(0.96), pytest.approx(1.39), TaskBoundary.EXACT, True),
    ]
    # the second task is seen in its input (0.6) before its launch (0.61): admission can
    # hold it back there
    assert phases[4] == [(pytest.approx(0.53), Phase.INPUT)]
    assert phases[5] == [(pytest.approx(0.53), Phase.COMPUTING)]
    assert all(v.timed_by == "launch" for v in h.ended())
    starts = h.of(EventType.TASK_STARTED)
    assert [e["ts"] for e in starts] == [
        pytest.approx(0.05),
        pytest.approx(0.53),
        pytest.approx(0.96),
    ]


def test_several_runs_between_two_polls_are_one_task_not_judged() -> None:
    # short runs (40 ms each) back to back: a 100 ms poll sees two next inputs at once, so
    # the task it ends held more than one run and is busy time, never a verdict
    h = Probed(container(1, deadline_s=0.05))
    h.own(100, 1, 5000)
    h.calls(100, _repeater(12, kernel=0.01, copy=0.01))
    h.poll(0.0, {})
    h.poll(0.1, {100: CTX + GIB})
    polls(h, 0.2, 1.2, {100: CTX + GIB})
    ended = h.ended()
    assert len(ended) >= 2
    assert any(v.boundary is TaskBoundary.MERGED for v in ended)
    judged = [v for v in ended if v.boundary is TaskBoundary.EXACT]
    assert all(v.run_s is not None and v.run_s < 0.2 for v in judged)


def test_copies_without_a_direction_keep_runs_back_to_back_in_one_task() -> None:
    # the same program through cuMemcpyAsync (no direction): no next input is seen, so its
    # runs stay one task as before, ended once its output's busy period is over
    h = Probed(container(1, deadline_s=0.5))
    h.own(100, 1, 5000)
    h.calls(100, _repeater(2, directed=False))
    h.poll(0.0, {})
    polls(h, 0.1, 1.3, {100: CTX + GIB})
    assert [(v.started_at, v.ended_at) for v in h.ended()] == [
        (pytest.approx(0.05), pytest.approx(0.96))
    ]


def test_a_servers_requests_are_not_split_at_their_inputs() -> None:
    # a server's start-up, idle, then requests back to back: its tasks began with a launch,
    # not with an input of their own, so one busy period of requests stays merged
    h = Probed(container(1, deadline_s=0.11))
    h.own(100, 1, 5000)
    spans = [(1.0, 1.1), (1.115, 1.2), (1.215, 1.3)]
    ins = ((0.99, 0.995), (1.105, 1.11), (1.205, 1.21))
    outs = ((1.1, 1.102), (1.2, 1.202), (1.3, 1.302))
    h.calls(100, Driver(*spans, copies=(0.02,), copies_in=ins, copies_out=outs))
    h.poll(0.0, {})
    polls(h, 0.1, 1.6, {100: CTX + GIB})
    got = [(v.started_at, v.ended_at, v.boundary) for v in h.ended()]
    assert got[-1] == (pytest.approx(1.0), pytest.approx(1.302), TaskBoundary.MERGED)


def test_a_process_missing_from_one_poll_between_runs_keeps_its_task() -> None:
    # a program that re-creates its context between runs: NVML's list misses it at one
    # poll (0.5, as its first run drains), but its busy period goes on, and so does its task
    h = Probed(container(1, deadline_s=0.5))
    h.own(100, 1, 5000)
    h.calls(100, _repeater(2))
    h.poll(0.0, {})
    for t in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1):
        h.poll(t, {} if t == 0.5 else {100: CTX + GIB})
    h.poll(1.2, {})
    got = [(v.started_at, v.ended_at, v.boundary) for v in h.ended()]
    assert got == [
        (pytest.approx(0.05), pytest.approx(0.53), TaskBoundary.EXACT),
        (pytest.approx(0.53), pytest.approx(0.96), TaskBoundary.EXACT),
    ]
    assert len(h.of(EventType.TASK_STARTED)) == 2


def test_runs_whose_first_input_is_shorter_than_a_poll_are_each_a_task_too() -> None:
    # the first poll that sees its memory also sees its first launch (its input took 20 ms):
    # still begun with its input, so the next input starts the next task
    h = Probed(container(1, deadline_s=0.5))
    h.own(100, 1, 5000)
    h.calls(100, _repeater(3, copy=0.01))
    h.poll(0.0, {})
    polls(h, 0.2, 1.4, {100: CTX + GIB})  # nothing seen at 0.1: memory and launch at 0.2
    h.poll(1.5, {})
    got = [(v.started_at, v.ended_at, v.boundary) for v in h.ended()]
    # the polls come after each run's launch (0.46, 0.80): its kernel still counts
    assert got == [
        (pytest.approx(0.12), pytest.approx(0.44), TaskBoundary.EXACT),
        (pytest.approx(0.44), pytest.approx(0.78), TaskBoundary.EXACT),
        (pytest.approx(0.78), pytest.approx(1.12), TaskBoundary.EXACT),
    ]
