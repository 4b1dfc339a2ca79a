"""Parsing workload logs into tasks, and paper B's scenario figures (pure)."""

from __future__ import annotations

import json

from gpuguard.demo.stack.scenario import ScenarioResult, parse_workload_log


def log(*events: tuple[str, int, float]) -> list[str]:
    return [json.dumps({"event": e, "run": r, "t": t, "pid": 7, "size": 8}) for e, r, t in events]


def test_complete_runs_become_tasks_and_incomplete_ones_are_left_out() -> None:
    lines = log(
        ("task_start", 0, 10.0),
        ("kernel_start", 0, 10.5),
        ("kernel_end", 0, 11.0),
        ("task_end", 0, 11.5),
        ("task_start", 1, 12.0),
    )
    tasks = parse_workload_log("rt-1", [*lines, ""], deadline_s=1.0)
    assert len(tasks) == 1
    assert tasks[0].run_s == 1.5
    assert tasks[0].kernel_start == 10.5
    assert tasks[0].met_deadline is False


def test_scenario_figures() -> None:
    a = parse_workload_log("a", log(("task_start", 0, 1.0), ("task_end", 0, 3.0)), 5.0)
    b = parse_workload_log("b", log(("task_start", 0, 1.0), ("task_end", 0, 5.0)), 3.0)
    c = parse_workload_log("c", log(("task_start", 0, 1.5), ("task_end", 0, 2.0)), None)
    result = ScenarioResult("x", released_at=1.0, tasks=(*a, *b, *c))
    assert result.total_s == 4.0
    assert result.mean_completion_s == (2.0 + 4.0 + 1.0) / 3
    assert result.hit_rate == 0.5
    assert ScenarioResult("empty", 0.0, ()).hit_rate is None
