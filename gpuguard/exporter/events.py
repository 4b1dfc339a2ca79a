"""The exporter's event log: a bounded ring with increasing ``seq``, long-polled by followers.

``/api/v1/events?since=SEQ&timeout=S`` (docs/interfaces.md §3) reads ``EventLog.since``;
an ``append`` wakes whoever waits at once: threads in ``since`` (a Condition) and the HTTP
server's long polls (``subscribe``, which must not block).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import Any

from gpuguard.contract import EventType

_EVENT_TYPES = frozenset(EventType)


@dataclass(frozen=True, slots=True)
class EventBatch:
    """What one follower's request gets: events after ``since``, and where to go on."""

    events: tuple[dict[str, Any], ...]
    next: int
    truncated: bool


class EventLog:
    """Thread-safe bounded event ring; the first event has ``seq`` 1."""

    def __init__(self, capacity: int, clock: Callable[[], float] = time.time) -> None:
        if capacity < 1:
            raise ValueError("event buffer capacity must be >= 1")
        self._events: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._seq = 0
        self._cond = threading.Condition()
        self._clock = clock
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every append (from the appending thread)."""
        self._listeners.append(listener)

    @property
    def seq(self) -> int:
        """Sequence number of the newest event (0 before the first)."""
        return self._seq

    def append(self, type_: EventType, ts: float | None = None, **fields: Any) -> dict[str, Any]:
        """Record one event; fields whose value is None are left out."""
        if type_ not in _EVENT_TYPES:
            raise ValueError(f"unknown event type {type_!r}")
        with self._cond:
            self._seq += 1
            event = {"seq": self._seq, "ts": self._clock() if ts is None else ts, "type": type_}
            event.update((k, v) for k, v in fields.items() if v is not None)
            self._events.append(event)
            self._cond.notify_all()
        for listener in self._listeners:
            listener()
        return event

    def since(self, since: int, timeout: float = 0.0) -> EventBatch:
        """Events with ``seq > since``, waiting up to ``timeout`` seconds for the first one.

        ``truncated`` is true when events after ``since`` were already dropped from the ring,
        or when ``since`` is newer than anything here (the follower saw an earlier exporter
        process): either way the follower must re-read the state.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._seq <= since:
                if since > self._seq:
                    return EventBatch((), self._seq, True)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return EventBatch((), self._seq, False)
                self._cond.wait(remaining)
            oldest = self._events[0]["seq"]
            # seqs are consecutive: the newest (seq - since) events, without a full scan
            wanted = min(self._seq - since, len(self._events))
            events = tuple(islice(reversed(self._events), wanted))[::-1]
            return EventBatch(events, self._seq, truncated=since + 1 < oldest)
