"""The demo's timeline: lanes from the workloads' logs and the actuator's audit log, laid
out so that a person reads them at a glance (requests apart, each deadline on its own
request's row, a trainer's steps and frozen spans visible)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuguard.demo.stack.scenario import RequestResult, ScenarioResult, StepResult, TaskResult
from gpuguard.demo.timeline import (
    Bar,
    Rate,
    draw,
    frozen_spans,
    lanes,
    pack_rows,
    request_bars,
    step_rates,
)


def action(
    kind: str, ts: float, name: str = "train", result: str = "ok", **more: Any
) -> dict[str, Any]:
    return {"event": "action", "action": kind, "ts": ts, "container": name, "result": result,
            **more}  # fmt: skip


def test_frozen_spans_run_from_the_freeze_to_the_thaw_and_an_open_one_to_the_end() -> None:
    audit = [
        action("unpause", 0.5, "other"),  # thawed without a freeze seen: ignored
        action("pause", 1.0, frozen=0.98),  # frozen at 0.98, recorded at 1.0
        {"event": "runtime_pause", "ts": 1.1, "container": "train", "engine": "docker"},
        action("unpause", 2.0, started=1.95),
        action("pause", 3.0, result="failed"),  # not frozen: no span
        action("pause", 3.5),
        action("pause", 3.7, result="already"),
        {"event": "skip", "ts": 3.8, "reason": "cap"},
    ]
    assert frozen_spans(reversed(audit), until=5.0) == {"train": [(0.98, 1.95), (3.5, 5.0)]}


def test_pack_rows_puts_overlapping_spans_on_different_rows_and_reuses_free_ones() -> None:
    assert pack_rows([(0, 2), (1, 3), (2, 4), (3.5, 5), (5, 6)]) == [0, 1, 0, 1, 0]
    assert pack_rows([]) == []


def request(i: int, arrival: float, start: float, end: float) -> RequestResult:
    return RequestResult("srv", i, arrival, start, end, None, None, 3.0)


def test_requests_are_numbered_alternate_and_never_cross_another_s_deadline_line() -> None:
    # back to back: #2 arrives while #1 is served; #3 comes after #1's deadline (t=3)
    bars = request_bars([request(1, 0.5, 1.0, 1.6), request(0, 0.0, 0.0, 1.0),
                         request(2, 3.2, 3.2, 3.5)])  # fmt: skip
    assert [b.label for b in bars] == ["1", "2", "3"]
    assert [b.shade for b in bars] == [0, 1, 0]
    assert [b.row for b in bars] == [0, 1, 0]  # #2 would sit on #1's line out to t=3
    assert [b.deadline for b in bars] == [3.0, 3.5, 6.2]
    assert bars[1] == Bar(0.5, 1.6, True, row=1, deadline=3.5, served=1.0, label="2", shade=1)
    # every deadline tick is on its own request's row, and no bar on that row covers it
    for bar in bars:
        assert bar.deadline is not None
        others = [b for b in bars if b is not bar and b.row == bar.row]
        assert not any(b.start <= bar.deadline <= b.end for b in others)


def test_a_training_loop_s_steps_are_counted_per_bin_gaps_included() -> None:
    steps = [StepResult("t", i, 0.04 * i, 0.04 * (i + 1)) for i in range(10)]  # 0 to 0.4
    steps += [StepResult("t", 10 + i, 1.2 + 0.1 * i, 1.3 + 0.1 * i) for i in range(3)]
    assert step_rates(steps, bin_s=0.5) == [Rate(0.0, 0.5, 10), Rate(0.5, 1.0, 0),
                                            Rate(1.0, 1.5, 2), Rate(1.5, 2.0, 1)]  # fmt: skip
    assert step_rates([]) == []


def test_lanes_hold_tasks_requests_and_steps_with_their_own_deadlines() -> None:
    result = ScenarioResult(
        "managed",
        released_at=100.0,
        tasks=(TaskResult("rt", 0, 1, 100.0, 103.0, None, None, None, 2.0),),
        requests=(RequestResult("srv", 0, 101.0, 101.1, 101.6, 101.1, 101.5, 1.0),
                  RequestResult("srv", 1, 101.2, 101.6, 101.9, None, None, 1.0)),
        steps=(StepResult("train", 0, 100.0, 100.05),),
    )  # fmt: skip
    panel = lanes(result, ["rt", "srv", "train"], {"train": [(101.05, 101.6)]})
    rt, srv, train = panel.lanes
    assert rt.bars == (Bar(100.0, 103.0, False, deadline=102.0),) and rt.rows == 1
    assert srv.rows == 2 and srv.deadlines == (102.0, 102.2)
    assert [(b.label, b.row, b.served) for b in srv.bars] == [("1", 0, 101.1), ("2", 1, 101.6)]
    assert train.bars == () and train.rates == (Rate(100.0, 100.5, 1),)
    assert train.pauses == ((101.05, 101.6),)
    assert panel.origin == 100.0


def test_draw_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = ScenarioResult(
        "unmanaged", 0.0, (TaskResult("rt", 0, 1, 0.0, 1.0, None, None, None, 2.0),),
        requests=(request(0, 0.0, 0.2, 0.8), request(1, 0.5, 0.8, 1.4)),
        steps=tuple(StepResult("train", i, 0.04 * i, 0.04 * (i + 1)) for i in range(30)),
    )  # fmt: skip
    panel = lanes(result, ["rt", "srv", "train"], {"train": [(0.2, 0.4)]})
    line = draw(tmp_path / "t.png", "a scene", [panel, panel])
    assert line == f"timeline: {tmp_path / 't.png'}"
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
