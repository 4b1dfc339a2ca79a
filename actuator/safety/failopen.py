"""Failing open: when admission control steps aside and resumes what this actuator paused.

Why: docs/design-notes.md, "Failing open".
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import replace

from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.decision import PAUSE, UNPAUSE, Decision, Skip, Step
from gpuguard.actuator.metrics import ActuatorMetrics
from gpuguard.actuator.safety.journal import PausedEntry
from gpuguard.actuator.webhook import Alert
from gpuguard.contract import SkipReason, StepReason

log = logging.getLogger("gpuguard.actuator")

#: while the journal cannot be written, a resume that did not take is tried again this often
JOURNAL_RETRY_S = 5.0


class FailOpen:
    """Whether this actuator holds off, and why it resumes everything."""

    def __init__(
        self,
        node_name: str,
        mark_ttl_s: float,
        exporter_timeout_s: float,
        audit: AuditLog,
        metrics: ActuatorMetrics,
        restored: Mapping[str, float] | None = None,
        now: float | None = None,
    ) -> None:
        self.node_name = node_name
        self.mark_ttl_s = mark_ttl_s
        self.exporter_timeout_s = exporter_timeout_s
        self.audit = audit
        self.metrics = metrics
        #: monotonic time of the last successful exchange with the exporter
        self.last_exporter_ok = time.monotonic()
        self._exporter_lost = False
        #: fingerprint -> last delivery (epoch), of resume_all alerts firing for this node
        now = time.time() if now is None else now
        self._alerts: dict[str, float] = {
            fp: seen for fp, seen in (restored or {}).items() if now - seen <= mark_ttl_s
        }
        self._saved = dict(self._alerts)
        #: why the journal cannot be written, while it cannot; and when we last resumed
        self.journal_unwritable: str | None = None
        self._journal_resumed = -math.inf
        if self._alerts:
            log.warning("a resume_all alert fired when the actuator stopped: pausing nothing")

    @property
    def holding_open(self) -> bool:
        """True while a resume_all alert fires for this node: admission pauses nothing."""
        return bool(self._alerts)

    def for_this_node(self, alert: Alert) -> bool:
        """An alert names this node, or no node at all (a single-host Prometheus whose
        exporter target carries no ``node`` label): failing open is the safe reading."""
        node = alert.labels.get("node")
        return node is None or node == self.node_name

    def on_alerts(self, alerts: list[Alert], now: float, anything_paused: bool) -> str | None:
        """Enter, renew or leave the state for this node's resume_all alerts; why to resume
        everything now, or None."""
        ours = [a for a in alerts if self.for_this_node(a)]
        was_open = self.holding_open
        for alert in ours:
            if alert.firing:
                self._alerts[alert.fingerprint] = now
            else:
                self._alerts.pop(alert.fingerprint, None)
        if was_open and not self.holding_open:
            log.info("resume_all alerts resolved: admission control resumes")
            self.audit.write("fail_open_end", alerts=[a.name for a in ours])
        if not self.holding_open or (was_open and not anything_paused):
            return None  # nothing fires, or already open with nothing held
        names = sorted({a.name for a in ours if a.firing})
        return "alert " + ", ".join(names)

    def expire(self, now: float) -> None:
        """End the state for alerts no repeat renewed within the mark TTL (``unsaved`` then
        says the journal is behind)."""
        stale = [fp for fp, seen in self._alerts.items() if now - seen > self.mark_ttl_s]
        for fingerprint in stale:
            del self._alerts[fingerprint]
        if stale and not self._alerts:
            log.warning("fail-open alert not renewed within the mark TTL: admission resumes")
            self.audit.write("fail_open_end", why="not renewed within --node.mark-ttl")

    def to_doc(self) -> dict[str, float]:
        """The firing alerts, for the journal."""
        return dict(self._alerts)

    def unsaved(self) -> bool:
        """The journal's copy is behind: an alert came or went, or a renewal moved by more
        than a quarter of the TTL (duplicates and repeats cost no write)."""
        if self._alerts.keys() != self._saved.keys():
            return True
        slack = self.mark_ttl_s / 4
        return any(seen - self._saved[fp] > slack for fp, seen in self._alerts.items())

    def saved(self) -> None:
        self._saved = dict(self._alerts)

    def exporter_ok(self) -> None:
        """Any successful exchange with the exporter."""
        self.last_exporter_ok = time.monotonic()
        if self._exporter_lost:
            log.info("exporter reachable again: admission control resumes")
            self.audit.write("exporter_back")
            self._exporter_lost = False

    def exporter_overdue(self) -> bool:
        """The exporter has not answered within ``--exporter.timeout``."""
        return time.monotonic() - self.last_exporter_ok > self.exporter_timeout_s

    def on_exporter_down(self, why: str) -> str | None:
        """Why to resume everything now (once per outage, after the timeout), or None."""
        down_for = time.monotonic() - self.last_exporter_ok
        if down_for <= self.exporter_timeout_s or self._exporter_lost:
            return None
        self._exporter_lost = True
        log.warning("exporter unreachable for %.1fs (%s): failing open", down_for, why)
        self.metrics.fail_open.inc()
        return f"exporter unreachable for {down_for:.1f}s"

    def on_journal(self, unwritable: str | None, anything_paused: bool, now: float) -> str | None:
        """Enter, stay in or leave the state of a journal that cannot be written (``now``:
        monotonic); why to resume everything now, or None."""
        was = self.journal_unwritable
        self.journal_unwritable = unwritable
        if unwritable is None:
            if was is not None:
                log.info("the journal is written again: admission control resumes")
                self.audit.write("journal_writable")
            return None
        if was is None:
            log.warning(
                "cannot write the journal (%s): pausing nothing, resuming what this actuator "
                "paused, until it can be written", unwritable,
            )  # fmt: skip
        elif now - self._journal_resumed < JOURNAL_RETRY_S:
            return None  # resumed already; an unpause that failed is tried again in a while
        if not anything_paused:
            return None
        self._journal_resumed = now
        return f"journal unwritable ({unwritable})"

    def resume_all(self, paused: list[PausedEntry], why: str) -> Decision:
        """Unpause every container in ``paused`` (this actuator's journal); audited."""
        if paused:
            log.warning("resuming %d container(s) this actuator paused: %s", len(paused), why)
        self.audit.write("resume_all", why=why, containers=[e.container_id for e in paused])
        steps = [
            Step(UNPAUSE, e.container_id, e.name, StepReason.RESUME_ALL, e.gpu, e.task_id)
            for e in paused
        ]
        return Decision(tuple(steps))


def without_pauses(
    decision: Decision, reason: SkipReason = SkipReason.FAIL_OPEN, detail: str = "failing open"
) -> Decision:
    """While failing open: the decision's unpauses stand, its pauses become skips; what it
    saw (real-time devices, duty cycles) and when to decide again stand too."""
    held = tuple(
        Skip(reason, detail, s.container_id, s.task_id, s.gpu)
        for s in decision.steps
        if s.verb == PAUSE
    )
    kept = tuple(s for s in decision.steps if s.verb != PAUSE)
    return replace(decision, steps=kept, skips=decision.skips + held)
