"""The node's marks during the demo, from the actuator's audit log, for the report.

A mark (``mark_node``) says the node may take no new real-time container; it lasts while
one of its alerts fires, which can be long after the runs that raised it. The report lists
each mark on the clock of the run it fell in, how long it lasted, and what its alerts watch
(their expressions, read from the rules gpuguard ships). Pure, but for ``alert_exprs``.
"""

from __future__ import annotations

import glob
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuguard import loader
from gpuguard.contract import Verb
from gpuguard.demo.compare import wrap
from gpuguard.resources import RULE_FILES_GLOB


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
    exprs: Mapping[str, str],
) -> list[str]:
    """The report's lines on the node's marks; ``now`` is when the report was written."""
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
        else:
            lines.append(
                f"    cleared at {on_clock(mark.cleared_at, releases)}: lasted "
                f"{mark.cleared_at - mark.set_at:.1f} s"
            )
        if mark.detail:
            lines.append(f"    ({mark.detail})")
    reasons = sorted({r for mark in marks for r in mark.reasons})
    lines += wrap(
        "why so long: a mark lasts while one of its alerts fires, however long after the run "
        "that raised it; Alertmanager resolves an alert once its expression stops holding"
        + (":" if reasons else ".")
    )
    for name in reasons:
        lines += wrap(f"{name}: {exprs.get(name, '(not in the shipped rules)')}", "    ")
    return lines


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
