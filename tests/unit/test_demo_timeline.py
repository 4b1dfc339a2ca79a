"""The demo's timeline: lanes from the workloads' logs and the exporter's pause events."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuguard.demo.stack.scenario import RequestResult, ScenarioResult, StepResult, TaskResult
from gpuguard.demo.timeline import Bar, draw, lanes, pause_spans, step_bars


def event(kind: str, ts: float, name: str = "rt") -> dict[str, object]:
    return {"type": kind, "ts": ts, "container": name}


def test_pauses_pair_up_and_an_open_one_ends_with_the_run() -> None:
    events = [
        event("container_resumed", 9.0, "other"),  # resumed without a pause seen: ignored
        event("container_paused", 1.0),
        event("task_started", 1.5),
        event("container_resumed", 2.0),
        event("container_paused", 3.0),
        event("container_paused", 3.5),  # a repeat while paused: the first counts
    ]
    assert pause_spans(events, until=5.0) == {"rt": [(1.0, 2.0), (3.0, 5.0)]}


def test_training_steps_merge_into_runs_of_device_time() -> None:
    steps = [StepResult("t", i, 0.0, 0.04 * (i + 1)) for i in range(5)]
    steps.append(StepResult("t", 5, 1.0, 1.04))  # thawed after a pause: a new bar
    assert step_bars(steps) == [Bar(0.0, 0.2, None), Bar(1.0, 1.04, None)]


def test_lanes_hold_tasks_requests_and_steps_with_their_deadlines() -> None:
    result = ScenarioResult(
        "managed",
        released_at=100.0,
        tasks=(TaskResult("rt", 0, 1, 100.0, 103.0, None, None, None, 2.0),),
        requests=(RequestResult("srv", 0, 101.0, 101.1, 101.6, 101.1, 101.5, 1.0),),
        steps=(StepResult("train", 0, 100.0, 100.05),),
    )
    panel = lanes(result, ["rt", "srv", "train"], {"train": [(101.05, 101.6)]})
    rt, srv, train = panel.lanes
    assert rt.bars == (Bar(100.0, 103.0, False),) and rt.deadlines == (102.0,)
    assert srv.bars == (Bar(101.0, 101.6, True),) and srv.deadlines == (102.0,)
    assert train.bars == (Bar(100.0, 100.05, None),) and train.pauses == ((101.05, 101.6),)
    assert panel.origin == 100.0


def test_draw_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = ScenarioResult(
        "unmanaged", 0.0, (TaskResult("rt", 0, 1, 0.0, 1.0, None, None, None, 2.0),)
    )
    panel = lanes(result, ["rt"], {"rt": [(0.2, 0.4)]})
    line = draw(tmp_path / "t.png", "a scene", [panel, panel])
    assert line == f"timeline: {tmp_path / 't.png'}"
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
