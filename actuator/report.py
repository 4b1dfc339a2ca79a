"""What one trigger led to: the actions and skips a webhook caller gets back as JSON.

``Reporter`` makes it from a decision and what the executor did with each step, and counts
and audits it on the way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.decision import Decision, Skip, Step
from gpuguard.actuator.execution.executor import Outcome
from gpuguard.actuator.metrics import ActuatorMetrics
from gpuguard.contract import Result, TriggerSource

log = logging.getLogger("gpuguard.actuator")

SKIP_AUDIT_EVERY_S = 30.0


@dataclass
class Report:
    """What one trigger led to (returned to webhook callers as JSON)."""

    actions: list[dict[str, Any]] = field(default_factory=list)
    skips: list[dict[str, Any]] = field(default_factory=list)
    docker_down: bool = False
    exporter_down: bool = False

    def merge(self, other: Report) -> None:
        self.actions += other.actions
        self.skips += other.skips
        self.docker_down |= other.docker_down
        self.exporter_down |= other.exporter_down

    def to_doc(self) -> dict[str, Any]:
        return {"actions": self.actions, "skips": self.skips}


class Reporter:
    """Counts each step's outcome and each skip, audits the skips, and says it all as a
    ``Report``. Not thread-safe: the controller calls it under its lock."""

    def __init__(self, audit: AuditLog, metrics: ActuatorMetrics) -> None:
        self.audit = audit
        self.metrics = metrics
        self._skip_audited: dict[tuple[str, str], float] = {}

    def report(
        self, decision: Decision, outcomes: Sequence[Outcome], source: TriggerSource
    ) -> Report:
        """The report of ``decision`` whose steps ended as ``outcomes``."""
        report = Report()
        for step, outcome in zip(decision.steps, outcomes, strict=True):
            self._count(outcome)
            report.docker_down |= outcome.engine_down
            report.actions.append(_step_doc(step, outcome))
        for skip in decision.skips:
            self._audit_skip(skip, source)  # counts it too, once per audit interval
            report.skips.append(
                {"reason": skip.reason, "detail": skip.detail, "task_id": skip.task_id}
            )
        return report

    def _count(self, outcome: Outcome) -> None:
        self.metrics.actions.labels(outcome.action, outcome.result).inc()
        if outcome.result == Result.SKIPPED:
            self.metrics.skip(outcome.skip_reason)

    def _audit_skip(self, skip: Skip, source: TriggerSource) -> None:
        # The same skip recurs on every event while a task runs: audit it once a while.
        key = (skip.reason, skip.task_id or skip.container_id or skip.detail)
        now = time.monotonic()
        if now - self._skip_audited.get(key, -1e9) < SKIP_AUDIT_EVERY_S:
            return
        self._skip_audited[key] = now
        # Counted when audited: a skip recurs on every event while its task runs, and the
        # counter should say how often the policy held back, not how often it was asked.
        self.metrics.skip(skip.reason)
        if len(self._skip_audited) > 4096:
            self._skip_audited = {k: v for k, v in self._skip_audited.items() if now - v < 60}
        self.audit.write(
            "skip",
            trigger=source,
            reason=skip.reason,
            detail=skip.detail,
            container_id=skip.container_id,
            task_id=skip.task_id,
            gpu=skip.gpu,
        )


def _step_doc(step: Step, outcome: Outcome) -> dict[str, Any]:
    return {
        "action": step.verb,
        "container": step.container,
        "container_id": step.container_id,
        "reason": step.reason,
        "result": outcome.result,
        "skip_reason": outcome.skip_reason,
    }


def log_decision(
    source: TriggerSource,
    report: Report,
    times: tuple[float, float, float, float, float],
    event_ts: float | None,
) -> None:
    """One line per decision that did something, with where its time went."""
    t_wait, t0, t_state, t_decided, done = times
    log.info(
        "%s decision: %s in %.1f ms (lock %.1f, state %.1f, decide %.1f, act %.1f)%s",
        source,
        ", ".join(f"{a['action']} {a['container']}={a['result']}" for a in report.actions),
        1000 * (done - t0),
        1000 * (t0 - t_wait),
        1000 * (t_state - t0),
        1000 * (t_decided - t_state),
        1000 * (done - t_decided),
        "" if event_ts is None else f"; event->done {1000 * (time.time() - event_ts):.1f} ms",
    )
