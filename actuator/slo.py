"""The ``protect_slo`` alerts acted on: the SLO pressure they keep, and which of them mark the
node (those with nothing on their GPUs that could be frozen).

The controller calls it under its lock, in order: ``take`` a webhook's alerts, decide, then
``leave_for_marks``; ``expire`` at every maintenance pass. It never calls back.
"""

from __future__ import annotations

import dataclasses
import logging

from gpuguard.actuator.admission.pressure import SloPressure
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.routing import Delivery
from gpuguard.actuator.state import ExporterState
from gpuguard.actuator.webhook import Alert

log = logging.getLogger("gpuguard.actuator")


class SloProtection:
    """The protect_slo alerts of this node and the pressure they keep; not thread-safe."""

    def __init__(
        self, node_name: str, alert_names: frozenset[str], mark_ttl_s: float, audit: AuditLog
    ) -> None:
        self.pressure = SloPressure(node_name)
        self.alert_names = alert_names
        self.mark_ttl_s = mark_ttl_s
        self.audit = audit

    def take(self, alerts: list[Alert], now: float) -> None:
        """Renew or end the SLO pressure these alerts keep (audited when it changes)."""
        if self.pressure.apply(alerts, now):
            log.info("SLO pressure: %s", self.pressure.to_doc() or "none")
            self.audit.write("slo_pressure", alerts=self.pressure.to_doc())

    def leave_for_marks(self, delivery: Delivery, state: ExporterState | None) -> None:
        """Leave in ``delivery`` the message as the node list should read it: of the firing
        protect_slo alerts, only those that nothing on their GPUs can relieve on ``state``
        (None: no fresh state, the marks stay as they are)."""
        if state is None:
            unrelieved: set[str] = set()
            delivery.partial = True
        else:
            unrelieved = self.pressure.unrelieved(state)
        kept = tuple(
            a
            for a in delivery.message.alerts
            if a.name not in self.alert_names or not a.firing or a.fingerprint in unrelieved
        )
        delivery.message = dataclasses.replace(delivery.message, alerts=kept)
        delivery.mark_also = self.alert_names

    def expire(self, now: float) -> bool:
        """End the pressure of alerts no webhook renewed within the mark TTL; True when some
        ended (the caller then decides again, to thaw what the pressure alone held)."""
        if not self.pressure.expire(now, self.mark_ttl_s):
            return False
        log.warning("SLO alert(s) not renewed within the mark TTL: pressure ends")
        self.audit.write("slo_pressure", alerts=self.pressure.to_doc(), why="not renewed")
        return True
