"""The demo's report lists the node's marks from the actuator's audit log: when each was set
and cleared on the report's clock, how long it lasted, why, and what its alerts watch."""

from __future__ import annotations

from typing import Any

from gpuguard.demo.marks import Mark, alert_exprs, mark_lines, marked_by, node_marks, on_clock

RELEASES = [("paper-b-unmanaged", 100.0), ("paper-b-managed", 120.0), ("colocation", 150.0)]


def action(kind: str, ts: float, *reasons: str) -> dict[str, Any]:
    record: dict[str, Any] = {"event": "action", "action": kind, "ts": ts, "node": "vm",
                              "result": "skipped", "detail": "engine not in a swarm"}  # fmt: skip
    if reasons:
        record["reasons"] = list(reasons)
    return record


def test_marks_pair_with_their_unmarks_and_an_open_one_stays_open() -> None:
    audit = [
        action("unmark_node", 90.0),  # unmarked before any mark: nothing to pair
        {"event": "action", "action": "pause", "ts": 101.0, "container": "rt-2"},
        action("mark_node", 108.0, "GpuguardNodeCannotGuaranteeDeadlines"),
        action("mark_node", 109.0, "GpuguardNodeInStateZero"),  # again while marked
        action("unmark_node", 130.5),
        {"event": "skip", "ts": 140.0},
        action("mark_node", 155.0, "GpuguardTaskDeadlineAtRisk"),
    ]
    detail = "engine not in a swarm"
    assert node_marks(reversed(audit)) == [
        Mark(108.0, 130.5, ("GpuguardNodeCannotGuaranteeDeadlines", "GpuguardNodeInStateZero"),
             detail),
        Mark(155.0, None, ("GpuguardTaskDeadlineAtRisk",), detail),
    ]  # fmt: skip


def test_an_alert_that_fires_after_the_mark_is_joined_to_the_open_mark() -> None:
    audit = [action("mark_node", 108.0, "GpuguardNodeInStateZero")]
    nodes = {"nodes": [{"node": "vm", "provisionable": False, "reasons": [
        {"alertname": "GpuguardNodeInStateZero"},
        {"alertname": "GpuguardNodeCannotGuaranteeDeadlines"},
    ]}]}  # fmt: skip
    assert marked_by(nodes) == ["GpuguardNodeInStateZero", "GpuguardNodeCannotGuaranteeDeadlines"]
    [mark] = node_marks(audit, marked_by(nodes))
    assert mark.reasons == ("GpuguardNodeInStateZero", "GpuguardNodeCannotGuaranteeDeadlines")
    closed = node_marks([*audit, action("unmark_node", 110.0)], ["GpuguardNodeInStateZero"])
    assert closed[0].reasons == ("GpuguardNodeInStateZero",)


def test_a_moment_is_told_on_the_clock_of_the_run_it_fell_in() -> None:
    assert on_clock(108.0, RELEASES) == "paper-b-unmanaged t=8.00s"
    assert on_clock(120.0, RELEASES) == "paper-b-managed t=0.00s"
    assert on_clock(95.5, RELEASES) == "paper-b-unmanaged t=-4.50s"  # before any release
    assert on_clock(400.0, RELEASES) == "colocation t=250.00s"


def test_report_says_how_long_each_mark_lasted_and_why() -> None:
    marks = [
        Mark(108.0, 130.5, ("GpuguardNodeCannotGuaranteeDeadlines",), None),
        Mark(155.0, None, ("GpuguardNodeInStateZero",), "engine not in a swarm"),
    ]
    exprs = {"GpuguardNodeCannotGuaranteeDeadlines": "ratio:5m < 0.9"}
    lines = mark_lines(marks, RELEASES, now=390.0, exprs=exprs)
    text = " ".join(" ".join(lines).split())
    assert "marked at paper-b-unmanaged t=8.00s, by GpuguardNodeCannotGuaranteeDeadlines" in text
    assert "cleared at paper-b-managed t=10.50s: lasted 22.5 s" in text
    assert "marked at colocation t=5.00s, by GpuguardNodeInStateZero" in text
    assert "still marked when the report was written (colocation t=240.00s): 235.0 s so far" in text
    assert "(engine not in a swarm)" in text
    assert "GpuguardNodeCannotGuaranteeDeadlines: ratio:5m < 0.9" in text
    assert "GpuguardNodeInStateZero: (not in the shipped rules)" in text
    assert [line for line in lines if len(line) > 100 or line != line.rstrip()] == []


def test_no_marks_says_the_node_stayed_open() -> None:
    assert mark_lines([], RELEASES, 200.0, {})[-1] == (
        "  none: the node stayed open to new real-time containers throughout"
    )


def test_the_shipped_rules_give_each_mark_alert_its_expression() -> None:
    exprs = alert_exprs()
    assert "node_deadline_guarantee_ratio:5m < 0.9" in exprs["GpuguardNodeCannotGuaranteeDeadlines"]
    assert exprs["GpuguardNodeInStateZero"] == "max by (node) (gpuguard_node_state) == 0"
