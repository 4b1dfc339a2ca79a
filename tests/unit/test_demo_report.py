"""The demo's report explains itself: one clock (t from each run's release) for every time
it prints, no trailing spaces, and a word when the live table is off."""

from __future__ import annotations

from typing import Any

import pytest

from gpuguard.demo import scenes
from gpuguard.demo.scenes import Run
from gpuguard.demo.stack.scenario import RequestResult, ScenarioResult, StepResult, TaskResult

RELEASE = 1_000.0


def _task(name: str, start: float, end: float, deadline: float | None) -> TaskResult:
    return TaskResult(name, 0, 1, RELEASE + start, RELEASE + end, None, None, None, deadline)


def _event(kind: str, at: float, name: str) -> dict[str, Any]:
    return {"type": kind, "ts": RELEASE + at, "container": name}


def _runs() -> dict[str, Run]:
    tasks = (_task("rt-1", 0.5, 4.0, 9.0), _task("batch", 2.0, 3.0, None))
    return {
        "unmanaged": Run(ScenarioResult("unmanaged", RELEASE, tasks), []),
        "managed": Run(
            ScenarioResult("managed", RELEASE, tasks),
            [_event("container_paused", 2.25, "rt-2"), _event("container_resumed", 4.5, "rt-2")],
        ),
    }


def test_every_time_counts_from_the_release_and_says_so() -> None:
    lines = scenes.paper_b_report(_runs())
    assert "managed run: 1 pauses, 1 resumes (t from release)" in lines
    # the first pause is at t = 2.25 s after the release, not at 0 (its own first event)
    assert "  t=  2.25s  container_paused   rt-2" in lines
    assert "  t=  4.50s  container_resumed  rt-2" in lines
    header = next(line for line in lines if line.startswith("unmanaged: tasks"))
    assert "t from release" in header
    assert any("rt-1" in line and "t=0.50s" in line and "t=4.00s" in line for line in lines)
    assert "t = 0 when its workloads were released" in " ".join(scenes.CLOCK)


def test_no_report_row_ends_in_a_space() -> None:
    runs = _runs()
    request = RequestResult("server", 0, RELEASE + 1, RELEASE + 1, RELEASE + 1.6, None, None, 3.0)
    step = StepResult("trainer", 0, RELEASE + 1, RELEASE + 1.04)
    for run in runs.values():
        run.result = ScenarioResult(
            run.result.name, RELEASE, (), requests=(request,), steps=(step,)
        )
    lines = scenes.paper_b_report(_runs()) + scenes.colocation_report(runs)
    assert [line for line in lines if line != line.rstrip()] == []


class _Done:
    def running(self) -> bool:
        return False


def test_without_a_terminal_the_demo_says_why_there_is_no_live_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    scenes.live_view("http://127.0.0.1:9", _Done(), "paper-b managed")  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "output is not a terminal, so no live table" in out
