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


def _container(cid: str, name: str, managed: bool, paused: bool = False) -> dict[str, Any]:
    return {"id": cid, "name": name, "managed": managed, "paused": paused, "deadline_s": 9.0}


def _state_task(cid: str, **more: Any) -> dict[str, Any]:
    return {"container_id": cid, "phase": "computing", "elapsed_s": 1.0, "slack_s": 8.0, **more}


def test_the_live_table_says_who_may_be_paused_and_keeps_each_finished_verdict() -> None:
    state = {
        "gpus": [{"utilization_ratio": 1.0}],
        "containers": [
            _container("a", "managed-batch", managed=False),
            _container("b", "managed-rt-1", managed=True, paused=True),
            _container("c", "managed-rt-2", managed=True),
            _container("d", "managed-server", managed=False),
            _container("e", "managed-rt-3", managed=True),
        ],
        "tasks": [_state_task("b", phase="input", slack_s=-0.04)],
        "recent": [
            _state_task("c", phase="ended", ended_at=5.0, run_s=3.0, met_deadline=True,
                        boundary="exact"),
            _state_task("c", phase="ended", ended_at=1.0, run_s=9.5, met_deadline=False,
                        boundary="exact"),
            _state_task("d", phase="ended", ended_at=4.0, run_s=2.0, met_deadline=None,
                        boundary="merged"),
            _state_task("e", phase="ended", ended_at=4.0, run_s=0.2, met_deadline=None,
                        boundary="no_kernel"),  # a start-up context: not a task
        ],
    }  # fmt: skip
    lines = scenes._table(state, "paper-b managed")
    rows = {line.split()[0]: line.split(maxsplit=1)[1] for line in lines[2:]}
    assert "STATE: managed, the actuator may pause it, or never paused" in lines[0]
    assert rows["managed-batch"].split() == ["9.0s", "-", "-", "-", "never", "paused"]
    assert rows["managed-server"].split() == ["9.0s", "ended,", "merged", "2.0s", "8.0s",
                                              "never", "paused"]  # fmt: skip
    assert rows["managed-rt-1"].split() == ["9.0s", "input", "1.0s", "0.0s", "PAUSED,", "managed"]
    # the newest finished task, with its verdict, once none runs
    assert rows["managed-rt-2"].split()[1:3] == ["ended,", "met"]
    assert rows["managed-rt-3"].split()[1] == "-"
    assert [line for line in lines if "unmanaged" in line or "-0.0s" in line] == []


def test_a_pause_before_the_release_is_explained() -> None:
    runs = _runs()
    assert not [line for line in scenes.pause_lines(runs["managed"]) if "t < 0" in line]
    runs["managed"].pauses.insert(0, _event("container_paused", -2.86, "managed-trainer"))
    lines = scenes.pause_lines(runs["managed"])
    assert "  t= -2.86s  container_paused   managed-trainer" in lines
    text = " ".join(" ".join(lines).split())
    assert "t < 0: before the release, while the containers started" in text
