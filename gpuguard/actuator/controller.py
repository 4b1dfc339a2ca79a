"""The actuator's control loop: fresh state -> ``decide`` -> executor, under one lock.

Webhooks, the fast path, the timer and the maintenance loop all come through here, so
decisions never interleave. The controller composes the parts and calls them in order under
that lock; no part calls back into it. Its parts: docs/design-notes.md, "The controller".
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuguard.actuator.admission.history import RecentHistory
from gpuguard.actuator.admission.policy.decide import decide
from gpuguard.actuator.admission.slosignal import SloSignal
from gpuguard.actuator.alertorder import AlertOrder
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.config import Config
from gpuguard.actuator.decision import Decision, Trigger
from gpuguard.actuator.edgestate import with_edges
from gpuguard.actuator.errors import ExporterUnavailable, StateError
from gpuguard.actuator.execution.executor import PauseExecutor
from gpuguard.actuator.execution.reconcile import Reconciler
from gpuguard.actuator.exporter_client import ExporterClient
from gpuguard.actuator.metrics import ActuatorMetrics
from gpuguard.actuator.nodemarks.marks import NodeMarks
from gpuguard.actuator.nodemarks.nodelist import NodeMarker
from gpuguard.actuator.ratesteps import step_rates
from gpuguard.actuator.report import Report, Reporter, log_decision
from gpuguard.actuator.routing import Delivery, Handler, by_action
from gpuguard.actuator.safety.failopen import FailOpen, without_pauses
from gpuguard.actuator.safety.journal import Journal
from gpuguard.actuator.slo import SloProtection
from gpuguard.actuator.state import Event, ExporterState
from gpuguard.actuator.targets import admission_targets, dropped_report
from gpuguard.actuator.timer import DueTimer
from gpuguard.actuator.webhook import Alert, WebhookMessage
from gpuguard.contract import AlertAction, SkipReason, TriggerSource

log = logging.getLogger("gpuguard.actuator")

_DOCKER_CHECK_EVERY_S = 2.0
MAINTENANCE_DECISION_AFTER_S = 1.0
#: the oldest state read a decision on busy edges starts from (maintenance reads every 0.5 s)
EDGE_STATE_MAX_AGE_S = 2.0


class Controller:
    """Owns the lock, the journal and the executor, and composes the node marks, failing
    open, reconciling and SLO protection; every public method is thread-safe."""

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
        slo_signal: SloSignal | None = None,
    ) -> None:
        self.config = config
        self.exporter = exporter_factory()
        self.executor = executor
        self.journal = journal
        self.audit = audit
        self.metrics = metrics
        self._lock = threading.RLock()
        self._last_docker_check = 0.0
        self._last_decision = 0.0
        self.last_state: ExporterState | None = None
        self._state_read_at = 0.0  # monotonic time of last_state's read
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
        self.reporter = Reporter(audit, metrics)
        metrics.journal_writable.set_function(lambda: 0.0 if journal.unwritable else 1.0)
        #: real-time activity, best-effort freezes and holds: the policy's ``Recent``
        self.history = RecentHistory(config.policy)
        #: rate control's signal (None: no --prometheus.url, open loop)
        self.slo_signal = slo_signal
        #: decides again when a hold, a share or a quantum falls due (``start_timer``)
        self.timer = DueTimer(self._timed_decision)
        #: protect_slo alerts firing for this node: devices whose best-effort work yields
        self.slo = SloProtection(
            config.node_name,
            config.alerts_for(AlertAction.PROTECT_SLO),
            config.node_mark_ttl_s,
            audit,
        )
        #: each alert action's handler, called in this order on every webhook: protect_slo
        #: leaves mark_node the alerts it cannot relieve; resume_all saves the alert
        #: episodes to the journal before admission acts
        self.routes: dict[AlertAction, Handler] = {
            AlertAction.RECORD: self._on_record,
            AlertAction.PROTECT_SLO: self._on_protect_slo,
            AlertAction.MARK_NODE: self._on_mark_node,
            AlertAction.RESUME_ALL: self._on_resume_all,
            AlertAction.ADMISSION: self._on_admission,
        }

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
        if self.journal.unwritable:
            why = self.journal.unwritable
            problems.append(f"cannot write the journal ({why}): pausing nothing")
        for file, failing in sorted(self.journal.writes.failing().items()):
            if file != "journal":
                problems.append(f"cannot write the {file} ({failing.detail})")
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
            now = time.time()
            self.history.saw(state, now)
            step_rates(self.history.rates, self.slo_signal, state, now, self.metrics, self.audit)
            trigger = Trigger(source, now, node=node, gpu=gpu, alert=alert)
            decision, report = self._decide(state, trigger, (t_wait, t0), event_ts)
            if gpu is None:  # a decision for one GPU does not know every device's due time
                self.timer.at(decision.next_due)
            # Each managed container's live check, before its first pause needs it.
            self.executor.vet(
                [c.id for c in state.containers if c.managed and not c.role and not c.paused]
            )
            return report

    def decide_on_edges(self, events: Sequence[Event], event_ts: float) -> Report | None:
        """Decide at once on ``gpu_busy`` and ``gpu_idle`` edges, from the last state read
        with them applied (``with_edges``), without reading the state; None (nothing done)
        where that read is older than ``EDGE_STATE_MAX_AGE_S`` or the edges name what it
        does not show. The caller decides again on a fresh read."""
        t_wait = time.monotonic()
        with self._lock:
            t0 = time.monotonic()
            state = self.last_state
            if state is None or t0 - self._state_read_at > EDGE_STATE_MAX_AGE_S:
                return None
            edged = with_edges(state, events)
            if edged is None:
                return None
            trigger = Trigger(TriggerSource.FAST, time.time())
            return self._decide(edged, trigger, (t_wait, t0), event_ts)[1]

    def _decide(
        self,
        state: ExporterState,
        trigger: Trigger,
        began: tuple[float, float],
        event_ts: float | None,
    ) -> tuple[Decision, Report]:
        """Decide on ``state`` and execute (the caller holds the lock)."""
        t_state = time.monotonic()
        source, now = trigger.source, trigger.now
        recent = self.history.snapshot(now)
        ledger = self.journal.ledger()
        pressure = self.slo.pressure.devices(state)
        at_risk = self.slo.pressure.at_risk(state)
        decision = decide(
            state, trigger, self.config.policy, ledger, recent, pressure, slo_at_risk=at_risk
        )
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s decision: tasks %s, straight on %s, actions %s", source,
                [(t.container, t.phase, t.paused) for t in state.tasks],
                sorted(c[:12] for c in recent.straight_on),
                [(s.container, s.verb, s.reason) for s in decision.steps],
            )  # fmt: skip
        if self.fail_open.holding_open:
            decision = without_pauses(decision)
        elif self.journal.unwritable:  # a pause it cannot record is one nobody could undo
            decision = without_pauses(
                decision, SkipReason.JOURNAL_UNWRITABLE, "the journal cannot be written"
            )
        t_decided = time.monotonic()
        report = self._execute(decision, source)
        done = time.monotonic()
        self._last_decision = done
        self.metrics.decision_seconds.labels(source).observe(done - began[1])
        if decision.steps:
            log_decision(source, report, (*began, t_state, t_decided, done), event_ts)
        return decision, report

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
        self._state_read_at = time.monotonic()
        return state

    def exporter_ok(self) -> None:
        """Any successful exchange with the exporter (the fast path reports its own)."""
        self.fail_open.exporter_ok()
        self.metrics.exporter_up.set(1)

    def _execute(self, decision: Decision, source: TriggerSource) -> Report:
        steps = decision.steps
        if len(steps) > 1:
            outcomes = self.executor.execute_many(steps, source, self._pool)
        else:
            outcomes = [self.executor.execute(step, source) for step in steps]
        done = [(s, o.result) for s, o in zip(steps, outcomes, strict=True)]
        took = [o.freeze_ms / 1000 if o.freeze_ms is not None else None for o in outcomes]
        self.history.observe(decision, done, time.time(), took)
        for outcome in outcomes:
            if outcome.engine_down:
                self.reconciler.engine_failed(outcome.detail)
        report = self.reporter.report(decision, outcomes, source)
        self.metrics.paused_containers.set(len(self.journal.paused))
        return report

    # --- webhooks ----------------------------------------------------------------------

    def handle_webhook(self, message: WebhookMessage) -> Report:
        """Act on one Alertmanager POST (see the module doc of ``actuator.http``): each
        fresh alert goes to the handler of its action (``routes``)."""
        now = time.time()
        with self._lock:
            fresh, stale = self.order.split(message.alerts, now)
        delivery = Delivery(dataclasses.replace(message, alerts=tuple(fresh)), bool(stale), now)
        routed, irrelevant = by_action(fresh, self.config.actions)
        report = Report()
        for reason, alerts in (
            (SkipReason.STALE_ALERT, stale),
            (SkipReason.IRRELEVANT_ALERT, irrelevant),
        ):
            for alert in alerts:
                self.metrics.skip(reason)
                report.skips.append({"reason": reason, "alert": alert.name})
        for action, handle in self.routes.items():
            report.merge(handle(routed.get(action, []), delivery))
        return report

    def _on_record(self, alerts: list[Alert], delivery: Delivery) -> Report:
        for alert in alerts:
            self.audit.write(
                "alert", alertname=alert.name, status=alert.status, labels=dict(alert.labels)
            )
        return Report()

    def _on_protect_slo(self, alerts: list[Alert], delivery: Delivery) -> Report:
        if not alerts:
            return Report()
        with self._lock:
            self.slo.take(alerts, delivery.now)
            report = Report()
            try:
                state: ExporterState | None = self.fetch_state()
                report = self.decide_now(TriggerSource.WEBHOOK, alert=alerts[0].name, state=state)
            except (ExporterUnavailable, StateError) as exc:
                log.warning("protect_slo: no fresh state, nothing done: %s", exc)
                report.exporter_down = True
                state = None
            self.slo.leave_for_marks(delivery, state)
            return report

    def _on_mark_node(self, alerts: list[Alert], delivery: Delivery) -> Report:
        """The node list reads the whole message (protect_slo's unrelieved alerts mark too);
        a mark not yet applied is retried on any webhook."""
        if not (alerts or delivery.mark_also or self.marks.pending):
            return Report()
        with self._lock:
            return self.marks.update(delivery.message, delivery.partial, delivery.mark_also)

    def _on_resume_all(self, alerts: list[Alert], delivery: Delivery) -> Report:
        """Enter, renew or leave the fail-open state for this node's resume_all alerts."""
        with self._lock:
            why = self.fail_open.on_alerts(alerts, delivery.now, bool(self.journal.paused))
            self.save_alerts()  # before acting: a restart must find it failing open
            if why is None:
                return Report()
            return self.resume_all(why, TriggerSource.WEBHOOK)

    def _on_admission(self, alerts: list[Alert], delivery: Delivery) -> Report:
        """Decide once for each node (and GPU) the firing ``admission`` alerts name."""
        targets, dropped = admission_targets(alerts)
        report = dropped_report(dropped)
        for node, gpu, name in targets:
            try:
                report.merge(self.decide_now(TriggerSource.WEBHOOK, gpu=gpu, node=node, alert=name))
            except (ExporterUnavailable, StateError) as exc:
                log.warning("webhook %s: no fresh state, nothing done: %s", name, exc)
                report.exporter_down = True
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

    # --- node marks and safety ---------------------------------------------------------

    def apply_node_mark(self) -> Report:
        """Make the Swarm label (if any) match the node list; safe to call any time."""
        with self._lock:
            return self.marks.apply()

    def node_doc(self) -> dict[str, Any]:
        """The ``/api/v1/nodes`` document (the swarm node id is at most a few seconds old)."""
        return self.marks.doc()

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
            unwritable = self.journal.retry()  # and back to admission once it is written
            why = self.fail_open.on_journal(unwritable, bool(self.journal.paused), time.monotonic())
            if why is not None:
                self.resume_all(why, TriggerSource.RECONCILE)
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
            if self.slo.expire(time.time()) and state is not None:
                self.decide_now(TriggerSource.RECONCILE, state=state)  # thaw what it alone held
            if self.marks.pending:
                self.marks.apply()
            self.metrics.paused_containers.set(len(self.journal.paused))

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
