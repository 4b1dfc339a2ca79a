"""The actuator's control loop: fresh state -> ``decide`` -> executor, under one lock.

Webhooks, the fast path and the maintenance loop all come through here, so decisions never
interleave. The controller composes the parts and holds the lock; the safety work is done
by collaborators it calls under that lock: ``NodeMarks`` (the node list, the journal's copy
and the Swarm label), ``FailOpen`` (when admission steps aside and everything is resumed:
the exporter unseen, or a ``resume_all`` alert firing for this node) and ``Reconciler``
(the journal against Docker, ``--max-pause``). Each alert's deliveries are put in order
first (``AlertOrder``): a late duplicate from a clustered Alertmanager is dropped.

SLO pressure (``protect_slo``, ``actuator/admission/slo.py``) is such a state too: while a real-time
container's SLO alert fires for this node, every decision freezes the best-effort
containers on its GPUs sooner and longer; when none of them can be frozen, the alert marks
the node like a ``mark_node`` alert.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuguard.actuator.admission.executor import Outcome, PauseExecutor
from gpuguard.actuator.admission.history import RecentHistory
from gpuguard.actuator.admission.policy import PAUSE, Action, Decision, Skip, Trigger, decide
from gpuguard.actuator.admission.slo import SloPressure
from gpuguard.actuator.alertorder import AlertOrder
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.config import Config
from gpuguard.actuator.errors import ExporterUnavailable, StateError
from gpuguard.actuator.exporter_client import ExporterClient
from gpuguard.actuator.metrics import ActuatorMetrics
from gpuguard.actuator.nodemarks.marks import NodeMarks
from gpuguard.actuator.nodemarks.nodelist import NodeMarker
from gpuguard.actuator.report import Report
from gpuguard.actuator.safety.failopen import FailOpen
from gpuguard.actuator.safety.journal import Journal
from gpuguard.actuator.safety.reconcile import Reconciler
from gpuguard.actuator.state import ExporterState
from gpuguard.actuator.timer import DueTimer
from gpuguard.actuator.webhook import Alert, WebhookMessage
from gpuguard.contract import AlertAction, Result, SkipReason, TriggerSource

log = logging.getLogger("gpuguard.actuator")

_SKIP_AUDIT_EVERY_S = 30.0
#: distinct ``node`` labels one webhook may ask admission for (a real group names one)
MAX_ADMISSION_NODES = 16
_DOCKER_CHECK_EVERY_S = 2.0
MAINTENANCE_DECISION_AFTER_S = 1.0


class Controller:
    """Owns the lock, the journal and the executor, and composes the node marks, failing
    open and reconciling; every public method is thread-safe."""

    def __init__(
        self,
        config: Config,
        exporter_factory: Callable[[], ExporterClient],
        executor: PauseExecutor,
        journal: Journal,
        audit: AuditLog,
        metrics: ActuatorMetrics,
        marker: NodeMarker | None,
        journal_lost: str | None = None,
    ) -> None:
        self.config = config
        self.exporter = exporter_factory()
        self.executor = executor
        self.journal = journal
        self.audit = audit
        self.metrics = metrics
        self._lock = threading.RLock()
        self._skip_audited: dict[tuple[str, str], float] = {}
        self._last_docker_check = 0.0
        self._last_decision = 0.0
        self.last_state: ExporterState | None = None
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="executor")
        self.order = AlertOrder.from_doc(journal.resolved_alerts, time.time())
        self.marks = NodeMarks(
            config.node_name,
            config.alerts_for(AlertAction.MARK_NODE),
            config.node_mark_ttl_s,
            config.dry_run,
            journal,
            self.order,
            audit,
            metrics,
            marker,
        )
        self.fail_open = FailOpen(
            config.node_name,
            config.node_mark_ttl_s,
            config.exporter_timeout_s,
            audit,
            metrics,
            restored=journal.fail_open,
        )
        self._saved_resolutions = 0
        self.reconciler = Reconciler(
            executor, journal, audit, config.max_pause_s, self._execute, journal_lost
        )
        #: real-time activity, best-effort freezes and holds: the policy's ``Recent``
        self.history = RecentHistory(config.policy)
        #: decides again when a hold, a share or a quantum falls due (``start_timer``)
        self.timer = DueTimer(self._timed_decision)
        #: protect_slo alerts firing for this node: devices whose best-effort work yields
        self.slo = SloPressure(config.node_name)

    def health(self) -> str:
        """``ok``, or ``degraded: <why>`` (the /healthz body)."""
        problems = []
        if self.reconciler.engine_error:
            problems.append(f"docker engine unreachable, retrying ({self.reconciler.engine_error})")
        if self.reconciler.journal_lost:
            problems.append(
                f"journal unreadable, pauses not yet undone ({self.reconciler.journal_lost})"
            )
        if self.fail_open.holding_open:
            problems.append("failing open: a resume_all alert fires for this node")
        if self.fail_open.exporter_overdue():
            problems.append("exporter unreachable: failing open")
        return "degraded: " + "; ".join(problems) if problems else "ok"

    # --- decisions -------------------------------------------------------------------

    def decide_now(
        self,
        source: TriggerSource,
        gpu: int | None = None,
        node: str | None = None,
        alert: str | None = None,
        event_ts: float | None = None,
        state: ExporterState | None = None,
    ) -> Report:
        """Read fresh state (unless given), decide and execute; raises ExporterUnavailable."""
        t_wait = time.monotonic()
        with self._lock:
            t0 = time.monotonic()
            if state is None:
                state = self.fetch_state()
            t_state = time.monotonic()
            now = time.time()
            trigger = Trigger(source, now, node=node, gpu=gpu, alert=alert)
            self.history.saw(state, now)
            recent = self.history.snapshot(now)
            ledger = self.journal.ledger()
            pressure = self.slo.devices(state)
            decision = decide(state, trigger, self.config.policy, ledger, recent, pressure)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "%s decision: tasks %s, straight on %s, actions %s", source,
                    [(t.container, t.phase, t.paused) for t in state.tasks],
                    sorted(c[:12] for c in recent.straight_on),
                    [(a.container, a.kind, a.reason) for a in decision.actions],
                )  # fmt: skip
            if self.fail_open.holding_open:
                decision = _without_pauses(decision)
            t_decided = time.monotonic()
            report = self._execute(decision, source)
            if gpu is None:  # a decision for one GPU does not know every device's due time
                self.timer.at(decision.next_due)
            done = time.monotonic()
            # Each managed container's live check, before its first pause needs it.
            self.executor.vet(
                [c.id for c in state.containers if c.managed and not c.role and not c.paused]
            )
            self._last_decision = done
            self.metrics.decision_seconds.labels(source).observe(done - t0)
            if decision.actions:
                log.info(
                    "%s decision: %s in %.1f ms (lock %.1f, state %.1f, decide %.1f, act %.1f)%s",
                    source,
                    ", ".join(
                        f"{a['action']} {a['container']}={a['result']}" for a in report.actions
                    ),
                    1000 * (done - t0),
                    1000 * (t0 - t_wait),
                    1000 * (t_state - t0),
                    1000 * (t_decided - t_state),
                    1000 * (done - t_decided),
                    ""
                    if event_ts is None
                    else f"; event->done {1000 * (time.time() - event_ts):.1f} ms",
                )
            return report

    def start_timer(self) -> None:
        """Start deciding when holds, shares and quanta fall due."""
        self.timer.start()

    def _timed_decision(self) -> None:
        try:
            self.decide_now(TriggerSource.TIMER)
        except (ExporterUnavailable, StateError) as exc:
            log.debug("timed decision: no fresh state: %s", exc)

    def fetch_state(self) -> ExporterState:
        try:
            state = self.exporter.state()
        except (ExporterUnavailable, StateError):
            self.metrics.exporter_up.set(0)
            raise
        self.exporter_ok()
        self.last_state = state
        return state

    def exporter_ok(self) -> None:
        """Any successful exchange with the exporter (the fast path reports its own)."""
        self.fail_open.exporter_ok()
        self.metrics.exporter_up.set(1)

    def _execute(self, decision: Decision, source: TriggerSource) -> Report:
        report = Report()
        actions = decision.actions
        if len(actions) > 1:
            outcomes = self.executor.execute_many(actions, source, self._pool)
        else:
            outcomes = [self.executor.execute(a, source) for a in actions]
        self.history.observe(
            decision, [(a, o.result) for a, o in zip(actions, outcomes, strict=True)], time.time()
        )
        for action, outcome in zip(actions, outcomes, strict=True):
            self._count(outcome)
            report.docker_down |= outcome.engine_down
            if outcome.engine_down:
                self.reconciler.engine_failed(outcome.detail)
            report.actions.append(_action_doc(action, outcome))
        for skip in decision.skips:
            self._audit_skip(skip, source)  # counts it too, once per audit interval
            report.skips.append(
                {"reason": skip.reason, "detail": skip.detail, "task_id": skip.task_id}
            )
        self.metrics.paused_containers.set(len(self.journal.paused))
        return report

    def _count(self, outcome: Outcome) -> None:
        self.metrics.actions.labels(outcome.action, outcome.result).inc()
        if outcome.result == Result.SKIPPED:
            self.metrics.skip(outcome.skip_reason)

    def _audit_skip(self, skip: Skip, source: TriggerSource) -> None:
        # The same skip recurs on every event while a task runs: audit it once a while.
        key = (skip.reason, skip.task_id or skip.container_id or skip.detail)
        now = time.monotonic()
        if now - self._skip_audited.get(key, -1e9) < _SKIP_AUDIT_EVERY_S:
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

    # --- webhooks ----------------------------------------------------------------------

    def handle_webhook(self, message: WebhookMessage) -> Report:
        """Act on one Alertmanager POST (see the module doc of ``actuator.http``)."""
        report = Report()
        now = time.time()
        fresh = []
        with self._lock:
            for alert in message.alerts:
                if self.order.fresh(alert, now):
                    fresh.append(alert)
                else:
                    self.metrics.skip(SkipReason.STALE_ALERT)
                    report.skips.append({"reason": SkipReason.STALE_ALERT, "alert": alert.name})
        partial = len(fresh) < len(message.alerts)
        message = dataclasses.replace(message, alerts=tuple(fresh))
        by_action: dict[str, list[Alert]] = {}
        for alert in message.alerts:
            action = self.config.actions.get(alert.name)
            if action is None:
                self.metrics.skip(SkipReason.IRRELEVANT_ALERT)
                report.skips.append({"reason": SkipReason.IRRELEVANT_ALERT, "alert": alert.name})
                continue
            by_action.setdefault(action, []).append(alert)
        for alert in by_action.get(AlertAction.RECORD, []):
            self.audit.write(
                "alert", alertname=alert.name, status=alert.status, labels=dict(alert.labels)
            )
        slo_marks: frozenset[str] = frozenset()
        if AlertAction.PROTECT_SLO in by_action:
            slo_report, message, partial = self._protect_slo(message, partial, now)
            report.merge(slo_report)
            slo_marks = self.config.alerts_for(AlertAction.PROTECT_SLO)
        if AlertAction.MARK_NODE in by_action or slo_marks or self.marks.pending:
            report.merge(self._update_nodes(message, partial, slo_marks))
        report.merge(self._fail_open_alert(by_action.get(AlertAction.RESUME_ALL, []), now))
        report.merge(self._admission(by_action.get(AlertAction.ADMISSION, [])))
        return report

    def save_alerts(self) -> None:
        """Journal the resolved episodes (of every alert, whatever its action) and the
        firing resume_all alerts when the journal's copy is behind, before acting on them
        matters after a restart."""
        with self._lock:
            if self.order.resolutions == self._saved_resolutions and not self.fail_open.unsaved():
                return
            self.journal.set_alerts(self.order.to_doc(time.time()), self.fail_open.to_doc())
            self._saved_resolutions = self.order.resolutions
            self.fail_open.saved()

    def _protect_slo(
        self, message: WebhookMessage, partial: bool, now: float
    ) -> tuple[Report, WebhookMessage, bool]:
        """Take a webhook's protect_slo alerts: renew or end the SLO pressure, decide for this
        node at once, and return the message as the node list should read it: of the firing
        protect_slo alerts, only those with nothing on their GPUs that could be frozen."""
        report = Report()
        slo = self.config.alerts_for(AlertAction.PROTECT_SLO)
        ours = [a for a in message.alerts if a.name in slo]
        with self._lock:
            if self.slo.apply(ours, now):
                log.info("SLO pressure: %s", self.slo.to_doc() or "none")
                self.audit.write("slo_pressure", alerts=self.slo.to_doc())
            try:
                state = self.fetch_state()
                report.merge(
                    self.decide_now(TriggerSource.WEBHOOK, alert=ours[0].name, state=state)
                )
                unrelieved = self.slo.unrelieved(state)
            except (ExporterUnavailable, StateError) as exc:
                log.warning("protect_slo: no fresh state, nothing done: %s", exc)
                report.exporter_down = True
                unrelieved, partial = set(), True  # marks stay as they are
        kept = tuple(
            a
            for a in message.alerts
            if a.name not in slo or not a.firing or a.fingerprint in unrelieved
        )
        return report, dataclasses.replace(message, alerts=kept), partial

    def _fail_open_alert(self, alerts: list[Alert], now: float) -> Report:
        """Enter, renew or leave the fail-open state for this node's resume_all alerts."""
        with self._lock:
            why = self.fail_open.on_alerts(alerts, now, bool(self.journal.paused))
            self.save_alerts()  # before acting: a restart must find it failing open
            if why is None:
                return Report()
            return self.resume_all(why, TriggerSource.WEBHOOK)

    def _admission(self, alerts: list[Any]) -> Report:
        report = Report()
        targets, dropped = admission_targets(alerts)
        if dropped:
            log.warning("webhook names %d nodes too many: ignored", dropped)
            report.skips.append(
                {
                    "reason": SkipReason.IRRELEVANT_ALERT,
                    "detail": f"{dropped} more nodes than one webhook may name",
                }
            )
        for node, gpu, name in targets:
            try:
                report.merge(self.decide_now(TriggerSource.WEBHOOK, gpu=gpu, node=node, alert=name))
            except (ExporterUnavailable, StateError) as exc:
                log.warning("webhook %s: no fresh state, nothing done: %s", name, exc)
                report.exporter_down = True
        return report

    def _update_nodes(
        self, message: WebhookMessage, partial: bool = False, also: frozenset[str] = frozenset()
    ) -> Report:
        """``also``: more alert names that mark the node (protect_slo's, where unrelieved)."""
        with self._lock:
            return self.marks.update(message, partial, also)

    def apply_node_mark(self) -> Report:
        """Make the Swarm label (if any) match the node list; safe to call any time."""
        with self._lock:
            return self.marks.apply()

    def node_doc(self) -> dict[str, Any]:
        """The ``/api/v1/nodes`` document (the swarm node id is at most a few seconds old)."""
        return self.marks.doc()

    # --- safety ------------------------------------------------------------------------

    def resume_all(self, why: str, source: TriggerSource) -> Report:
        """Fail open: unpause every container this actuator paused."""
        with self._lock:
            decision = self.fail_open.resume_all(list(self.journal.paused.values()), why)
            return self._execute(decision, source)

    def maintain(self) -> None:
        """Periodic safety work: fail open, --max-pause, reconcile with Docker and state."""
        try:
            state: ExporterState | None = self.fetch_state()
        except (ExporterUnavailable, StateError) as exc:
            state = None
            why = self.fail_open.on_exporter_down(str(exc))
            if why is not None:
                self.resume_all(why, TriggerSource.RECONCILE)
        with self._lock:
            self.reconciler.enforce_max_pause()
            now = time.monotonic()
            if now - self._last_docker_check >= _DOCKER_CHECK_EVERY_S:
                self._last_docker_check = now
                self.reconciler.reconcile(state)
            # A safety net for missed events; the fast path normally decides first.
            quiet = time.monotonic() - self._last_decision > MAINTENANCE_DECISION_AFTER_S
            if state is not None and self.config.mode != "webhook" and quiet:
                self.decide_now(TriggerSource.RECONCILE, state=state)
            self.marks.expire(time.time())
            self.fail_open.expire(time.time())
            self.save_alerts()
            self._expire_slo(time.time(), state)
            if self.marks.pending:
                self.marks.apply()
            self.metrics.paused_containers.set(len(self.journal.paused))

    def _expire_slo(self, now: float, state: ExporterState | None) -> None:
        expired = self.slo.expire(now, self.config.node_mark_ttl_s)
        if not expired:
            return
        log.warning("SLO alert(s) not renewed within the mark TTL: pressure ends")
        self.audit.write("slo_pressure", alerts=self.slo.to_doc(), why="not renewed")
        if state is not None:  # thaw what the pressure alone held, even in webhook mode
            self.decide_now(TriggerSource.RECONCILE, state=state)

    def reconcile(self, state: ExporterState | None) -> None:
        """Settle the journal against Docker: forget what is gone, resume what must go; and
        when a resume_all alert fired as the last actuator stopped, resume what it held."""
        with self._lock:
            self.reconciler.reconcile(state)
            if self.fail_open.holding_open and self.journal.paused:
                self.resume_all(
                    "a resume_all alert fires (from the journal)", TriggerSource.RECONCILE
                )
            if state is not None:
                self.history.forget({c.id for c in state.containers})


def admission_targets(
    alerts: list[Any], max_nodes: int = MAX_ADMISSION_NODES
) -> tuple[list[tuple[str | None, int | None, str]], int]:
    """(node, gpu, alert name) to decide for, one per node, and how many nodes were dropped.

    Linear in the alerts. Alerts for several GPUs of one node, or for the node as a whole,
    become one decision for the whole node (it covers every GPU), so a webhook naming
    12,000 GPUs costs one state read, not 12,000.
    """
    gpus: dict[str | None, set[int | None]] = {}
    names: dict[str | None, str] = {}
    for alert in alerts:
        if alert.firing:
            node = alert.labels.get("node")
            gpus.setdefault(node, set()).add(alert.gpu)
            names.setdefault(node, alert.name)
    targets = [
        (node, next(iter(wanted)) if len(wanted) == 1 else None, names[node])
        for node, wanted in gpus.items()
    ]
    return targets[:max_nodes], max(0, len(targets) - max_nodes)


def _without_pauses(decision: Decision) -> Decision:
    """While failing open: the decision's unpauses stand, its pauses become skips."""
    held = tuple(
        Skip(SkipReason.FAIL_OPEN, "failing open", a.container_id, a.task_id, a.gpu)
        for a in decision.actions
        if a.kind == PAUSE
    )
    kept = tuple(a for a in decision.actions if a.kind != PAUSE)
    return Decision(kept, decision.skips + held)


def _action_doc(action: Action, outcome: Outcome) -> dict[str, Any]:
    return {
        "action": action.kind,
        "container": action.container,
        "container_id": action.container_id,
        "reason": action.reason,
        "result": outcome.result,
        "skip_reason": outcome.skip_reason,
    }
