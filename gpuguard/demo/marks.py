"""The node's marks during the demo, from the actuator's audit log, for the report.

A mark (``mark_node``) says the node may take no new real-time container; it lasts while
one of its alerts fires, which can be long after the runs that raised it. The report lists
each mark on the clock of the run it fell in, how long it lasted, in plain words what its
alerts watch and where their runbook is, and for a mark still set, whose misses hold it and
until about when. Pure, but for ``alert_exprs``.
"""

from __future__ import annotations

import glob
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuguard import loader
from gpuguard.contract import Verb
from gpuguard.demo.compare import wrap
from gpuguard.resources import RULE_FILES_GLOB

RUNBOOKS = "docs/runbooks.md"
CANNOT_GUARANTEE = "GpuguardNodeCannotGuaranteeDeadlines"
#: the window of CANNOT_GUARANTEE's ratio (``gpuguard:node_deadline_guarantee_ratio:5m``)
GUARANTEE_WINDOW_S = 300.0
#: Each alert that may mark the node, in plain words: what it watches and when it clears.
MARK_ALERTS = {
    CANNOT_GUARANTEE: (
        "fewer than 90% of the tasks with a deadline that finished on the node in the last 5 "
        "minutes met it (an unmanaged run's misses count as much as any), or a paused task "
        "waited over 30 s; it clears once the misses are 5 minutes old"
    ),
    "GpuguardTaskDeadlineAtRisk": (
        "a running task had under a fifth of its deadline left, or was past it; it clears "
        "when that task ends"
    ),
    "GpuguardNodeInStateZero": (
        "the node record said state 0: tasks missed their deadline in its last 30 s, a kernel "
        "ran nearly all of the busy window, or GPU memory was 95% full; it clears when the "
        "reason goes"
    ),
    "GpuguardSloAtRisk": (
        "a tenant's latency SLO was at risk and no best-effort container could be frozen for "
        "it; it clears when the SLO recovers"
    ),
    "GpuguardSloViolated": (
        "a tenant's latency SLO was violated and no best-effort container could be frozen for "
        "it; it clears when the SLO recovers"
    ),
}


@dataclass(frozen=True)
class Mark:
    """One spell of the node marked: set, cleared (None: still marked), and why."""

    set_at: float
    cleared_at: float | None
    reasons: tuple[str, ...]
    detail: str | None  # how it was executed (no swarm: the node list only)


def node_marks(audit: Iterable[Mapping[str, Any]], still: Sequence[str] = ()) -> list[Mark]:
    """The audit log's ``mark_node``/``unmark_node`` actions paired up, in time order.

    ``still``: the alerts that mark the node now (the actuator's ``/api/v1/nodes``), joined
    to a mark still open: the audit records a mark's reasons only when it is set, and an
    alert that fires later keeps it set."""
    marks: list[Mark] = []
    open_mark: Mark | None = None
    actions = [r for r in audit if r.get("event") == "action"]
    for record in sorted(actions, key=lambda r: float(r["ts"])):
        if record.get("action") == Verb.MARK_NODE:
            reasons = tuple(record.get("reasons") or ())
            if open_mark is None:
                open_mark = Mark(float(record["ts"]), None, reasons, record.get("detail"))
            else:  # marked again while marked (a retry): the first holds, reasons join
                both = open_mark.reasons + tuple(r for r in reasons if r not in open_mark.reasons)
                open_mark = Mark(open_mark.set_at, None, both, open_mark.detail)
        elif record.get("action") == Verb.UNMARK_NODE and open_mark is not None:
            marks.append(Mark(open_mark.set_at, float(record["ts"]), open_mark.reasons,
                              open_mark.detail))  # fmt: skip
            open_mark = None
    if open_mark is not None:
        more = tuple(r for r in dict.fromkeys(still) if r not in open_mark.reasons)
        marks.append(Mark(open_mark.set_at, None, open_mark.reasons + more, open_mark.detail))
    return marks


def marked_by(nodes_doc: Mapping[str, Any]) -> list[str]:
    """The alerts that mark the node now, from the actuator's ``/api/v1/nodes``."""
    return [r["alertname"] for node in nodes_doc.get("nodes", []) for r in node.get("reasons", [])]


def on_clock(at: float, releases: Sequence[tuple[str, float]]) -> str:
    """``at`` on the report's clock: t from the release of the last run released by then
    (the first run's, before any)."""
    name, released = releases[0]
    for candidate, t0 in releases:
        if t0 <= at:
            name, released = candidate, t0
    return f"{name} t={at - released:.2f}s"


def mark_lines(
    marks: Sequence[Mark],
    releases: Sequence[tuple[str, float]],
    now: float,
    misses: Sequence[tuple[str, float]] = (),
) -> list[str]:
    """The report's lines on the node's marks; ``now`` is when the report was written,
    ``misses`` each task the exporter counted as a miss: its run's name and its end."""
    lines = ["Node marks (the actuator's audit log; t from the named run's release)"]
    if not marks:
        return [*lines, "  none: the node stayed open to new real-time containers throughout"]
    for mark in marks:
        why = ", ".join(mark.reasons) or "(reasons not recorded)"
        lines += wrap(f"marked at {on_clock(mark.set_at, releases)}, by {why}")
        if mark.cleared_at is None:
            lines += wrap(
                f"still marked when the report was written ({on_clock(now, releases)}): "
                f"{now - mark.set_at:.1f} s so far; gpuguard nodes shows it now",
                "    ",
            )
            if CANNOT_GUARANTEE in mark.reasons:
                lines += wrap(still_marked_because(misses, now), "    ")
        else:
            lines.append(
                f"    cleared at {on_clock(mark.cleared_at, releases)}: lasted "
                f"{mark.cleared_at - mark.set_at:.1f} s"
            )
        if mark.detail:
            lines.append(f"    ({mark.detail})")
    reasons = sorted({r for mark in marks for r in mark.reasons})
    lines += wrap(
        "A mark lasts while one of its alerts fires, however long after the run that raised "
        f"it. What each alert means and what to do: {RUNBOOKS}" + (":" if reasons else ".")
    )
    for name in reasons:
        plain = MARK_ALERTS.get(name, "(not an alert the shipped rules mark the node for)")
        lines += wrap(f"{name}: {plain} ({RUNBOOKS}#{name.lower()})", "    ")
    return lines


def still_marked_because(misses: Sequence[tuple[str, float]], now: float) -> str:
    """Why the node is still marked "cannot guarantee deadlines", whose misses hold it, and
    until about when (if no task misses meanwhile)."""
    recent = [(run, ended) for run, ended in misses if ended > now - GUARANTEE_WINDOW_S]
    if not recent:
        return (
            "why: no task the exporter judged here missed in the last 5 minutes, so a task "
            "paused over 30 s holds it; it clears when that task runs"
        )
    counts = Counter(run for run, _ in recent)
    whose = ", ".join(f"{run} {n}" for run, n in counts.items())
    until = max(ended for _, ended in recent) + GUARANTEE_WINDOW_S
    at = time.strftime("%H:%M:%S UTC", time.gmtime(until))
    unmanaged_only = all(run.endswith("unmanaged") for run in counts)
    blame = (
        " All in unmanaged runs, which share the GPU with no admission: the node says so to "
        "the placer and the scheduler; the managed runs missed none."
        if unmanaged_only
        else ""
    )
    return (
        f"why: of the tasks judged against a deadline in the last 5 minutes fewer than 90% "
        f"met it; the exporter counted {len(recent)} missed (by run: {whose}).{blame} It "
        f"clears by itself about {until - now:.0f} s after the report (near {at}), 5 minutes "
        "after the last miss, if no task misses meanwhile"
    )


def alert_exprs(pattern: str = RULE_FILES_GLOB) -> dict[str, str]:
    """Each shipped alert's expression, on one line."""
    out: dict[str, str] = {}
    for path in sorted(glob.glob(pattern)):
        doc = loader.read_yaml(path, "rules file") or {}
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                if "alert" in rule:
                    out[rule["alert"]] = " ".join(str(rule["expr"]).split())
    return out
