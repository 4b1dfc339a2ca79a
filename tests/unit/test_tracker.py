from __future__ import annotations

from collections.abc import Mapping

import pytest

from gpuguard.exporter.events import EventLog
from gpuguard.exporter.join import join
from gpuguard.exporter.model import ContainerInfo, ProcessOwner
from gpuguard.exporter.tracker import DRAIN_AFTER_S, Tracker
from tests.unit.exporter_fakes import GIB, cid, container, sample

CTX = 300 * 2**20  # context base memory, as gpusim and a real CUDA context show


class Harness:
    """Feeds a tracker one poll at a time, like the poller does."""

    def __init__(self, *containers: ContainerInfo, history: int = 16) -> None:
        self.events = EventLog(1000)
        self.tracker = Tracker(self.events, history)
        self.containers = {c.id: c for c in containers}
        self.owners: dict[int, ProcessOwner] = {}

    def own(self, pid: int, container_n: int | None, ticks: int) -> None:
        self.owners[pid] = ProcessOwner(cid(container_n) if container_n else None, ticks)

    def poll(
        self, t: float, procs: Mapping[int, int | None], sm: Mapping[int, float] | None = None
    ) -> None:
        joined = join(sample(t, procs, sm), self.owners, self.containers)
        self.tracker.update(joined, t, self.containers)

    def types(self) -> list[str]:
        return [e["type"] for e in self.events.since(0).events]

    def of(self, type_: str) -> list[dict]:
        return [e for e in self.events.since(0).events if e["type"] == type_]


def test_life_cycle_phases_and_midpoint_times() -> None:
    h = Harness(container(1, deadline_s=10))
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: CTX})  # appears: started half-way between the polls
    (task,) = h.tracker.running()
    assert task.phase == "starting" and task.started_at == pytest.approx(0.05)
    assert task.task_id == f"{cid(1)[:12]}:100:5000:1"
    h.poll(0.2, {100: CTX + GIB})
    assert h.tracker.running()[0].phase == "input"
    h.poll(0.3, {100: CTX + 2 * GIB}, sm={100: 1.0})
    assert h.tracker.running()[0].phase == "computing"
    h.poll(0.4, {100: CTX + 2 * GIB})  # one poll without a sample: still computing
    assert h.tracker.running()[0].phase == "computing"
    h.poll(0.31 + DRAIN_AFTER_S, {100: CTX + 2 * GIB})
    assert h.tracker.running()[0].phase == "draining"
    h.poll(0.9, {100: CTX + 2 * GIB})
    h.poll(1.0, {})  # gone: ended half-way
    assert h.tracker.running() == ()
    (done,) = h.tracker.recent
    assert done.ended_at == pytest.approx(0.95) and done.run_s == pytest.approx(0.9)
    assert done.phase == "ended" and done.met_deadline is True
    assert [e["phase"] for e in h.of("task_phase")] == ["input", "computing", "draining"]
    assert h.types()[0] == "task_started" and h.types()[-1] == "task_ended"
    assert h.tracker.stats[cid(1)].finished == 1 and h.tracker.stats[cid(1)].hits == 1
    ended = h.of("task_ended")[0]
    assert ended["run_s"] == pytest.approx(0.9) and ended["container"] == "rt-1"


def test_first_poll_uses_its_own_time() -> None:
    h = Harness(container(1))
    h.own(1, 1, 1)
    h.poll(7.0, {1: CTX})
    assert h.tracker.running()[0].started_at == 7.0


def test_pid_reuse_is_a_new_task() -> None:
    h = Harness(container(1), container(2))
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: GIB})
    h.own(100, 2, 9000)  # the pid now belongs to a new process in another container
    h.poll(0.2, {100: GIB})
    (task,) = h.tracker.running()
    assert task.container_id == cid(2) and task.proc_start_ticks == 9000
    assert task.task_id.endswith(":100:9000:1")
    assert h.tracker.recent[0].container_id == cid(1)


def test_repeated_runs_in_one_process_are_separate_tasks() -> None:
    h = Harness(container(1))
    h.own(100, 1, 5000)
    ids = []
    t = 0.0
    for _ in range(3):
        h.poll(t, {100: GIB})
        ids.append(h.tracker.running()[0].task_id)
        h.poll(t + 0.1, {})
        t += 0.2
    assert [i.rsplit(":", 1)[1] for i in ids] == ["1", "2", "3"]
    assert len(h.tracker.recent) == 3 and h.tracker.stats[cid(1)].finished == 3


def test_free_and_realloc_is_two_tasks() -> None:
    h = Harness(container(1))
    h.own(100, 1, 5000)
    h.poll(0.0, {100: GIB})
    h.poll(0.1, {100: 0})  # memory back to 0: ended (paper B), process stays listed
    assert h.tracker.running() == () and len(h.tracker.recent) == 1
    h.poll(0.2, {100: 0})  # idle: still no task
    assert h.tracker.running() == ()
    h.poll(0.3, {100: GIB})  # allocates again: a second task
    (task,) = h.tracker.running()
    assert task.task_id.endswith(":2") and task.started_at == pytest.approx(0.25)


def test_zero_memory_at_first_sight_is_not_a_task_and_none_is() -> None:
    h = Harness(container(1))
    h.own(1, 1, 1)
    h.own(2, 1, 2)
    h.poll(0.0, {1: 0, 2: None})
    assert [t.pid for t in h.tracker.running()] == [2]


def test_overrun_counted_while_running_exactly_once() -> None:
    h = Harness(container(1, deadline_s=0.5))
    h.own(100, 1, 5000)
    h.poll(0.0, {})
    h.poll(0.1, {100: GIB})  # started at 0.05
    h.poll(0.5, {100: GIB})
    assert h.of("deadline_overrun") == []
    h.poll(0.6, {100: GIB})  # elapsed 0.55 > 0.5: overrun now, while it runs
    assert len(h.of("deadline_overrun")) == 1 and h.tracker.running()[0].overrun
    assert h.tracker.stats[cid(1)].misses == 1
    assert h.tracker.running()[0].slack_s(0.6) == pytest.approx(-0.05)
    h.poll(0.7, {100: GIB})
    h.tracker.check_deadlines(0.8)
    h.poll(0.9, {})
    assert len(h.of("deadline_overrun")) == 1
    stats = h.tracker.stats[cid(1)]
    assert (stats.misses, stats.hits, stats.finished) == (1, 0, 1)
    assert h.tracker.recent[0].met_deadline is False


def test_overrun_between_polls_counts_at_the_end() -> None:
    h = Harness(container(1, deadline_s=0.1))
    h.own(1, 1, 1)
    h.poll(0.0, {})
    h.poll(0.1, {1: GIB})  # started 0.05
    h.poll(0.15, {1: GIB})  # elapsed 0.1: not past yet
    h.poll(0.35, {})  # ended 0.25 -> run 0.2 > 0.1
    assert h.tracker.stats[cid(1)].misses == 1 and not h.of("deadline_overrun")


def test_order_is_process_start_then_first_seen() -> None:
    h = Harness(container(1), container(2))
    h.own(900, 1, 100)  # high pid, started first (pids wrap)
    h.own(5, 2, 200)
    h.poll(0.0, {5: GIB})
    h.poll(0.1, {5: GIB, 900: GIB})
    assert [t.pid for t in h.tracker.running()] == [900, 5]


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
    h.poll(0.0, {1: GIB})
    h.poll(0.4, {})
    hist = h.tracker.histograms()["0"]
    assert hist.count == 1 and hist.total == pytest.approx(0.2)
    assert hist.buckets[0] == 0 and hist.buckets[1] == 1 and hist.buckets[-1] == 1
    h.tracker.forget_containers({})
    assert h.tracker.stats == {}
