"""The demo's report lists the node's marks from the actuator's audit log: when each was set
and cleared on the report's clock, how long it lasted, why, and what its alerts watch."""

from __future__ import annotations

from typing import Any

from gpuguard import loader
from gpuguard.demo.marks import (
    GUARANTEE_WINDOW_S,
    MARK_ALERTS,
    Mark,
    alert_exprs,
    mark_lines,
    marked_by,
    node_marks,
    on_clock,
)
from tests.readme import REPO

RULES_DIR = REPO / "rules"

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
        Mark(155.0, None, ("GpuguardNodeInStateZero", "GpuguardOther"), "engine not in a swarm"),
    ]
    lines = mark_lines(marks, RELEASES, now=390.0)
    text = " ".join(" ".join(lines).split())
    assert "marked at paper-b-unmanaged t=8.00s, by GpuguardNodeCannotGuaranteeDeadlines" in text
    assert "cleared at paper-b-managed t=10.50s: lasted 22.5 s" in text
    assert "marked at colocation t=5.00s, by GpuguardNodeInStateZero" in text
    assert "still marked when the report was written (colocation t=240.00s): 235.0 s so far" in text
    assert "(engine not in a swarm)" in text
    # plain words and the runbook, not PromQL
    assert "What each alert means and what to do: docs/runbooks.md" in text
    assert (
        "GpuguardNodeCannotGuaranteeDeadlines: fewer than 90% of the tasks with a deadline that "
        "finished on the node in the last 5 minutes met it"
    ) in text
    assert "(docs/runbooks.md#gpuguardnodecannotguaranteedeadlines)" in text
    assert "GpuguardOther: (not an alert the shipped rules mark the node for)" in text
    assert not [w for w in ("rate(", "increase(", "sum by", ":5m") if w in text]
    assert [line for line in lines if len(line) > 100 or line != line.rstrip()] == []


def test_a_mark_still_set_says_whose_misses_hold_it_and_until_when() -> None:
    """The unmanaged run's misses hold the mark for 5 minutes: the report says so, not the
    managed run that happened to be running when the alert fired."""
    marks = [Mark(121.0, None, ("GpuguardNodeCannotGuaranteeDeadlines",), None)]
    misses = [("paper-b-unmanaged", 107.0), ("paper-b-unmanaged", 108.6)]
    text = " ".join(" ".join(mark_lines(marks, RELEASES, 200.0, misses)).split())
    assert "marked at paper-b-managed t=1.00s" in text
    assert "the exporter counted 2 missed (by run: paper-b-unmanaged 2)" in text
    assert "the managed runs missed none" in text
    assert "clears by itself about 209 s after the report" in text  # 108.6 + 300 - 200
    assert "5 minutes after the last miss" in text
    both = [*misses, ("colocation-managed", 150.0)]
    text = " ".join(" ".join(mark_lines(marks, RELEASES, 200.0, both)).split())
    assert "colocation-managed 1" in text and "missed none" not in text
    old = [("paper-b-unmanaged", -200.0)]  # out of the 5 minutes: a paused task's wait holds it
    text = " ".join(" ".join(mark_lines(marks, RELEASES, 200.0, old)).split())
    assert "a task paused over 30 s holds it" in text


def test_no_marks_says_the_node_stayed_open() -> None:
    assert mark_lines([], RELEASES, 200.0)[-1] == (
        "  none: the node stayed open to new real-time containers throughout"
    )


def test_the_plain_words_cover_every_alert_that_marks_and_match_the_rules() -> None:
    actions = loader.read_yaml(RULES_DIR / "actions.yml", "actions")["actions"]
    marking = {a for a, verb in actions.items() if verb in ("mark_node", "protect_slo")}
    assert marking == set(MARK_ALERTS)
    exprs = alert_exprs()
    guarantee = exprs["GpuguardNodeCannotGuaranteeDeadlines"]
    assert "node_deadline_guarantee_ratio:5m < 0.9" in guarantee and ") > 30" in guarantee
    assert GUARANTEE_WINDOW_S == 5 * 60
    assert exprs["GpuguardNodeInStateZero"] == "max by (node) (gpuguard_node_state) == 0"
