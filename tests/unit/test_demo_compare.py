"""The demo's report sets the exporter's account of each task beside the workload's own and
says why they differ: computed from the two, never a fixed sentence."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuguard.demo import scenes
from gpuguard.demo.compare import (
    Agreement,
    SeenTask,
    agreement,
    explain,
    match,
    request_lines,
    requests_by_task,
    seen_tasks,
    step_lines,
)
from gpuguard.demo.scenes import Run
from gpuguard.demo.stack.scenario import RequestResult, ScenarioResult, StepResult, TaskResult

T0 = 1_000.0


def task(
    start: float, end: float, deadline: float | None = 6.4, output: float | None = None
) -> TaskResult:
    return TaskResult("rt", 0, 1, T0 + start, T0 + end, None, None, None, deadline,
                      None if output is None else T0 + output)  # fmt: skip


def seen(
    start: float, end: float, met: bool | None, boundary: str = "exact", name: str = "rt"
) -> SeenTask:
    return SeenTask(name, T0 + start, T0 + end, met, boundary)


def request(i: int, arrival: float, end: float, deadline: float = 3.0) -> RequestResult:
    return RequestResult("srv", i, T0 + arrival, T0 + arrival, T0 + end, None, None, deadline)


def test_recent_tasks_of_the_run_only_finished_and_by_start() -> None:
    recent: list[dict[str, Any]] = [
        {"container": "b", "started_at": 5.0, "ended_at": 6.0, "met_deadline": None,
         "boundary": "merged"},
        {"container": "a", "started_at": 1.0, "ended_at": 2.0, "met_deadline": True,
         "boundary": "exact"},
        {"container": "other-run", "started_at": 0.0, "ended_at": 1.0, "boundary": "exact"},
        {"container": "a", "started_at": 7.0, "ended_at": None, "boundary": "open"},
    ]  # fmt: skip
    assert seen_tasks(recent, {"a", "b"}) == [
        SeenTask("a", 1.0, 2.0, True, "exact"),
        SeenTask("b", 5.0, 6.0, None, "merged"),
    ]


def test_the_task_that_overlaps_most_is_the_match_and_a_start_up_context_never() -> None:
    mine = task(1.0, 5.0)
    candidates = [
        seen(0.0, 0.1, None, "no_kernel"),
        seen(0.2, 1.5, True),
        seen(1.5, 5.2, True),
        seen(1.0, 5.0, True, name="other"),
    ]
    assert match(mine, candidates) == candidates[2]
    assert match(mine, [seen(0.0, 0.1, None, "no_kernel")]) is None


def test_a_missed_copy_out_is_measured_and_can_turn_a_miss_into_a_hit() -> None:
    # the workload: 0.96 to 7.62 (6.66 s, over its 6.4 s); its kernel ended at 6.51
    mine = task(0.96, 7.62, 6.4, output=6.51)
    line = explain(mine, seen(1.01, 6.49, True))
    assert "ended 1.13 s before the workload, with its last kernel" in line
    assert "its 1.11 s output copy after that shows no SM activity" in line
    assert "so it counted a hit where the workload missed its 6.4 s deadline" in line


def test_agreement_late_start_late_end_and_no_task_each_say_their_own() -> None:
    assert explain(task(0.0, 2.0), seen(0.05, 2.1, True)) == (
        "why: start and end agree within 0.15 s (a poll and a sample's lag)"
    )
    late = explain(task(0.0, 2.0, output=1.9), seen(0.4, 2.6, True))
    assert "seen 0.40 s after it started" in late and "ended 0.60 s after it" in late
    early = explain(task(0.0, 2.0, output=None), seen(0.0, 1.5, True))
    assert "ended 0.50 s before the workload's own end" in early
    assert "the exporter saw no task of it" in explain(task(0.0, 2.0), None)
    assert "not judged: its boundary is merged" in explain(task(0, 2), seen(0, 2, None, "merged"))


def test_requests_go_to_the_exporter_task_they_overlap_most() -> None:
    requests = [request(0, 1.0, 1.5), request(1, 1.5, 2.2), request(2, 4.0, 4.3)]
    held, outside = requests_by_task(requests, [seen(0.9, 2.3, False, name="srv")])
    assert [r.id for r in held[0]] == [0, 1]
    assert [r.id for r in outside] == [2]


def prose(lines: Iterable[str]) -> str:
    """Folded report lines as one line of words."""
    return " ".join(" ".join(lines).split())


def _row(*cols: str) -> str:
    return " | ".join(cols)


def test_a_busy_span_of_several_requests_judged_as_one_is_explained() -> None:
    requests = [request(0, 1.0, 1.5), request(1, 1.5, 2.2), request(2, 5.0, 5.5)]
    tasks = [
        seen(0.0, 0.1, None, "no_kernel", "srv"),
        seen(0.95, 2.3, False, name="srv"),
        seen(4.95, 5.6, True, name="srv"),
    ]
    lines = request_lines("srv", requests, tasks, T0, _row)
    assert lines[0] == (
        "srv: 3 requests logged, 3 met their deadline; the exporter saw 2 tasks (t from release):"
    )
    assert "  task 1 | t=0.95s | t=2.30s | 1.35s | MISSED | #1-#2, 2 met" in lines
    assert "  task 2 | t=4.95s | t=5.60s | 0.65s | met | #3, 1 met" in lines
    assert any("1 start-up context" in line for line in lines)
    why = prose(line for line in lines if not line.startswith("  task"))
    assert "1 of its tasks hold several requests" in why
    assert "1 a miss though each of its requests met its own" in why


def test_a_server_whose_requests_were_each_a_task_says_so() -> None:
    lines = request_lines("srv", [request(0, 1.0, 1.5)], [seen(1.0, 1.5, True, name="srv")],
                          T0, _row)  # fmt: skip
    assert lines[-1] == "  why: each request the exporter saw was a task of its own"


def test_agreement_counts_each_own_verdict_against_the_exporter_task_that_judged_it() -> None:
    tasks = (
        task(0.0, 6.0),  # met its 6.4 s: the exporter says met
        TaskResult("late", 0, 2, T0, T0 + 7.0, None, None, None, 6.4),  # missed; seen met
        TaskResult("gone", 0, 3, T0, T0 + 1.0, None, None, None, 6.4),  # no exporter task
        TaskResult("free", 0, 4, T0, T0 + 9.0, None, None, None, None),  # no deadline
    )
    result = ScenarioResult("run", T0, tasks)
    seen_ = [seen(0.0, 6.0, True), seen(0.0, 6.3, True, name="late")]
    assert agreement(result, seen_) == Agreement(judged=2, differ=1, unseen=1)
    assert not agreement(result, seen_).agree
    assert agreement(ScenarioResult("run", T0, tasks[:1]), seen_).agree


def test_requests_in_merged_spans_are_not_judged_in_judged_spans_of_several_differ() -> None:
    requests = (
        request(0, 1.0, 1.5), request(1, 1.5, 2.2),  # one busy span
        request(2, 5.0, 5.5),  # a task of its own, met
        request(3, 8.0, 11.5),  # a task of its own: missed its 3 s, the exporter says met
        request(4, 20.0, 20.5),  # in no exporter task
    )  # fmt: skip
    startup = seen(0.0, 0.1, None, "no_kernel", "srv")
    own = [seen(4.95, 5.6, True, name="srv"), seen(10.9, 11.5, True, name="srv")]
    merged = ScenarioResult("run", T0, (), requests=requests)
    assert agreement(merged, [startup, seen(0.95, 2.3, None, "merged", "srv"), *own]) == (
        Agreement(judged=2, differ=1, merged=2, unseen=1)
    )
    judged = agreement(merged, [startup, seen(0.95, 2.3, True, name="srv"), *own])
    assert judged == Agreement(judged=4, differ=3, unseen=1)
    assert (Agreement(1, 0, 2, 0) + Agreement(3, 1, 0, 1)) == Agreement(4, 1, 2, 1)


def test_a_training_loop_is_one_busy_span_of_many_steps() -> None:
    steps = [StepResult("train", i, T0 + 0.04 * i, T0 + 0.04 * (i + 1)) for i in range(50)]
    lines = step_lines("train", steps, [seen(0.0, 2.1, None, "merged", "train")], T0)
    assert lines[0] == (
        "train: 50 steps logged; the exporter saw 1 task(s): t=0.00s to t=2.10s (merged)"
    )
    assert "up to 50 steps in one busy span" in prose(lines[1:])


def test_the_report_sets_the_exporter_row_under_each_task() -> None:
    result = ScenarioResult("unmanaged", T0, (task(0.96, 7.62, 6.4, output=6.51),))
    lines = scenes.format_result(result, [seen(1.01, 6.49, True)])
    rt = next(i for i, line in enumerate(lines) if line.startswith("  rt "))
    assert lines[rt].split() == ["rt", "t=0.96s", "t=7.62s", "6.66s", "6.4s", "MISSED"]
    assert lines[rt + 1].split() == ["exporter", "t=1.01s", "t=6.49s", "5.48s", "6.4s", "met"]
    assert lines[rt + 2].startswith("    why: ended 1.13 s before the workload")
    # without the exporter's tasks, the workloads' rows alone
    assert len(scenes.format_result(result)) == rt + 1


def test_scene_2_report_shows_the_exporter_view_of_each_run() -> None:
    result = ScenarioResult(
        "managed", T0, (), requests=(request(0, 1.0, 1.5),),
        steps=(StepResult("train", 0, T0, T0 + 0.04),),
    )  # fmt: skip
    seen_run = [seen(1.0, 1.5, True, name="srv"), seen(0.0, 0.04, None, "merged", "train")]
    runs = {"unmanaged": Run(result, [], seen_run), "managed": Run(result, [], seen_run)}
    text = "\n".join(scenes.colocation_report(runs))
    assert text.count("srv: 1 requests logged, 1 met their deadline") == 2
    assert text.count("train: 1 steps logged") == 2


def test_merged_is_defined_once_at_the_top_before_any_table_uses_it() -> None:
    """The report's header says what ``merged`` means; the tables after it use the word."""
    header = prose(scenes.report_header())
    assert "merged: a busy span that showed an idle inside it and went on" in header
    assert "never judges it against the deadline: neither a hit nor a miss" in header
    assert "met or MISSED, judged against the container's deadline" in header
    requests = [request(0, 1.0, 1.5), request(1, 1.9, 2.4)]
    merged = [seen(0.95, 2.5, None, "merged", "srv")]
    lines = request_lines("srv", requests, merged, T0, _row)
    assert "  task 1 | t=0.95s | t=2.50s | 1.55s | merged | #1-#2, 2 met" in lines
    assert "merged:" not in prose(lines)  # not said again under each table
    result = ScenarioResult("managed", T0, (task(1.0, 7.0),))
    assert "merged:" not in prose(scenes.format_result(result, [seen(1.0, 7.1, None, "merged")]))


def test_scene_1_means_only_the_tasks_with_a_deadline() -> None:
    """Issue 26: the mean completion averaged in the batch container, which has no deadline,
    and did not say so."""
    batch = TaskResult("batch", 0, 2, T0 + 2.0, T0 + 9.0, None, None, None, None)
    unmanaged = ScenarioResult("unmanaged", T0, (task(0.0, 6.0), task(0.0, 8.0), batch))
    managed = ScenarioResult("managed", T0, (task(0.0, 2.0), task(0.0, 4.0), batch))
    lines = scenes.compare(unmanaged, managed)
    rows = {line.split("  ")[1].strip(): line.split()[-4:] for line in lines[1:4]}
    assert rows["mean completion (2 with deadlines)"] == ["7.00s", "3.00s", "(57%", "lower)"]
    assert lines[1].split()[-2:] == ["9.00s", "9.00s"]  # the total time holds the batch
    assert lines[1].strip().startswith("total time (all 3 tasks)")
    assert lines[3].strip().startswith("deadline hit rate (2 with deadlines)")
    assert lines[-1] == "  (no deadline: the batch container's 1 task(s), in the total only)"
    alone = ScenarioResult("m", T0, (task(0.0, 2.0),))
    assert len(scenes.compare(alone, alone)) == 4  # no note without such a task
    worse = scenes.compare(managed, unmanaged)[2]  # a managed run may lose: said as such
    assert worse.split()[-2:] == ["(133%", "higher)"]
