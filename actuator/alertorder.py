"""Order each alert's deliveries, so a late duplicate cannot undo a newer one. Pure.

Per fingerprint: an older episode (``startsAt``) is stale, and so is a ``firing`` of an
episode already seen resolved; anything else is news or a harmless repeat. The resolved
episodes go to the journal (``to_doc``/``from_doc``). Why: docs/design-notes.md, "Alert order".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuguard.actuator.webhook import Alert

KEEP_S = 3600.0  # far longer than HA peers disagree (peer_timeout x peers, group timers)
LIMIT = 10_000


@dataclass
class _Episode:
    starts_at: datetime
    resolved: bool
    seen: float


class AlertOrder:
    """The newest episode seen per fingerprint; bounded in time and count."""

    def __init__(self, keep_s: float = KEEP_S, limit: int = LIMIT) -> None:
        self._episodes: dict[str, _Episode] = {}
        self._keep_s = keep_s
        self._limit = limit
        #: resolved episodes learnt so far: when it grows, the journal's copy is behind
        self.resolutions = 0

    def fresh(self, alert: Alert, now: float) -> bool:
        """Whether this delivery may be acted on (and remember it if so)."""
        known = self._episodes.get(alert.fingerprint)
        if known is not None:
            if alert.starts_at < known.starts_at:
                return False
            if alert.starts_at == known.starts_at and known.resolved and alert.firing:
                return False
        if not alert.firing and (
            known is None or not known.resolved or known.starts_at != alert.starts_at
        ):
            self.resolutions += 1
        self._episodes[alert.fingerprint] = _Episode(alert.starts_at, not alert.firing, now)
        if len(self._episodes) > self._limit:
            self._forget(now)
        return True

    def split(self, alerts: Iterable[Alert], now: float) -> tuple[list[Alert], list[Alert]]:
        """One webhook's deliveries that may be acted on (``fresh``), and the stale ones."""
        fresh: list[Alert] = []
        stale: list[Alert] = []
        for alert in alerts:
            (fresh if self.fresh(alert, now) else stale).append(alert)
        return fresh, stale

    def _forget(self, now: float) -> None:
        kept = {fp: e for fp, e in self._episodes.items() if now - e.seen <= self._keep_s}
        if len(kept) > self._limit:  # still too many: keep the most recently seen
            newest = sorted(kept.items(), key=lambda item: item[1].seen)[-self._limit // 2 :]
            kept = dict(newest)
        self._episodes = kept

    def __len__(self) -> int:
        return len(self._episodes)

    def to_doc(self, now: float, limit: int = 1000) -> dict[str, list[Any]]:
        """The resolved episodes seen within ``keep_s``, newest ``limit``: fingerprint ->
        [startsAt (ISO 8601), seen (epoch seconds)]."""
        resolved = [
            (e.seen, fp, e.starts_at)
            for fp, e in self._episodes.items()
            if e.resolved and now - e.seen <= self._keep_s
        ]
        resolved.sort(reverse=True)
        return {fp: [starts.isoformat(), seen] for seen, fp, starts in resolved[:limit]}

    @classmethod
    def from_doc(cls, doc: Any, now: float) -> AlertOrder:
        """Restore ``to_doc``'s resolved episodes (checked when the journal was loaded,
        ``journaldoc``); expired ones, and any that still cannot be read, are dropped."""
        order = cls()
        if not isinstance(doc, dict):
            return order
        for fp, item in list(doc.items())[: order._limit]:
            try:
                starts_at = datetime.fromisoformat(item[0])
                seen = float(item[1])
            except (TypeError, ValueError, IndexError, KeyError):
                continue
            if starts_at.tzinfo is None:  # never comparable with a webhook's time
                continue
            if isinstance(fp, str) and now - seen <= order._keep_s:
                order._episodes[fp] = _Episode(starts_at, True, seen)
        return order
