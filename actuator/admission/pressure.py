"""Which devices are under SLO pressure: a real-time container's latency SLO alert fires.

``SloPressure`` keeps the firing ``protect_slo`` alerts of one node (by fingerprint) and,
on fresh exporter state, says which devices and containers they protect. Pure but for the
clock the caller passes in. Why pressure is kept from alerts:
docs/design-notes.md, "The SLO pressure".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuguard.actuator.state import Container, DeviceKey, ExporterState
from gpuguard.actuator.webhook import Alert
from gpuguard.contract import COMPONENT_ROLES, PriorityClass

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
