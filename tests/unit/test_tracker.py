"""The task tracker in each mode, fed hand-made samples one poll at a time (100 ms polls)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from gpuguard.contract import PriorityClass, TaskMode
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.join import join
from gpuguard.exporter.model import ContainerInfo, ProcessOwner
from gpuguard.exporter.samples import SampleHold
from gpuguard.exporter.tracker import RUNNING_DEMAND_SAMPLES, TaskRules, Tracker
from tests.unit.exporter_fakes import GIB, cid, container, sample

CTX = 300 * 2**20  # context base memory, as gpusim and a real CUDA context show
PROCESS, MEMORY, BURST = TaskMode.PROCESS, TaskMode.MEMORY, TaskMode.BURST


class Harness:
    """Feeds a tracker one poll at a time, like the poller does."""

    def __init__(self, *containers: ContainerInfo, history: int = 16, **rules: object) -> None:
        self.events = EventLog(100_000)
        self.tracker = Tracker(self.events, history, TaskRules(**rules))  # type: ignore[arg-type]
        self.containers = {c.id: c for c in containers}
        self.owners: dict[int, ProcessOwner] = {}
        self.hold = SampleHold()  # as the poller does

    def own(self, pid: int, container_n: int | None, ticks: int) -> None:
        self.owners[pid] = ProcessOwner(cid(container_n) if container_n else None, ticks)

    def poll(
        self,
        t: float,
        procs: Mapping[int, int | None],
        sm: Mapping[int, float] | None = None,
        sm_at: Mapping[int, float] | None = None,
    ) -> None:
        held = self.hold.apply(sample(t, procs, sm, sm_at=sm_at))
        joined = join(held, self.owners, self.containers)
        self.tracker.update(joined, t, self.containers)

    def running(self) -> list[str]:
        return [t.phase for t in self.tracker.running()]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events.since(0).events]

    def of(self, type_: str) -> list[dict]:
        return [e for e in self.events.since(0).events if e["type"] == type_]


def one_shot(h: Harness, pid: int = 100, t0: float = 0.0) -> float:
    """Paper B's program: context, input, kernel, copy-out, exit; returns its true end."""
    h.poll(t0, {})
    h.poll(t0 + 0.1, {pid: CTX})  # appears: started at t0 + 0.05
    h.poll(t0 + 0.2, {pid: CTX + GIB})  # input
    h.poll(t0 + 0.3, {pid: CTX + 2 * GIB}, sm={pid: 1.0})
    h.poll(t0 + 0.4, {pid: CTX + 2 * GIB}, sm={pid: 1.0}, sm_at={pid: t0 + 0.38})
    h.poll(t0 + 0.5, {pid: CTX + 2 * GIB})  # copying out (0.3 s): nothing visible
    h.poll(t0 + 0.6, {pid: CTX + 2 * GIB})
    h.poll(t0 + 0.7, {pid: CTX + 2 * GIB})
    h.poll(t0 + 0.8, {})  # exited: ended at t0 + 0.75
    return t0 + 0.75


# --- one-shot programs: the same task in every mode ---------------------------------------


@pytest.mark.parametrize("mode", list(TaskMode))
def test_one_shot_program_is_one_task_from_appearance_to_exit_in_every_mode(
    mode: TaskMode,
) -> None:
    h = Harness(container(1, deadline_s=10, task_mode=mode))
    h.own(100, 1, 5000)
    end = one_shot(h)
    assert h.tracker.running() == ()
    (done,) = h.tracker.recent
    assert done.mode == mode
    assert done.started_at == pytest.approx(0.05) and done.ended_at == pytest.approx(end)
    assert done.met_deadline is True
    assert [e["phase"] for e in h.of("task_phase")] == ["input", "computing", "draining"]
    assert h.types()[0] == "task_started" and h.types()[-1] == "task_ended"
    assert h.tracker.stats[cid(1)].finished == 1 and h.tracker.stats[cid(1)].hits == 1
    assert h.of("task_ended")[0]["container"] == "rt-1"


def test_phases_and_task_id() -> None:
    h = Harness(container(1, deadline_s=10))
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: CTX})
    (task,) = h.tracker.running()
    assert task.phase == "starting" and task.mode == BURST
    assert task.task_id == f"{cid(1)[:12]}:100:5000:1"
    h.poll(0.2, {100: CTX + GIB})
    h.poll(0.3, {100: CTX + GIB}, sm={100: 1.0})
    h.poll(0.4, {100: CTX + GIB})  # one poll without a sample: its last one stands
    assert h.running() == ["computing"]
    h.poll(0.55, {100: CTX + GIB})  # more than a sample period (1/6 s) later: none stands
    assert h.running() == ["draining"]


def test_first_poll_uses_its_own_time() -> None:
    h = Harness(container(1))
    h.own(1, 1, 1)
    h.poll(7.0, {1: CTX})
    assert h.tracker.running()[0].started_at == 7.0


# --- burst: long-lived servers and training loops --------------------------------------------


def server(
    h: Harness, requests: int, gap: float = 2.0, work: float = 0.5, share: float = 1.0
) -> list[float]:
    """A long-lived server polled every 0.1 s: context and weights at start-up, then
    ``requests`` kernels of ``work`` s every ``gap`` s from t = 3, each taking ``share`` of
    the device while it runs. Returns the true starts; each request's samples stop exactly
    at its kernel's end.
    """
    starts = [3.0 + i * gap for i in range(requests)]
    h.poll(0.0, {})
    for i in range(1, int((starts[-1] + gap) * 10)):
        t = i / 10
        busy = [s for s in starts if s < t <= s + work + 0.1]
        if busy:
            end = busy[0] + work
            h.poll(t, {100: CTX + GIB}, sm={100: share}, sm_at={100: min(t, end)})
        else:
            h.poll(t, {100: CTX + GIB})
    return starts


def test_server_requests_are_one_task_each_and_idle_is_no_task() -> None:
    # issue 8: five 0.5 s requests against a 2 s deadline were one overrunning task
    h = Harness(container(1, deadline_s=2.0))
    h.own(100, 1, 5000)
    starts = server(h, 5)
    assert h.tracker.running() == ()  # idle: not running, not overrunning
    requests = list(h.tracker.recent)[1:]  # the first is the start-up (context, weights)
    assert len(requests) == 5
    for i, (task, start) in enumerate(zip(requests, starts, strict=True)):
        # placed where its first sample (the whole device) says it began: a sample period
        # (1/6 s until learnt from two samples, then 0.1 s) before that sample
        period = 1 / 6 if i == 0 else 0.1
        assert task.started_at == pytest.approx(start + 0.1 - period, abs=1e-5)
        assert task.ended_at == pytest.approx(start + 0.5)  # the last sample's own time
        assert task.boundary == "exact" and task.met_deadline is True
    assert h.tracker.recent[0].boundary == "no_kernel"  # the start-up: not counted at all
    stats = h.tracker.stats[cid(1)]
    assert (stats.finished, stats.hits, stats.misses) == (5, 5, 0)
    assert h.of("deadline_overrun") == []


def test_startup_burst_ends_after_the_idle_timeout_at_its_last_activity() -> None:
    h = Harness(container(1), idle_timeout_s=2.0)
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: CTX})
    h.poll(0.2, {100: CTX + GIB})  # weights: grew at 0.15
    for i in range(3, 22):
        h.poll(i / 10, {100: CTX + GIB})
    assert h.running() == ["input"]  # copies are invisible: it may still be copying in
    h.poll(2.2, {100: CTX + GIB})
    assert h.tracker.running() == ()
    assert h.tracker.recent[0].ended_at == pytest.approx(0.15)


def test_invisible_input_shorter_than_the_idle_timeout_stays_one_task() -> None:
    # ten concurrent inputs take about a second with nothing for NVML to show
    h = Harness(container(1))
    h.own(100, 1, 5000)
    h.poll(0.0, {100: CTX + 2 * GIB})
    for i in range(1, 13):
        h.poll(i / 10, {100: CTX + 2 * GIB})
    h.poll(1.3, {100: CTX + 2 * GIB}, sm={100: 1.0})
    assert h.running() == ["computing"] and len(h.tracker.recent) == 0


def test_training_loop_is_one_task_while_it_computes() -> None:
    h = Harness(container(1))
    h.own(100, 1, 5000)
    h.poll(0.0, {100: CTX + GIB}, sm={100: 0.9})
    for i in range(1, 300):  # 30 s of steps; NVML misses a sample now and then
        h.poll(i / 10, {100: CTX + GIB}, sm={100: 0.9} if i % 3 else None)
    assert h.running() == ["computing"] and len(h.tracker.recent) == 0


def test_pause_between_requests_shorter_than_the_gap_is_one_burst() -> None:
    h = Harness(container(1), idle_gap_s=0.5)
    h.own(100, 1, 5000)
    h.poll(0.0, {100: CTX}, sm={100: 1.0})
    h.poll(0.1, {100: CTX})
    h.poll(0.2, {100: CTX})
    h.poll(0.3, {100: CTX})
    h.poll(0.4, {100: CTX}, sm={100: 1.0})  # 0.4 s without a sample, under the gap
    assert len(h.tracker.running()) == 1 and len(h.tracker.recent) == 0
    # it went on after an idle it showed: a request may have ended there (module doc)
    assert h.tracker.running()[0].boundary == "merged"


# --- boundaries: what is judged against the deadline (issue 15) -------------------------------


def back_to_back(h: Harness, t0: float, requests: int, busy: float, gap: float) -> float:
    """Requests of ``busy`` s (the whole device) with ``gap`` s between them, under the idle
    gap, polled every 0.1 s; returns the true end of the last."""
    h.poll(t0 - 0.1, {100: CTX + GIB})
    t, end = t0, t0 + requests * (busy + gap) - gap
    while t < end + 1.0:
        at = t0 + ((t - t0) // (busy + gap)) * (busy + gap) + busy  # this request's end
        running = (t - t0) % (busy + gap) < busy + 0.05 and t <= end + 0.05
        sm = {100: 1.0} if running else None
        h.poll(round(t, 3), {100: CTX + GIB}, sm=sm, sm_at={100: min(t, at)} if sm else None)
        t += 0.1
    return end


def test_back_to_back_requests_merged_into_a_long_burst_are_busy_time_not_a_miss() -> None:
    # issue 15: a busy server's requests, each well within its 1 s deadline, merged into a
    # burst of several seconds, were counted as overruns and marked a healthy node
    h = Harness(container(1, deadline_s=1.0), idle_gap_s=0.5)
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    back_to_back(h, 1.0, requests=8, busy=0.4, gap=0.3)  # 5.3 s busy, gaps of 0.3 s
    assert h.tracker.running() == ()
    (burst,) = h.tracker.recent
    assert burst.run_s is not None and burst.run_s > 5.0
    assert burst.boundary == "merged" and burst.met_deadline is None
    assert h.of("deadline_overrun") == [] and h.of("task_ended")[0]["boundary"] == "merged"
    stats = h.tracker.stats[cid(1)]
    assert (stats.misses, stats.hits, stats.finished) == (0, 0, 0)
    assert stats.busy_periods == 1 and stats.busy_s == pytest.approx(burst.run_s)
    assert h.tracker.histograms() == {}  # a run time of several requests is no task's


def test_merged_burst_running_past_its_deadline_is_not_an_overrun() -> None:
    h = Harness(container(1, deadline_s=1.0), idle_gap_s=0.5)
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: CTX + GIB}, sm={100: 1.0})
    h.poll(0.2, {100: CTX + GIB}, sm={100: 1.0})
    h.poll(0.45, {100: CTX + GIB})  # no sample stands: a gap (0.25 s, under the idle gap)
    assert h.tracker.running()[0].boundary == "open"
    for i in range(5, 30):  # busy again, for 2.5 s
        h.poll(i / 10, {100: CTX + GIB}, sm={100: 1.0})
    (task,) = h.tracker.running()
    assert task.boundary == "merged" and task.slack_s(2.9) < 0 and not task.overrun
    h.tracker.check_deadlines(3.0)
    assert h.of("deadline_overrun") == [] and h.tracker.stats.get(cid(1)) is None


def test_steady_part_of_the_device_is_a_server_with_short_gaps_not_one_task() -> None:
    # 25 ms requests 16 times a second: 40% of every sample period, never a whole period
    # idle, so no poll shows a gap; the idle part of each period may hold a boundary
    h = Harness(container(1, deadline_s=0.5), idle_gap_s=0.5)
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    for i in range(1, 40):
        h.poll(i / 10, {100: CTX + GIB}, sm={100: 0.4})
    assert h.tracker.running()[0].boundary == "merged"
    for i in range(40, 50):
        h.poll(i / 10, {100: CTX + GIB})
    (burst,) = h.tracker.recent
    assert burst.boundary == "merged" and h.tracker.stats[cid(1)].misses == 0


def test_one_request_leaving_part_of_its_last_periods_idle_stays_exact() -> None:
    # began and ended mid-period: two partial samples and nothing after them
    h = Harness(container(1, deadline_s=1.0), idle_gap_s=0.5)
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: CTX + GIB}, sm={100: 0.6})
    h.poll(0.2, {100: CTX + GIB}, sm={100: 0.6})
    for i in range(3, 10):
        h.poll(i / 10, {100: CTX + GIB})
    (task,) = h.tracker.recent
    assert task.boundary == "exact" and task.met_deadline is True


def test_burst_already_running_when_the_exporter_starts_is_not_judged() -> None:
    h = Harness(container(1, deadline_s=0.2))
    h.own(100, 1, 5000)
    for i in range(10):  # computing at the exporter's first poll: nobody saw it begin
        h.poll(i / 10, {100: CTX + GIB}, sm={100: 1.0})
    assert h.tracker.running()[0].boundary == "merged"
    h.poll(1.0, {})
    assert h.tracker.recent[0].boundary == "merged"
    assert h.tracker.stats[cid(1)].misses == 0


def test_startup_context_without_a_kernel_is_neither_met_nor_missed() -> None:
    # issue 15: a server's start-up (context and model in, no kernel) was a 0 s task "met"
    h = Harness(container(1, deadline_s=1.0), idle_timeout_s=2.0)
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: CTX})
    h.poll(0.2, {100: CTX + GIB})
    for i in range(3, 30):
        h.poll(i / 10, {100: CTX + GIB})
    (startup,) = h.tracker.recent
    assert startup.boundary == "no_kernel" and startup.met_deadline is None
    assert h.tracker.stats.get(cid(1)) is None and h.tracker.histograms() == {}


@pytest.mark.parametrize("mode", [PROCESS, MEMORY])
def test_process_and_memory_tasks_are_exact_and_judged_as_before(mode: TaskMode) -> None:
    h = Harness(container(1, deadline_s=0.3, task_mode=mode), idle_timeout_s=5.0)
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: CTX + GIB}, sm={100: 0.5})
    h.poll(0.2, {100: CTX + GIB}, sm={100: 0.5})
    h.poll(0.3, {100: CTX + GIB}, sm={100: 0.5})  # partial samples: no matter here
    h.poll(0.4, {100: CTX + GIB}, sm={100: 0.5})
    (task,) = h.tracker.running()
    assert task.boundary == "exact" and task.overrun  # a miss at once, while it runs
    h.poll(0.5, {})
    (done,) = h.tracker.recent
    assert done.boundary == "exact" and done.met_deadline is False
    stats = h.tracker.stats[cid(1)]
    assert (stats.misses, stats.finished, stats.busy_periods) == (1, 1, 0)


def test_burst_pending_its_idle_gap_is_not_an_overrun() -> None:
    h = Harness(container(1, deadline_s=0.6), idle_gap_s=0.5)
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    for i in range(1, 7):  # started 0.05; the last sample says the kernel ended at 0.55
        h.poll(i / 10, {100: CTX}, sm={100: 1.0}, sm_at={100: min(i / 10, 0.55)})
    for i in range(7, 13):  # 0.65 s since the start: past the deadline, but nothing seen
        h.poll(i / 10, {100: CTX})
        assert not h.tracker.running() or h.tracker.running()[0].slack_s(i / 10) > 0
    (task,) = h.tracker.recent
    assert task.run_s == pytest.approx(0.5) and task.met_deadline is True
    assert h.of("deadline_overrun") == [] and h.tracker.stats[cid(1)].misses == 0


def test_run_time_so_far_counts_what_was_seen() -> None:
    h = Harness(container(1, deadline_s=5), idle_timeout_s=10)
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: CTX})  # started 0.05
    h.poll(0.2, {100: CTX + GIB})  # grew at 0.15, then copies in (invisible)
    h.poll(0.7, {100: CTX + GIB})
    task = h.tracker.running()[0]
    assert task.busy_until == pytest.approx(0.15) and task.elapsed_s(0.7) == pytest.approx(0.1)
    h.poll(0.8, {100: CTX + GIB}, sm={100: 1.0})  # the kernel shows
    task = h.tracker.running()[0]
    assert task.elapsed_s(0.8) == pytest.approx(0.75) and task.slack_s(0.8) == pytest.approx(4.25)


@pytest.mark.parametrize("mode", [MEMORY, BURST])
def test_paused_container_is_waiting_not_idle(mode: TaskMode) -> None:
    paused = container(1, deadline_s=1.0, state="paused", task_mode=mode)
    h = Harness(paused, idle_timeout_s=2.0)
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: CTX + GIB})  # frozen in its input phase by the actuator
    for i in range(2, 60):
        h.poll(i / 10, {100: CTX + GIB})
    (task,) = h.tracker.running()
    assert task.busy_until is None and task.slack_s(5.9) < 0  # its waiting counts
    if mode == MEMORY:  # exact boundaries: a miss at once
        assert task.overrun and len(h.of("deadline_overrun")) == 1
        return
    # a burst is judged when it ends: thawed, it computes and ends late
    assert task.boundary == "open" and not task.overrun and not h.of("deadline_overrun")
    h.containers = {paused.id: replace(paused, state="running")}
    h.poll(6.0, {100: CTX + GIB}, sm={100: 1.0})
    h.poll(6.1, {100: CTX})
    assert h.running() == ["computing"]  # the first poll after the thaw: no sample yet
    h.poll(6.2, {100: CTX + GIB}, sm={100: 1.0})
    h.poll(6.3, {100: 0})
    (done,) = h.tracker.recent
    assert done.boundary == "exact" and done.met_deadline is False
    assert h.tracker.stats[cid(1)].misses == 1


def test_burst_growing_again_after_its_kernel_is_a_new_task() -> None:
    # a looping program that frees and re-allocates: visible when the kernel had ended
    h = Harness(container(1))
    h.own(100, 1, 5000)
    h.poll(0.0, {100: CTX + GIB}, sm={100: 1.0})
    h.poll(0.1, {100: CTX + GIB})
    h.poll(0.2, {100: CTX})  # freed, still listed: no end in burst mode
    h.poll(0.3, {100: CTX})
    assert h.running() == ["draining"]
    h.poll(0.4, {100: CTX + GIB})  # a new input phase
    assert h.running() == ["input"] and h.tracker.recent[0].ended_at == pytest.approx(0.35)
    assert h.tracker.running()[0].started_at == pytest.approx(0.35)


def test_memory_back_to_zero_ends_a_burst() -> None:
    h = Harness(container(1))
    h.own(100, 1, 5000)
    h.poll(0.0, {100: GIB}, sm={100: 1.0})
    h.poll(0.1, {100: 0})
    assert h.tracker.running() == () and h.tracker.recent[0].ended_at == pytest.approx(0.05)


@pytest.mark.parametrize("mode", [MEMORY, BURST])
def test_on_a_mig_device_without_samples_memory_decides(mode: TaskMode) -> None:
    # NVML gives MIG devices no utilization and no process samples: idleness is invisible
    h = Harness(container(1, deadline_s=1.0, task_mode=mode), idle_timeout_s=2.0)
    h.own(100, 1, 5000)

    def mig_poll(t: float, procs: Mapping[int, int | None]) -> None:
        s = sample(t, procs)
        device = replace(s.devices[0], utilization_ratio=None, mig_index=1)
        joined = join(replace(s, devices=(device,)), h.owners, h.containers)
        h.tracker.update(joined, t, h.containers)

    mig_poll(0.0, {})
    mig_poll(0.1, {100: CTX + GIB})
    for i in range(2, 50):
        mig_poll(i / 10, {100: CTX + GIB})
    (task,) = h.tracker.running()
    assert task.gpu == "0:1" and task.busy_until is None
    # no idle can be seen there: a burst may hold several requests (busy time)
    assert task.overrun is (mode == MEMORY)
    assert task.boundary == ("exact" if mode == MEMORY else "merged")
    mig_poll(5.0, {})
    assert h.tracker.recent[0].ended_at == pytest.approx(4.95)
    stats = h.tracker.stats[cid(1)]
    assert (stats.misses, stats.busy_periods) == ((1, 0) if mode == MEMORY else (0, 1))


# --- process mode ----------------------------------------------------------------------------


def test_process_mode_is_appearance_to_exit_even_when_idle() -> None:
    h = Harness(container(1, deadline_s=2.0, task_mode=PROCESS))
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: 0})  # a context with nothing allocated is already the task
    for i in range(2, 40):
        h.poll(i / 10, {100: CTX}, sm={100: 1.0} if i == 10 else None)
    (task,) = h.tracker.running()
    assert task.mode == PROCESS and task.overrun and task.busy_until is None
    assert task.elapsed_s(3.9) == pytest.approx(3.85)
    h.poll(4.0, {})
    assert h.tracker.recent[0].run_s == pytest.approx(3.9)
    assert h.tracker.recent[0].met_deadline is False


def test_process_mode_draining_then_computing_stays_one_task() -> None:
    h = Harness(container(1, task_mode=PROCESS))
    h.own(100, 1, 5000)
    h.poll(0.0, {100: CTX}, sm={100: 1.0})
    h.poll(0.5, {100: CTX})
    assert h.running() == ["draining"]
    h.poll(0.6, {100: CTX}, sm={100: 1.0})
    assert h.running() == ["computing"] and len(h.tracker.recent) == 0
    assert h.tracker.running()[0].boundary == "exact"  # the process's life, as asked


# --- memory mode (paper B) and fast re-allocation ------------------------------------------


def test_memory_mode_free_and_realloc_is_two_tasks() -> None:
    h = Harness(container(1, task_mode=MEMORY))
    h.own(100, 1, 5000)
    h.poll(0.0, {100: GIB})
    h.poll(0.1, {100: 0})  # memory back to 0: ended (paper B), process stays listed
    assert h.tracker.running() == () and len(h.tracker.recent) == 1
    h.poll(0.2, {100: 0})  # idle: still no task
    assert h.tracker.running() == ()
    h.poll(0.3, {100: GIB})  # allocates again: a second task
    (task,) = h.tracker.running()
    assert task.task_id.endswith(":2") and task.started_at == pytest.approx(0.25)


def test_memory_mode_frees_back_to_the_context() -> None:
    h = Harness(container(1, task_mode=MEMORY))
    h.own(100, 1, 5000)
    h.poll(0.0, {100: CTX}, sm={100: 1.0})  # a first task: warm-up kernel
    h.poll(0.5, {100: CTX})
    h.poll(0.6, {100: CTX + GIB})  # grew after draining: a new task (re-allocation)
    assert len(h.tracker.recent) == 1 and h.tracker.recent[0].ended_at == pytest.approx(0.55)
    h.poll(0.7, {100: CTX + GIB}, sm={100: 1.0})
    h.poll(0.8, {100: CTX})  # freed what it allocated: back to where it started
    assert h.tracker.running() == () and h.tracker.recent[1].ended_at == pytest.approx(0.75)


def test_memory_mode_computing_again_after_draining_is_a_new_task() -> None:
    # fast re-allocation, visible: the kernel ended, samples stopped, then a new kernel
    h = Harness(container(1, task_mode=MEMORY))
    h.own(100, 1, 5000)
    h.poll(0.0, {100: CTX + GIB}, sm={100: 1.0})
    h.poll(0.1, {100: CTX + GIB}, sm={100: 1.0})
    h.poll(0.2, {100: CTX + GIB})
    h.poll(0.3, {100: CTX + GIB})
    h.poll(0.4, {100: CTX + GIB})
    assert h.running() == ["draining"]
    h.poll(0.5, {100: CTX + GIB}, sm={100: 1.0})
    assert h.running() == ["computing"] and len(h.tracker.recent) == 1
    assert h.tracker.recent[0].ended_at == pytest.approx(0.45)
    assert h.tracker.running()[0].started_at == pytest.approx(0.45)
    assert h.tracker.running()[0].task_id.endswith(":2")


def test_memory_mode_drop_after_the_kernel_ends_the_task() -> None:
    h = Harness(container(1, task_mode=MEMORY))
    h.own(100, 1, 5000)
    h.poll(0.0, {100: CTX + 2 * GIB}, sm={100: 1.0})
    h.poll(0.1, {100: CTX + GIB})  # freed half of it, no kernel: freeing its results
    assert h.tracker.running() == () and h.tracker.recent[0].ended_at == pytest.approx(0.05)
    h.poll(0.2, {100: CTX + 2 * GIB})  # re-allocates: a new task
    assert h.running() == ["input"]


def test_fast_reallocation_inside_one_poll_is_merged_in_every_mode() -> None:
    # what no poll can see: freed and re-allocated, kernel to kernel, between two polls
    for mode in TaskMode:
        h = Harness(container(1, task_mode=mode))
        h.own(100, 1, 5000)
        h.poll(0.0, {100: CTX + GIB}, sm={100: 1.0})
        h.poll(0.1, {100: CTX + GIB}, sm={100: 1.0})
        assert len(h.tracker.running()) == 1 and len(h.tracker.recent) == 0, mode


def test_memory_mode_idle_long_lived_process_ends_after_the_idle_timeout() -> None:
    h = Harness(container(1, task_mode=MEMORY, deadline_s=1.0), idle_timeout_s=3.0)
    h.own(100, 1, 5000)
    h.poll(0.0, {100: CTX + GIB}, sm={100: 1.0})  # cached memory, never freed
    for i in range(1, 32):
        h.poll(i / 10, {100: CTX + GIB})
    assert h.tracker.running() == ()
    (task,) = h.tracker.recent
    assert task.ended_at == pytest.approx(0.0) and task.met_deadline is True


# --- identity, order, counters ---------------------------------------------------------------


def test_pid_reuse_is_a_new_task() -> None:
    h = Harness(container(1), container(2))
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: GIB})
    h.own(100, 2, 9000)  # the pid now belongs to a new process in another container
    h.poll(0.2, {100: GIB})
    (task,) = h.tracker.running()
    assert task.container_id == cid(2) and task.proc_start_ticks == 9000
    assert task.task_id.endswith(":100:9000:2")
    assert h.tracker.recent[0].container_id == cid(1)


def test_repeated_runs_in_one_process_are_separate_tasks() -> None:
    h = Harness(container(1))
    h.own(100, 1, 5000)
    ids = []
    h.poll(-0.1, {})
    t = 0.0
    for _ in range(3):
        h.poll(t, {100: GIB}, sm={100: 1.0})
        ids.append(h.tracker.running()[0].task_id)
        h.poll(t + 0.1, {})
        t += 0.2
    assert [i.rsplit(":", 1)[1] for i in ids] == ["1", "2", "3"]
    assert len(h.tracker.recent) == 3 and h.tracker.stats[cid(1)].finished == 3


def test_zero_memory_at_first_sight_is_not_a_task_and_none_is() -> None:
    h = Harness(container(1))
    h.own(1, 1, 1)
    h.own(2, 1, 2)
    h.poll(0.0, {1: 0, 2: None})
    assert [t.pid for t in h.tracker.running()] == [2]


def test_order_is_task_start_then_process_start() -> None:
    h = Harness(container(1), container(2), container(3))
    h.own(900, 1, 100)  # high pid, started first (pids wrap)
    h.own(5, 2, 200)
    h.own(7, 3, 50)  # the oldest process of all: a looping tenant
    h.poll(0.0, {5: GIB})
    h.poll(0.1, {5: GIB, 900: GIB})
    h.poll(0.2, {5: GIB, 900: GIB, 7: GIB})
    # tasks that appeared together go by process start; a new task of an old process
    # queues behind those that started before it
    assert [t.pid for t in h.tracker.running()] == [5, 900, 7]


def test_looping_tenant_does_not_overtake_a_waiting_container() -> None:
    # issue 8: ordered by process start, every new task of an old process jumped the queue
    h = Harness(container(1), container(2, state="paused"))
    h.own(7, 1, 50)  # the looping tenant's process started long ago
    h.own(8, 2, 900)  # the waiting container's task started with the tenant's first
    h.poll(0.0, {7: GIB, 8: GIB})
    assert [t.pid for t in h.tracker.running()] == [7, 8]  # same start: process start decides
    for i in range(1, 10):  # the tenant frees and allocates again, over and over
        h.poll(i / 10, {7: 0 if i % 2 else GIB, 8: GIB})
        assert h.tracker.running()[0].pid == 8


def test_overrun_counted_while_running_exactly_once() -> None:
    h = Harness(container(1, deadline_s=0.5, task_mode=MEMORY))
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: GIB}, sm={100: 1.0})  # started at 0.05
    h.poll(0.5, {100: GIB}, sm={100: 1.0})
    assert h.of("deadline_overrun") == []
    h.poll(0.6, {100: GIB}, sm={100: 1.0})  # elapsed 0.55 > 0.5: overrun now, while it runs
    assert len(h.of("deadline_overrun")) == 1 and h.tracker.running()[0].overrun
    assert h.tracker.stats[cid(1)].misses == 1
    assert h.tracker.running()[0].slack_s(0.6) == pytest.approx(-0.05)
    h.poll(0.7, {100: GIB}, sm={100: 1.0})
    h.tracker.check_deadlines(0.8)
    h.poll(0.9, {})
    assert len(h.of("deadline_overrun")) == 1
    stats = h.tracker.stats[cid(1)]
    assert (stats.misses, stats.hits, stats.finished) == (1, 0, 1)
    assert h.tracker.recent[0].met_deadline is False


def test_exact_burst_past_its_deadline_is_a_miss_when_it_ends() -> None:
    # a one-shot program in burst mode (the default): seen to begin and to end, one task
    h = Harness(container(1, deadline_s=0.5))
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    for i in range(1, 10):  # started at 0.05; the kernel runs to 0.9, past its deadline
        h.poll(i / 10, {100: GIB}, sm={100: 1.0})
    (task,) = h.tracker.running()
    assert task.boundary == "open" and task.slack_s(0.9) < 0
    assert not task.overrun and not h.of("deadline_overrun")  # judged when it ends
    assert h.tracker.stats.get(cid(1)) is None
    h.poll(1.0, {})  # exited
    (done,) = h.tracker.recent
    assert done.boundary == "exact" and done.met_deadline is False
    assert h.of("task_ended")[0]["boundary"] == "exact"
    stats = h.tracker.stats[cid(1)]
    assert (stats.misses, stats.hits, stats.finished, stats.busy_periods) == (1, 0, 1, 0)
    assert h.tracker.histograms()["0"].count == 1


def test_overrun_between_polls_counts_at_the_end() -> None:
    h = Harness(container(1, deadline_s=0.1))
    h.own(1, 1, 1)
    h.poll(0.0, {})
    h.poll(0.1, {1: GIB}, sm={1: 1.0})  # started 0.05
    h.poll(0.15, {1: GIB}, sm={1: 1.0})  # elapsed 0.1: not past yet
    h.poll(0.35, {})  # ended 0.25 -> run 0.2 > 0.1
    assert h.tracker.stats[cid(1)].misses == 1 and not h.of("deadline_overrun")


def test_history_is_bounded_and_unattributed_tasks_have_no_counters() -> None:
    h = Harness(history=2)
    for i in range(4):
        h.own(10 + i, None, i)
        h.poll(i * 0.2, {10 + i: GIB})
        h.poll(i * 0.2 + 0.1, {})
    assert len(h.tracker.recent) == 2 and h.tracker.stats == {}
    assert h.tracker.recent[-1].task_id.startswith("-:13:")


def test_deadline_filled_in_when_the_container_index_catches_up() -> None:
    h = Harness()
    h.own(1, 1, 1)
    h.poll(0.0, {1: GIB})
    assert h.tracker.running()[0].deadline_s is None
    h.containers = {cid(1): container(1, deadline_s=3)}
    h.poll(0.1, {1: GIB})
    assert h.tracker.running()[0].deadline_s == 3


def test_histogram_and_forget_removed_containers() -> None:
    h = Harness(container(1, deadline_s=5))
    h.own(1, 1, 1)
    h.poll(-0.1, {})  # seen before it began: its start is real
    h.poll(0.0, {1: GIB}, sm={1: 0.5})  # started at -0.05
    h.poll(0.1, {1: GIB}, sm={1: 0.5})  # a whole sample period: its demand (the first began it)
    h.poll(0.4, {})  # exited at 0.25
    hist = h.tracker.histograms()["0"]
    assert hist.count == 1 and hist.total == pytest.approx(0.3)
    assert hist.buckets[1] == 0 and hist.buckets[2] == 1 and hist.buckets[-1] == 1
    assert h.tracker.demand == {cid(1): 0.5}
    h.tracker.forget_containers({})
    assert h.tracker.stats == {} and h.tracker.demand == {}


# --- demand and bounded memory ---------------------------------------------------------------


def test_demand_learns_from_tasks_computing_alone_only() -> None:
    h = Harness(container(1), container(2))
    h.own(1, 1, 1)
    h.own(2, 2, 2)
    h.poll(0.0, {1: GIB}, sm={1: 0.4})
    h.poll(0.1, {1: GIB}, sm={1: 0.4})
    h.poll(0.2, {})
    assert h.tracker.demand[cid(1)] == pytest.approx(0.4)
    h.poll(1.0, {1: GIB, 2: GIB}, sm={1: 0.5, 2: 0.5})  # time-slicing: 0.5 says nothing
    h.poll(1.1, {1: GIB, 2: GIB}, sm={1: 0.5, 2: 0.5})
    h.poll(1.2, {})
    assert h.tracker.demand[cid(1)] == pytest.approx(0.4) and cid(2) not in h.tracker.demand
    h.poll(2.0, {1: GIB}, sm={1: 0.8})  # only the period it began in: says nothing either
    h.poll(2.1, {})
    assert h.tracker.demand[cid(1)] == pytest.approx(0.4)
    h.poll(3.0, {1: GIB}, sm={1: 0.8})
    h.poll(3.1, {1: GIB}, sm={1: 0.8})
    h.poll(3.2, {})
    assert h.tracker.demand[cid(1)] == pytest.approx(0.3 * 0.8 + 0.7 * 0.4)


def test_a_task_that_runs_on_and_on_stands_for_its_demand_meanwhile() -> None:
    # a busy server's one long busy period never ends: its own samples alone say what it
    # needs, once there are enough of them; a learnt demand stays the one shown
    h = Harness(container(1))
    h.own(1, 1, 1)
    for i in range(RUNNING_DEMAND_SAMPLES):
        assert cid(1) not in h.tracker.demand_view()
        h.poll(0.1 * i, {1: GIB}, sm={1: 0.4})
    h.poll(0.1 * RUNNING_DEMAND_SAMPLES, {1: GIB}, sm={1: 0.4})
    assert h.tracker.demand_view()[cid(1)] == pytest.approx(0.4)
    assert cid(1) not in h.tracker.demand


def test_the_longest_of_its_last_runs_is_kept_beside_the_mean() -> None:
    # one process, one task per process: runs of 0.2, 0.6 and 0.2 s (polls 0.1 s apart)
    h = Harness(container(1))
    t = 0.0
    for n, polls in enumerate((2, 6, 2)):
        pid = 100 + n
        h.own(pid, 1, pid)
        for i in range(polls + 1):
            h.poll(t + 0.1 * i, {pid: GIB}, sm={pid: 1.0})
        h.poll(t + 0.1 * (polls + 1), {})
        t += 2.0
    typical, longest = h.tracker.typical_run[cid(1)], h.tracker.longest_run()[cid(1)]
    runs = [r.run_s for r in h.tracker.recent if r.run_s is not None]
    assert len(runs) == 3 and longest == pytest.approx(max(runs))
    assert typical < longest  # the mean of a heavy tail leaves too little slack
    assert longest > 2 * min(runs)
    h.tracker.forget_containers({})
    assert h.tracker.longest_run() == {}


def test_tables_stay_bounded_under_process_and_container_churn() -> None:
    # issue 9: ~290 B per process forever
    h = Harness(history=8)
    t = 0.0
    for n in range(3000):
        h.containers = {cid(n % 50 + 1): container(n % 50 + 1)}  # containers come and go
        h.own(10_000 + n, n % 50 + 1, n)
        h.poll(t, {10_000 + n: GIB}, sm={10_000 + n: 0.5})
        h.poll(t + 0.1, {10_000 + n: GIB}, sm={10_000 + n: 0.5})
        h.poll(t + 0.2, {})
        h.tracker.forget_containers(h.containers)
        t += 0.3
    sizes = h.tracker.table_sizes()
    assert sizes == {
        "processes": 0,
        "stats": 1,
        "demand": 1,
        "typical_run": 1,
        "runs": 1,
        "histograms": 1,
        "probe_marks": 0,
        "leaving": 0,
        "recent": 8,
    }
    assert h.tracker.stats[cid(2999 % 50 + 1)].finished > 0


def test_time_paused_and_resumes_per_container() -> None:
    # what the dashboards show of a best-effort container: how long frozen, how often thawed
    running, paused = (
        container(1, class_label=PriorityClass.BEST_EFFORT),
        container(1, state="paused", class_label=PriorityClass.BEST_EFFORT),
    )
    h = Harness(running)
    for t, info in ((0.0, running), (0.1, paused), (0.2, paused), (0.3, running),
                    (0.4, paused), (0.5, running), (0.6, running)):  # fmt: skip
        h.containers = {info.id: info}
        h.poll(t, {})
    stats = h.tracker.stats[cid(1)]
    assert stats.paused_s == pytest.approx(0.3) and stats.resumes == 2
    h.containers = {}
    h.poll(0.7, {})
    h.tracker.forget_containers({})
    assert cid(1) not in h.tracker.stats
