"""The node list of paper C: may new real-time containers still be placed on this node?

Why: docs/design-notes.md, "The node list".
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from gpuguard.actuator.webhook import WebhookMessage
from gpuguard.contract import Result


@dataclass(frozen=True)
class Reason:
    """One firing alert that makes the node unprovisionable."""

    alertname: str
    fingerprint: str
    group_key: str
    since: float
    seen: float = 0.0  # last webhook that said it fires (0: restored from an older journal)


@dataclass
class NodeList:
    """This actuator's node and why it may not take new real-time containers."""

    node: str
    since: float = field(default_factory=time.time)
    groups: dict[str, dict[str, Reason]] = field(default_factory=dict)
    #: group key -> the newest moment (epoch seconds) any applied snapshot of it reported
    newest: dict[str, float] = field(default_factory=dict)

    @property
    def provisionable(self) -> bool:
        return not any(self.groups.values())

    def reasons(self) -> list[Reason]:
        return sorted(
            (r for group in self.groups.values() for r in group.values()),
            key=lambda r: (r.since, r.fingerprint),
        )

    def apply(
        self,
        message: WebhookMessage,
        mark_alerts: Collection[str],
        now: float,
        partial: bool = False,
    ) -> bool:
        """Take one webhook snapshot; returns True when ``provisionable`` changed.

        ``partial``: some of the message's alerts were left out (stale duplicates), so an
        alert missing from it does not mean resolved.
        """
        before = self.provisionable
        old = self.groups.get(message.group_key, {})
        reported = _newest_moment(message)
        known = self.newest.get(message.group_key)
        older = reported is not None and known is not None and reported < known
        if reported is not None:
            self.newest[message.group_key] = max(reported, known or reported)
        whole = message.truncated_alerts == 0 and not partial and not older
        new: dict[str, Reason] = {} if whole else dict(old)
        for alert in message.alerts:
            if alert.name not in mark_alerts or alert.labels.get("node") != self.node:
                continue
            if alert.firing:
                previous = old.get(alert.fingerprint)
                since = previous.since if previous else _epoch(alert.starts_at, now)
                new[alert.fingerprint] = Reason(
                    alert.name, alert.fingerprint, message.group_key, since, seen=now
                )
            else:
                new.pop(alert.fingerprint, None)
        if new:
            self.groups[message.group_key] = new
        else:
            self.groups.pop(message.group_key, None)
            self.newest.pop(message.group_key, None)
        changed = before != self.provisionable
        if changed:
            self.since = now
        return changed

    def expire(self, now: float, ttl: float) -> bool:
        """Drop reasons no webhook renewed within ``ttl``; True when ``provisionable`` changed."""
        before = self.provisionable
        for key in list(self.groups):
            kept = {fp: r for fp, r in self.groups[key].items() if now - (r.seen or r.since) <= ttl}
            if kept:
                self.groups[key] = kept
            else:
                del self.groups[key]
        changed = before != self.provisionable
        if changed:
            self.since = now
        return changed

    def to_doc(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "provisionable": self.provisionable,
            "since": self.since,
            "reasons": [asdict(r) for r in self.reasons()],
        }

    @classmethod
    def from_doc(cls, node: str, doc: dict[str, Any]) -> NodeList:
        """Restore from the journal; a journal of another node name is ignored, and so is a
        malformed part of one (a reason left out expires anyway; a crash at start-up would
        leave tenants paused)."""
        nodes = cls(node)
        if not isinstance(doc, dict) or doc.get("node") != node:
            return nodes
        try:
            nodes.since = float(doc.get("since", nodes.since))
        except (TypeError, ValueError):
            pass
        reasons = doc.get("reasons")
        for item in reasons if isinstance(reasons, list) else []:
            try:
                reason = Reason(**item)
                key = (str(reason.group_key), str(reason.fingerprint))
                reason = replace(reason, since=float(reason.since), seen=float(reason.seen))
            except (TypeError, ValueError):
                continue
            nodes.groups.setdefault(key[0], {})[key[1]] = reason
        return nodes


def _newest_moment(message: WebhookMessage) -> float | None:
    """The newest moment a snapshot reports: its latest ``startsAt``, or ``endsAt`` of a
    resolved alert; None for a snapshot without alerts (nothing to date it by)."""
    moments = [_epoch(a.starts_at if a.firing else a.ends_at, 0.0) for a in message.alerts]
    return max(moments, default=None)


def _epoch(moment: Any, fallback: float) -> float:
    try:
        value = float(moment.timestamp())
    except (OverflowError, ValueError, OSError):
        return fallback
    return value if value > 0 else fallback


class NodeMarker(Protocol):
    """What marks this node: ``engine.swarm.SwarmMarker`` (a Swarm node label) or
    ``taints.TaintMarker`` (a Kubernetes taint and label)."""

    def node_id(self) -> str | None: ...

    def apply(self, provisionable: bool) -> Result: ...
