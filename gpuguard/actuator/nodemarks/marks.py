"""This node's marks: the node list kept in the journal and executed as the Swarm label.

``NodeList`` (``nodes.py``) decides whether the node may take new real-time containers;
this keeps it in the journal beside the resolved alert episodes (``AlertOrder``), makes the
Swarm node label follow it (``SwarmMarker``), and answers ``/api/v1/nodes``.

Not thread-safe: the controller calls every method under its lock, except ``doc()``, which
the HTTP server may call at any time (it reads the node list and a cached Swarm node id).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from gpuguard.actuator.alertorder import AlertOrder
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.metrics import ActuatorMetrics
from gpuguard.actuator.nodemarks.nodelist import NodeList, NodeMarker
from gpuguard.actuator.report import Report
from gpuguard.actuator.safety.journal import Journal
from gpuguard.actuator.webhook import WebhookMessage
from gpuguard.contract import NodeListExecutor, Result, Verb

log = logging.getLogger("gpuguard.actuator")

_NODE_ID_TTL_S = 5.0


class NodeMarks:
    """The node list, its place in the journal, and the Swarm label that executes it."""

    def __init__(
        self,
        node_name: str,
        mark_alerts: frozenset[str],
        mark_ttl_s: float,
        dry_run: bool,
        journal: Journal,
        order: AlertOrder,
        audit: AuditLog,
        metrics: ActuatorMetrics,
        marker: NodeMarker | None,
    ) -> None:
        self.node_name = node_name
        self.mark_alerts = mark_alerts
        self.mark_ttl_s = mark_ttl_s
        self.dry_run = dry_run
        self.journal = journal
        self.order = order
        self.audit = audit
        self.metrics = metrics
        self.marker = marker
        self.nodes = NodeList.from_doc(node_name, journal.nodes)
        self._applied_provisionable: bool | None = None
        self._node_id_lock = threading.Lock()
        self._node_id: str | None = None
        self._node_id_at: float | None = None

    @property
    def pending(self) -> bool:
        """The Swarm label does not (yet) say what the node list says."""
        return self._applied_provisionable != self.nodes.provisionable

    def update(
        self, message: WebhookMessage, partial: bool = False, also: frozenset[str] = frozenset()
    ) -> Report:
        """Apply one webhook snapshot of the mark_node alerts (and ``also``: more alert names
        that mark the node, protect_slo's where nothing can be frozen), save, and mark."""
        changed = self.nodes.apply(message, self.mark_alerts | also, time.time(), partial)
        if changed:
            state = "provisionable" if self.nodes.provisionable else "NOT provisionable"
            reasons = ", ".join(r.alertname for r in self.nodes.reasons()) or "no reasons left"
            log.info("node %s is now %s (%s)", self.node_name, state, reasons)
        self.save()
        return self.apply()

    def expire(self, now: float) -> None:
        """Drop reasons no webhook renewed within the mark TTL (saved when any did go)."""
        if self.nodes.expire(now, self.mark_ttl_s):
            log.warning("node mark expired: no webhook renewed it within the mark TTL")
            self.save()

    def save(self) -> None:
        """The node list and the resolved alert episodes, in the journal."""
        self.journal.set_nodes(self.nodes.to_doc(), self.order.to_doc(time.time()))

    def apply(self) -> Report:
        """Make the Swarm label (if any) match the node list; safe to call any time."""
        report = Report()
        want = self.nodes.provisionable
        self.metrics.node_provisionable.labels(self.node_name).set(1 if want else 0)
        if self._applied_provisionable == want:
            return report
        if self._applied_provisionable is None and want and self.swarm_node_id() is None:
            self._applied_provisionable = want  # nothing to undo: no swarm, never marked
            return report
        kind = Verb.UNMARK_NODE if want else Verb.MARK_NODE
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
            node=self.node_name,
            detail=detail or None,
            # why: the alerts that mark it (none left when it is unmarked)
            reasons=[r.alertname for r in self.nodes.reasons()] or None,
        )
        report.actions.append({"action": kind, "node": self.node_name, "result": result})
        return report

    def _swarm_apply(self, provisionable: bool) -> tuple[Result, str]:
        if self.dry_run:
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

    def doc(self) -> dict[str, Any]:
        """The ``/api/v1/nodes`` document (the swarm node id is at most a few seconds old)."""
        node_id = self._cached_swarm_node_id()
        doc = self.nodes.to_doc()
        doc["swarm_node_id"] = node_id
        doc["applied"] = self._applied_provisionable == self.nodes.provisionable
        if node_id is None:
            executor = NodeListExecutor.LIST_ONLY
            note = "engine not in a swarm: node list kept, no label set"
        else:
            executor = NodeListExecutor.SWARM
            note = "swarm node label gpuguard.provisionable=false while marked"
        return {"executor": executor, "note": note, "nodes": [doc]}
