"""Which devices are under SLO pressure: a real-time container's latency SLO alert fires.

The ``protect_slo`` alerts (``GpuguardSloAtRisk``, ``GpuguardSloViolated``) come from the
tenants' own latency histograms (``rules/``): the per-request truth NVML's samples cannot
give. Like failing open, pressure is a state kept from alerts: a firing alert for this node
holds until it resolves, or until no repeat renewed it within ``--node.mark-ttl`` (a lost
resolution cannot freeze a neighbour forever).

Each alert names a container (``container_id``, 12 hex) and one GPU it runs on (``gpu``);
one without ``gpu`` (the container had no GPU process when it fired) stands for the devices
of the container's running tasks. Alerts are triggers, not truth: what they protect is
worked out on fresh exporter state at every decision, and only a container that is still
there and ``real-time`` puts its devices under pressure. ``SloPressure`` is pure but for
the clock the caller passes in; ``SloProtection`` acts on it for the controller: it takes
each webhook's protect_slo alerts, decides at once, and says which of them mark the node.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.errors import ExporterUnavailable, StateError
from gpuguard.actuator.report import Report
from gpuguard.actuator.routing import Decide, Delivery
from gpuguard.actuator.state import Container, DeviceKey, ExporterState
from gpuguard.actuator.webhook import Alert
from gpuguard.contract import COMPONENT_ROLES, PriorityClass, TriggerSource

log = logging.getLogger("gpuguard.actuator")

SHORT_ID = 12


@dataclass(frozen=True)
class SloAlert:
    """One firing protect_slo alert for this node."""

    name: str
    container_id: str  # as the alert carries it: the first 12 hex of the id
    container: str
    device: DeviceKey | None  # from its ``gpu`` label
    seen: float  # the last webhook that said it fires


def device_of(labels: Mapping[str, str]) -> DeviceKey | None:
    """The ``gpu`` label as a device: ``0`` -> (0, None), ``0:1`` -> (0, 1) (the webhook
    parser has already refused any other form)."""
    text = labels.get("gpu")
    if not text:
        return None
    parent, _, mig = text.partition(":")
    return (int(parent), int(mig) if mig else None)


class SloPressure:
    """The firing protect_slo alerts of one node, by fingerprint."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.alerts: dict[str, SloAlert] = {}

    def apply(self, alerts: Iterable[Alert], now: float) -> bool:
        """Take one webhook's protect_slo alerts; True when the set of firing ones changed.

        An alert that names no node is taken as this node's, as for failing open (a
        single-host Prometheus whose exporter target has no ``node`` label).
        """
        before = set(self.alerts)
        for alert in alerts:
            if alert.labels.get("node", self.node) != self.node:
                continue
            if not alert.firing:
                self.alerts.pop(alert.fingerprint, None)
                continue
            self.alerts[alert.fingerprint] = SloAlert(
                alert.name,
                alert.labels.get("container_id", "")[:SHORT_ID],
                alert.labels.get("container", ""),
                device_of(alert.labels),
                now,
            )
        return set(self.alerts) != before

    def expire(self, now: float, ttl: float) -> list[SloAlert]:
        """Forget alerts no webhook renewed within ``ttl``; returns them."""
        stale = [fp for fp, a in self.alerts.items() if now - a.seen > ttl]
        return [self.alerts.pop(fp) for fp in stale]

    def protected(self, state: ExporterState) -> dict[str, frozenset[DeviceKey]]:
        """Fingerprint -> the devices it protects, for the alerts of real-time containers."""
        out: dict[str, frozenset[DeviceKey]] = {}
        for fingerprint, alert in self.alerts.items():
            container = _find(state, alert.container_id)
            if container is None or container.priority_class != PriorityClass.REAL_TIME:
                continue
            if alert.device is not None:
                out[fingerprint] = frozenset({alert.device})
            else:
                out[fingerprint] = frozenset(
                    t.device for t in state.tasks if t.container_id == container.id
                )
        return out

    def devices(self, state: ExporterState) -> frozenset[DeviceKey]:
        """Every device under pressure now (``decide``'s ``slo_pressure``)."""
        return frozenset().union(*self.protected(state).values())

    def at_risk(self, state: ExporterState) -> frozenset[str]:
        """The real-time containers (full ids) whose SLO alert fires now (``decide``'s
        ``slo_at_risk``: such a server takes precedence over one that can afford a wait)."""
        found = (_find(state, alert.container_id) for alert in self.alerts.values())
        return frozenset(
            c.id for c in found if c is not None and c.priority_class == PriorityClass.REAL_TIME
        )

    def unrelieved(self, state: ExporterState) -> set[str]:
        """Alerts of real-time containers with nothing on their devices the actuator may
        freeze (no managed best-effort container's task there): freezing cannot help, so
        the node should take no new real-time containers (the caller marks it)."""
        freezable = {t.device for t in state.tasks if _freezable(state.container(t.container_id))}
        return {
            fingerprint
            for fingerprint, devices in self.protected(state).items()
            if not devices & freezable
        }

    def to_doc(self) -> list[dict[str, object]]:
        """For the audit log: what is under pressure, newest first."""
        return [
            {"alert": a.name, "container": a.container, "container_id": a.container_id,
             "device": list(a.device) if a.device is not None else None}
            for a in sorted(self.alerts.values(), key=lambda a: -a.seen)
        ]  # fmt: skip


class SloProtection:
    """The protect_slo alerts acted on: the pressure they keep, a decision at once when they
    come, and the node mark when freezing cannot help.

    Not thread-safe: the controller calls it under its lock, and ``decide`` (its
    ``decide_now``) takes that lock again.
    """

    def __init__(
        self,
        node_name: str,
        alert_names: frozenset[str],
        mark_ttl_s: float,
        audit: AuditLog,
        fetch_state: Callable[[], ExporterState],
        decide: Decide,
    ) -> None:
        self.pressure = SloPressure(node_name)
        self.alert_names = alert_names
        self.mark_ttl_s = mark_ttl_s
        self.audit = audit
        self.fetch_state = fetch_state
        self.decide = decide

    def on_alerts(self, alerts: list[Alert], delivery: Delivery) -> Report:
        """Take a webhook's protect_slo alerts: renew or end the SLO pressure, decide for this
        node at once, and leave in ``delivery`` the message as the node list should read it:
        of the firing protect_slo alerts, only those with nothing on their GPUs that could be
        frozen."""
        report = Report()
        if self.pressure.apply(alerts, delivery.now):
            log.info("SLO pressure: %s", self.pressure.to_doc() or "none")
            self.audit.write("slo_pressure", alerts=self.pressure.to_doc())
        try:
            state = self.fetch_state()
            report.merge(self.decide(TriggerSource.WEBHOOK, alert=alerts[0].name, state=state))
            unrelieved = self.pressure.unrelieved(state)
        except (ExporterUnavailable, StateError) as exc:
            log.warning("protect_slo: no fresh state, nothing done: %s", exc)
            report.exporter_down = True
            unrelieved = set()
            delivery.partial = True  # marks stay as they are
        kept = tuple(
            a
            for a in delivery.message.alerts
            if a.name not in self.alert_names or not a.firing or a.fingerprint in unrelieved
        )
        delivery.message = dataclasses.replace(delivery.message, alerts=kept)
        delivery.mark_also = self.alert_names
        return report

    def expire(self, now: float, state: ExporterState | None) -> None:
        """End the pressure of alerts no webhook renewed within the mark TTL, and thaw what
        the pressure alone held (even in webhook mode) when ``state`` is fresh."""
        if not self.pressure.expire(now, self.mark_ttl_s):
            return
        log.warning("SLO alert(s) not renewed within the mark TTL: pressure ends")
        self.audit.write("slo_pressure", alerts=self.pressure.to_doc(), why="not renewed")
        if state is not None:
            self.decide(TriggerSource.RECONCILE, state=state)


def _find(state: ExporterState, short_id: str) -> Container | None:
    if len(short_id) < SHORT_ID:
        return None  # a shorter prefix could name several containers
    for container in state.containers:
        if container.id.startswith(short_id):
            return container
    return None


def _freezable(container: Container | None) -> bool:
    return (
        container is not None
        and container.managed
        and container.role not in COMPONENT_ROLES
        and container.priority_class == PriorityClass.BEST_EFFORT
    )
