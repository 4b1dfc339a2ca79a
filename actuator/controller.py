"""The actuator's control loop: fresh state -> ``decide`` -> executor, under one lock.

Webhooks, the fast path and the maintenance loop all come through here, so decisions never
interleave. Safety lives here too: the ``--max-pause`` limit, failing open when the exporter
cannot be seen, reconciling the journal with Docker, and resuming everything on shutdown.

Failing open on an alert (``resume_all``, e.g. ``GpuguardExporterDown`` for this node) is a
state, not a one-off: while such an alert fires for this node, everything this actuator
paused is resumed once and nothing is paused again, so Alertmanager's duplicates and repeats
change nothing. The state ends when the alert resolves, or when no repeat renewed it within
``--node.mark-ttl`` (like a node mark). Each alert's deliveries are put in order first
(``AlertOrder``): a late duplicate from a clustered Alertmanager is dropped.

SLO pressure (``protect_slo``, ``actuator/slo.py``) is such a state too: while a real-time
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
from dataclasses import dataclass, field
from typing import Any

from gpuguard.actuator.alertorder import AlertOrder
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.config import Config
from gpuguard.actuator.errors import DockerUnavailable, ExporterUnavailable, StateError
from gpuguard.actuator.executor import DockerExecutor, Outcome, resume_managed_paused
from gpuguard.actuator.journal import Journal, plan_reconcile
from gpuguard.actuator.metrics import ActuatorMetrics
from gpuguard.actuator.nodes import NodeList, SwarmMarker
from gpuguard.actuator.policy import PAUSE, UNPAUSE, Action, Decision, Skip, Trigger, decide
from gpuguard.actuator.slo import SloPressure
from gpuguard.actuator.state import ExporterClient, ExporterState
from gpuguard.actuator.webhook import Alert, WebhookMessage
from gpuguard.contract import (
    ActionKind,
    ActionReason,
    AlertAction,
    Result,
    SkipReason,
    TriggerSource,
)

log = logging.getLogger("gpuguard.actuator")

_SKIP_AUDIT_EVERY_S = 30.0
_NODE_ID_TTL_S = 5.0
#: distinct ``node`` labels one webhook may ask admission for (a real group names one)
MAX_ADMISSION_NODES = 16
_DOCKER_CHECK_EVERY_S = 2.0
MAINTENANCE_DECISION_AFTER_S = 1.0


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


class Controller:
    """Owns the journal, executor and node list; every public method is thread-safe."""

    def __init__(
        self,
        config: Config,
        exporter_factory: Callable[[], ExporterClient],
        executor: DockerExecutor,
        journal: Journal,
        audit: AuditLog,
        metrics: ActuatorMetrics,
        marker: SwarmMarker | None,
    ) -> None:
        self.config = config
        self.exporter = exporter_factory()
        self.executor = executor
        self.journal = journal
        self.audit = audit
        self.metrics = metrics
        self.marker = marker
        self.nodes = NodeList.from_doc(config.node_name, journal.nodes)
        self._applied_provisionable: bool | None = None
        self._lock = threading.RLock()
        self._last_exporter_ok = time.monotonic()
        self._failed_open = False
        self._skip_audited: dict[tuple[str, str], float] = {}
        self._last_docker_check = 0.0
        self._last_decision = 0.0
        self.last_state: ExporterState | None = None
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="executor")
        self._node_id_lock = threading.Lock()
        self._node_id: str | None = None
        self._node_id_at: float | None = None
        self.order = AlertOrder.from_doc(journal.nodes.get("resolved_alerts"), time.time())
        #: fingerprint -> last delivery, of resume_all alerts firing for this node
        self._fail_open_alerts: dict[str, float] = {}
        #: protect_slo alerts firing for this node: devices whose best-effort work yields
        self.slo = SloPressure(config.node_name)
        self.docker_error: str | None = None
        #: set when the journal was unreadable: undo every managed pause once Docker answers
        self.journal_lost: str | None = None

    @property
    def holding_open(self) -> bool:
        """True while a resume_all alert fires for this node: admission pauses nothing."""
        return bool(self._fail_open_alerts)

    def health(self) -> str:
        """``ok``, or ``degraded: <why>`` (the /healthz body)."""
        problems = []
        if self.docker_error:
            problems.append(f"docker engine unreachable, retrying ({self.docker_error})")
        if self.journal_lost:
            problems.append(f"journal unreadable, pauses not yet undone ({self.journal_lost})")
        if self.holding_open:
            problems.append("failing open: a resume_all alert fires for this node")
        if time.monotonic() - self._last_exporter_ok > self.config.exporter_timeout_s:
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
            trigger = Trigger(source, time.time(), node=node, gpu=gpu, alert=alert)
            decision = decide(
                state, trigger, self.config.policy, self.journal.ledger(), self.slo.devices(state)
            )
            if self.holding_open:
                decision = _without_pauses(decision)
            t_decided = time.monotonic()
            report = self._execute(decision, source)
            done = time.monotonic()
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
        self._last_exporter_ok = time.monotonic()
        self.metrics.exporter_up.set(1)
        if self._failed_open:
            log.info("exporter reachable again: admission control resumes")
            self.audit.write("exporter_back")
            self._failed_open = False

    def _execute(self, decision: Decision, source: TriggerSource) -> Report:
        report = Report()
        actions = decision.actions
        if len(actions) > 1:
            outcomes = self.executor.execute_many(actions, source, self._pool)
        else:
            outcomes = [self.executor.execute(a, source) for a in actions]
        for action, outcome in zip(actions, outcomes, strict=True):
            self._count(outcome)
            report.docker_down |= outcome.docker_down
            if outcome.docker_down:
                self.docker_error = outcome.detail
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
        """Act on one Alertmanager POST (see the module doc of ``actuator.server``)."""
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
        if (
            AlertAction.MARK_NODE in by_action
            or slo_marks
            or self._applied_provisionable != self.nodes.provisionable
        ):
            report.merge(self._update_nodes(message, partial, slo_marks))
        report.merge(self._fail_open_alert(by_action.get(AlertAction.RESUME_ALL, []), now))
        report.merge(self._admission(by_action.get(AlertAction.ADMISSION, [])))
        return report

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
        ours = [a for a in alerts if self._for_this_node(a)]
        with self._lock:
            was_open = self.holding_open
            for alert in ours:
                if alert.firing:
                    self._fail_open_alerts[alert.fingerprint] = now
                else:
                    self._fail_open_alerts.pop(alert.fingerprint, None)
            if was_open and not self.holding_open:
                log.info("resume_all alerts resolved: admission control resumes")
                self.audit.write("fail_open_end", alerts=[a.name for a in ours])
            if not self.holding_open or (was_open and not self.journal.paused):
                return Report()  # nothing fires, or already open with nothing held
            names = sorted({a.name for a in ours if a.firing})
            return self.resume_all("alert " + ", ".join(names), TriggerSource.WEBHOOK)

    def _for_this_node(self, alert: Alert) -> bool:
        """An alert names this node, or no node at all (a single-host Prometheus whose
        exporter target carries no ``node`` label): failing open is the safe reading."""
        node = alert.labels.get("node")
        return node is None or node == self.config.node_name

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
            marks = self.config.alerts_for(AlertAction.MARK_NODE) | also
            changed = self.nodes.apply(message, marks, time.time(), partial)
            if changed:
                state = "provisionable" if self.nodes.provisionable else "NOT provisionable"
                reasons = ", ".join(r.alertname for r in self.nodes.reasons()) or "no reasons left"
                log.info("node %s is now %s (%s)", self.config.node_name, state, reasons)
            self._save_nodes()
            return self.apply_node_mark()

    def _save_nodes(self) -> None:
        """The node list and the resolved alert episodes, in the journal."""
        doc = self.nodes.to_doc()
        doc["resolved_alerts"] = self.order.to_doc(time.time())
        self.journal.set_nodes(doc)

    def apply_node_mark(self) -> Report:
        """Make the Swarm label (if any) match the node list; safe to call any time."""
        report = Report()
        with self._lock:
            want = self.nodes.provisionable
            self.metrics.node_provisionable.labels(self.config.node_name).set(1 if want else 0)
            if self._applied_provisionable == want:
                return report
            if self._applied_provisionable is None and want and self.swarm_node_id() is None:
                self._applied_provisionable = want  # nothing to undo: no swarm, never marked
                return report
            kind = ActionKind.UNMARK_NODE if want else ActionKind.MARK_NODE
            result, detail = self._swarm_apply(want)
            if result == Result.FAILED:
                report.docker_down = True
            else:
                self._applied_provisionable = want
            self.metrics.actions.labels(kind, result).inc()
            self.audit.write(
                "action",
                action=kind,
                result=result,
                node=self.config.node_name,
                detail=detail or None,
            )
            report.actions.append({"action": kind, "node": self.config.node_name, "result": result})
            return report

    def _swarm_apply(self, provisionable: bool) -> tuple[Result, str]:
        if self.config.dry_run:
            return Result.DRY_RUN, "dry run: swarm label unchanged"
        if self.marker is None or self.swarm_node_id() is None:
            return Result.SKIPPED, "engine not in a swarm: node list only"
        try:
            return self.marker.apply(provisionable), ""
        except Exception as exc:  # any engine failure is worth a retry
            log.warning("swarm node label update failed: %s", exc)
            return Result.FAILED, str(exc)

    def swarm_node_id(self) -> str | None:
        if self.marker is None:
            return None
        try:
            return self.marker.node_id()
        except Exception:  # no engine means no swarm to mark
            return None

    def _cached_swarm_node_id(self) -> str | None:
        # GET /api/v1/nodes is open to anyone who can connect: at most one Docker call per
        # TTL however often it is asked, and while one caller waits for Docker the others
        # take the last known id instead of holding the server's handler threads too.
        fresh = (
            self._node_id_at is not None and time.monotonic() - self._node_id_at <= _NODE_ID_TTL_S
        )
        if fresh or not self._node_id_lock.acquire(blocking=False):
            return self._node_id
        try:
            self._node_id = self.swarm_node_id()
            self._node_id_at = time.monotonic()
        finally:
            self._node_id_lock.release()
        return self._node_id

    # --- safety ------------------------------------------------------------------------

    def resume_all(self, why: str, source: TriggerSource) -> Report:
        """Fail open: unpause every container this actuator paused."""
        with self._lock:
            entries = list(self.journal.paused.values())
            if entries:
                log.warning("resuming %d container(s) this actuator paused: %s", len(entries), why)
            self.audit.write("resume_all", why=why, containers=[e.container_id for e in entries])
            actions = [
                Action(UNPAUSE, e.container_id, e.name, ActionReason.RESUME_ALL, e.gpu, e.task_id)
                for e in entries
            ]
            return self._execute(Decision(tuple(actions)), source)

    def maintain(self) -> None:
        """Periodic safety work: fail open, --max-pause, reconcile with Docker and state."""
        try:
            state: ExporterState | None = self.fetch_state()
        except (ExporterUnavailable, StateError) as exc:
            state = None
            self._maybe_fail_open(str(exc))
        with self._lock:
            self._enforce_max_pause()
            now = time.monotonic()
            if now - self._last_docker_check >= _DOCKER_CHECK_EVERY_S:
                self._last_docker_check = now
                self.reconcile(state)
            # A safety net for missed events; the fast path normally decides first.
            quiet = time.monotonic() - self._last_decision > MAINTENANCE_DECISION_AFTER_S
            if state is not None and self.config.mode != "webhook" and quiet:
                self.decide_now(TriggerSource.RECONCILE, state=state)
            if self.nodes.expire(time.time(), self.config.node_mark_ttl_s):
                log.warning("node mark expired: no webhook renewed it within the mark TTL")
                self._save_nodes()
            self._expire_fail_open(time.time())
            self._expire_slo(time.time(), state)
            if self._applied_provisionable != self.nodes.provisionable:
                self.apply_node_mark()
            self.metrics.paused_containers.set(len(self.journal.paused))

    def _expire_fail_open(self, now: float) -> None:
        ttl = self.config.node_mark_ttl_s
        stale = [fp for fp, seen in self._fail_open_alerts.items() if now - seen > ttl]
        for fingerprint in stale:
            del self._fail_open_alerts[fingerprint]
        if stale and not self._fail_open_alerts:
            log.warning("fail-open alert not renewed within the mark TTL: admission resumes")
            self.audit.write("fail_open_end", why="not renewed within --node.mark-ttl")

    def _expire_slo(self, now: float, state: ExporterState | None) -> None:
        expired = self.slo.expire(now, self.config.node_mark_ttl_s)
        if not expired:
            return
        log.warning("SLO alert(s) not renewed within the mark TTL: pressure ends")
        self.audit.write("slo_pressure", alerts=self.slo.to_doc(), why="not renewed")
        if state is not None:  # thaw what the pressure alone held, even in webhook mode
            self.decide_now(TriggerSource.RECONCILE, state=state)

    def _maybe_fail_open(self, why: str) -> None:
        down_for = time.monotonic() - self._last_exporter_ok
        if down_for <= self.config.exporter_timeout_s or self._failed_open:
            return
        self._failed_open = True
        log.warning("exporter unreachable for %.1fs (%s): failing open", down_for, why)
        self.metrics.fail_open.inc()
        self.resume_all(f"exporter unreachable for {down_for:.1f}s", TriggerSource.RECONCILE)

    def _enforce_max_pause(self) -> None:
        now = time.time()
        for entry in list(self.journal.paused.values()):
            if now - entry.paused_at <= self.config.max_pause_s:
                continue
            log.warning("%s paused longer than --max-pause: resuming it for good", entry.name)
            if entry.task_id:
                self.journal.exempt(entry.task_id, now)
            action = Action(
                UNPAUSE,
                entry.container_id,
                entry.name,
                ActionReason.MAX_PAUSE,
                entry.gpu,
                entry.task_id,
            )
            self._execute(Decision((action,)), TriggerSource.RECONCILE)

    def reconcile(self, state: ExporterState | None) -> None:
        """Settle the journal against Docker: forget what is gone, resume what must go."""
        with self._lock:
            try:
                self.executor.check()
                docker_view = self.executor.paused_states(list(self.journal.paused))
                if self.journal_lost:
                    self._undo_managed_pauses()
            except DockerUnavailable as exc:
                if self.docker_error is None:
                    log.warning("docker engine unreachable, retrying: %s", exc)
                self.docker_error = str(exc)
                return
            if self.docker_error is not None:
                log.info("docker engine answers again")
                self.docker_error = None
            with_tasks = (
                None if state is None else {t.container_id for t in state.tasks if t.container_id}
            )
            steps = plan_reconcile(
                self.journal.paused, docker_view, with_tasks, time.time(), self.config.max_pause_s
            )
            for step in steps:
                if step.verdict == "forget":
                    self.journal.released(step.container_id)
                    self.audit.write(
                        "reconcile", container_id=step.container_id, verdict="forget", why=step.why
                    )
                elif step.verdict == "unpause":
                    entry = self.journal.paused[step.container_id]
                    action = Action(
                        UNPAUSE,
                        entry.container_id,
                        entry.name,
                        ActionReason.RECONCILE,
                        entry.gpu,
                        entry.task_id,
                    )
                    self._execute(Decision((action,)), TriggerSource.RECONCILE)
            if state is not None:
                self.journal.prune(
                    {t.task_id for t in state.tasks}, {c.id for c in state.containers}
                )

    def _undo_managed_pauses(self) -> None:
        """The journal was unreadable: resume every managed container Docker shows paused
        (``resume_managed_paused`` says why that is the safe reading)."""
        resumed = resume_managed_paused(
            self.executor.api, self.audit, f"journal unreadable: {self.journal_lost}"
        )
        log.warning(
            "journal was unreadable: resumed %d paused managed container(s): %s",
            len(resumed), ", ".join(c[:12] for c in resumed) or "none",
        )  # fmt: skip
        self.journal_lost = None

    def node_doc(self) -> dict[str, Any]:
        """The ``/api/v1/nodes`` document (the swarm node id is at most a few seconds old)."""
        node_id = self._cached_swarm_node_id()
        doc = self.nodes.to_doc()
        doc["swarm_node_id"] = node_id
        doc["applied"] = self._applied_provisionable == self.nodes.provisionable
        if node_id is None:
            executor, note = "list_only", "engine not in a swarm: node list kept, no label set"
        else:
            executor, note = "swarm", "swarm node label gpuguard.provisionable=false while marked"
        return {"executor": executor, "note": note, "nodes": [doc]}


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
