"""Deciding on busy and idle edges before the state read: the last state with the edges
applied (pure), the decision it gives, and when the controller declines to use it."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuguard.actuator import controller as controller_module
from gpuguard.actuator.decision import PAUSE, UNPAUSE, Decision, Recent
from gpuguard.actuator.edgestate import with_edges
from gpuguard.actuator.state import Event
from gpuguard.contract import EventType
from tests.unit.actuator_support import make_controller
from tests.unit.policy_support import NOW, acts, cid, container, seen, state, task
from tests.unit.test_actuator_policy_edges import beside, ours, run, with_slack


def busy(name: str, ts: float = NOW, source: str | None = "launch") -> Event:
    return Event(7, ts, EventType.GPU_BUSY, container_id=cid(name), source=source)


def idle(
    name: str, ts: float = NOW, since: float | None = None, source: str | None = "launch"
) -> Event:
    return Event(8, ts, EventType.GPU_IDLE, container_id=cid(name), source=source, busy_since=since)


def test_a_busy_edge_makes_its_container_busy_with_a_kernel_in_flight() -> None:
    before = beside(rt_busy=False, last=(NOW - 2, NOW - 1))
    after = with_edges(before, [busy("r", NOW - 0.003), busy("r", NOW - 0.001)])
    assert after is not None and after.seq == before.seq
    activity = after.container(cid("r")).activity  # type: ignore[union-attr]
    assert activity is not None and activity.busy and activity.in_flight
    assert activity.busy_since == NOW - 0.003
    assert after.container(cid("t")) == before.container(cid("t"))


def test_the_edge_decides_as_a_fresh_state_showing_it_would() -> None:
    edged = with_edges(beside(rt_busy=False, last=(NOW - 2, NOW - 1)), [busy("r")])
    assert edged is not None
    d = run(edged)
    assert acts(d) == [(PAUSE, "t")] and d.steps[0].reason == "best_effort"


def test_a_container_not_yet_seen_by_the_probe_is_seen_by_its_first_edge() -> None:
    before = state([container("r", deadline=2.0)], [])
    after = with_edges(before, [busy("r", source="gauge")])
    assert after is not None
    activity = after.container(cid("r")).activity  # type: ignore[union-attr]
    assert activity is not None and activity.source == "gauge" and activity.busy


def test_a_first_request_before_any_task_freezes_on_the_edge() -> None:
    # the server's start-up is over (its process holds memory on GPU 0, no task running or
    # recent), the probe has not seen it yet: its first launch freezes the trainer at once
    r = container("r", deadline=2.0)
    r["devices"] = [{"gpu": 0, "mig_index": None}]
    before = state([r, container("t", klass="best-effort")], [task("t", "computing", 2)])
    assert acts(run(before)) == []
    edged = with_edges(before, [busy("r")])
    assert edged is not None
    d = run(edged)
    assert acts(d) == [(PAUSE, "t")] and d.steps[0].reason == "best_effort"


@pytest.mark.parametrize(
    "events",
    [
        [],
        [busy("r"), idle("r", source=None)],  # an edge that does not say where it came from
        [idle("r"), Event(9, NOW, EventType.TASK_ENDED, container_id=cid("r"))],
        [Event(8, NOW, EventType.TASK_STARTED, container_id=cid("r"))],
        [busy("new")],  # a container the last read did not show
        [idle("new")],
        [busy("r", source=None)],  # an exporter that does not say where the edge came from
    ],
)
def test_nothing_is_assumed_beyond_edges_of_containers_seen_exactly(
    events: list[Event],
) -> None:
    assert with_edges(beside(rt_busy=False), events) is None


def test_an_idle_edge_ends_its_containers_busy_period_at_the_edge() -> None:
    before = beside(rt_busy=True)  # busy since NOW - 0.01
    after = with_edges(before, [idle("r", NOW - 0.002, since=NOW - 0.009)])
    assert after is not None
    activity = after.container(cid("r")).activity  # type: ignore[union-attr]
    assert activity is not None and not activity.busy and not activity.in_flight
    assert activity.busy_since is None and activity.last_task == (NOW - 0.009, NOW - 0.002)
    # an exporter that does not send the period's start: the one the last read showed
    after = with_edges(before, [idle("r", NOW - 0.002)])
    assert after is not None
    assert after.container(cid("r")).activity.last_task == (NOW - 0.01, NOW - 0.002)  # type: ignore[union-attr]


def test_a_containers_edges_in_one_batch_apply_in_order() -> None:
    before = beside(rt_busy=False, last=(NOW - 2, NOW - 1))
    ended = with_edges(before, [idle("r", NOW - 0.001), busy("r", NOW - 0.005)])
    assert ended is not None
    activity = ended.container(cid("r")).activity  # type: ignore[union-attr]
    assert activity is not None and not activity.busy
    assert activity.last_task == (NOW - 0.005, NOW - 0.001)
    again = with_edges(before, [busy("r", NOW - 0.005), idle("r", NOW - 0.003), busy("r", NOW)])
    assert again is not None
    activity = again.container(cid("r")).activity  # type: ignore[union-attr]
    assert activity is not None and activity.busy and activity.busy_since == NOW
    assert activity.last_task == (NOW - 0.005, NOW - 0.003)


def test_the_idle_edge_thaws_as_a_fresh_state_showing_it_would() -> None:
    # the server 12 ms into a gap, with slack for the trainer's 40 ms step: thawed at once
    fresh = with_slack(0.5, 0.3, idle_for=0.012)
    last_read = with_slack(0.5, 0.3, idle_for=0.0)
    r = last_read.container(cid("r"))
    assert r is not None and r.activity is not None
    last_read = replace(last_read, containers=tuple(
        replace(c, activity=replace(r.activity, busy=True, busy_since=NOW - 0.1, in_flight=True))
        if c.id == cid("r") else c
        for c in last_read.containers
    ))  # fmt: skip
    recent = Recent(freeze_s=0.002)
    busy_read = run(last_read, ours("t"), recent)  # busy: at most the floor's duty cycle
    assert all(step.reason != "realtime_idle" for step in busy_read.steps)
    edged = with_edges(last_read, [idle("r", NOW - 0.012, since=NOW - 0.112)])
    assert edged is not None
    expected = run(fresh, ours("t"), recent)
    d = run(edged, ours("t"), recent)
    assert acts(d) == acts(expected) == [(UNPAUSE, "t")]
    assert d.steps[0].reason == expected.steps[0].reason == "realtime_idle"


def test_the_controller_decides_on_the_last_read_with_the_edges_and_reads_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporter is nowhere: a state read would raise."""
    given: list[Any] = []

    def decide(st: Any, *_args: Any, **_kwargs: Any) -> Decision:
        given.append(st)
        return Decision()

    monkeypatch.setattr(controller_module, "decide", decide)
    controller = make_controller(tmp_path)
    controller.last_state = state([seen(container("r", deadline=2.0))], [])
    controller._state_read_at = time.monotonic()
    assert controller.decide_on_edges([busy("new")], NOW) is None
    assert controller.decide_on_edges([busy("r")], NOW) is not None
    assert len(given) == 1 and given[0].container(cid("r")).activity.busy
    controller._state_read_at = time.monotonic() - controller_module.EDGE_STATE_MAX_AGE_S - 1
    assert controller.decide_on_edges([busy("r")], NOW) is None, "too old a read"
    assert len(given) == 1
    controller.audit.close()
