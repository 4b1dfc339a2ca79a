"""Per-credential rate limits for reservations: a token bucket for each credential.

A reservation holds memory on a GPU until the records show it (``--placement.settle``), so
a client reserving faster than containers start would fill the cluster with placements
that never happen. Each credential (the bearer token, a basic-auth user, a client
certificate: what the request proved, not where it came from, since one holder may use
any number of addresses) may reserve ``burst`` at once and ``rate`` per second after that.
Pure but for the lock; the clock is the caller's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

#: Credentials remembered at most (the least recently seen are forgotten: a full bucket).
MAX_CLIENTS = 10_000


class RateLimit:
    """``take(client, now)``: 0 when the client may go on, else seconds until it may."""

    def __init__(self, rate: float, burst: int, max_clients: int = MAX_CLIENTS) -> None:
        self.rate = rate
        self.burst = burst
        self._max = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, when
        self._lock = threading.Lock()

    def take(self, client: str, now: float) -> float:
        with self._lock:
            tokens, then = self._buckets.pop(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + max(0.0, now - then) * self.rate)
            if tokens >= 1.0:
                wait, tokens = 0.0, tokens - 1.0
            else:
                wait = (1.0 - tokens) / self.rate
            self._buckets[client] = (tokens, now)
            while len(self._buckets) > self._max:
                self._buckets.popitem(last=False)
            return wait
