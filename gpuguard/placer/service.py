"""The placer's API as handler functions: a query string in, a status and a JSON document out.

Nothing here speaks HTTP, so the transport (``gpuguard/placer/http.py`` on the shared server core
``gpuguard/web``, or a Kubernetes scheduler extender) stays a thin adapter. Bad input is a 400
with one line, never a traceback; Prometheus unreachable is a 503; no eligible node a 409.

Asking where a container would go (``placement``) changes nothing; only ``reserve``, which
the transport offers to authenticated clients alone, counts the placement until the records
show it, and each credential (the bearer token, a basic-auth user, a client certificate) may
reserve at ``Settings.client_rate`` (429 beyond it).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuguard.placer.errors import BadRequest, RecordsUnavailable
from gpuguard.placer.query import parse_query
from gpuguard.placer.ranking import (
    DEFAULT_HEADROOM,
    DEFAULT_MAX_AGE_S,
    Candidate,
    NodeView,
    Policy,
    Ranking,
    Request,
    rank,
)
from gpuguard.placer.ratelimit import RateLimit
from gpuguard.placer.reservations import Reservations

RANKED_IN_REPLY = 10
ENDPOINTS = ("placement", "reservation", "nodes", "extender_filter", "extender_prioritize")
CODES = ("200", "400", "401", "403", "409", "429", "503")
DEFAULT_CLIENT_RATE = 1.0  # reservations per second and credential, after the burst
DEFAULT_CLIENT_BURST = 10
GIB = 2**30


class RecordSource(Protocol):
    def views(self) -> list[NodeView]: ...


@dataclass(frozen=True, slots=True)
class Reply:
    code: int
    doc: dict[str, Any]
    retry_after_s: float | None = None  # with 429: when this credential may reserve again


@dataclass(frozen=True, slots=True)
class Settings:
    policy: Policy = Policy.GPUGUARD
    max_age_s: float = DEFAULT_MAX_AGE_S
    headroom: float = DEFAULT_HEADROOM
    client_rate: float = DEFAULT_CLIENT_RATE
    client_burst: int = DEFAULT_CLIENT_BURST


class PlacerMetrics:
    """``gpuguard_placer_*`` (docs/interfaces.md §9); label values exist from start-up."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "gpuguard_placer_requests",
            "API requests by endpoint and status code.",
            ["endpoint", "code"],
            registry=self.registry,
        )
        for endpoint in ENDPOINTS:
            for code in CODES:
                self.requests.labels(endpoint, code)
        self.rank_seconds = Histogram(
            "gpuguard_placer_rank_seconds",
            "Time to build and rank the node list.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.nodes = Gauge(
            "gpuguard_placer_nodes", "Nodes in the last node list.", registry=self.registry
        )
        self.records_up = Gauge(
            "gpuguard_placer_records_up",
            "1 while Prometheus answers the records query.",
            registry=self.registry,
        )


class Placer:
    """Answers placement and node-list requests from the records of ``source``."""

    def __init__(
        self,
        source: RecordSource,
        settings: Settings | None = None,
        reservations: Reservations | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.reservations = reservations or Reservations()
        self.metrics = PlacerMetrics()
        self._clock = clock
        self._lock = threading.Lock()  # rank and reserve as one step
        self.settings = settings or Settings()

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self._settings = settings
        self._limit = RateLimit(settings.client_rate, settings.client_burst)

    def placement(self, query: str) -> Reply:
        """``GET /api/v1/placement``: the node and GPU a new container would get now, and
        why; nothing is reserved."""
        reply = self._placement(query, reserve=False)
        self.metrics.requests.labels("placement", str(reply.code)).inc()
        return reply

    def reserve(self, query: str, client: str) -> Reply:
        """``POST /api/v1/placement``: the same answer, and the placement counts on its GPU
        until the records show it; at most ``client_rate`` per second per ``client``: the
        credential the transport authenticated (``the bearer token``, ``user alice``, ...)."""
        wait = self._limit.take(client, self._clock())
        if wait > 0:
            who = client or "this client"
            reply = Reply(429, {"error": f"too many reservations for {who}"}, wait)
        else:
            reply = self._placement(query, reserve=True)
        self.metrics.requests.labels("reservation", str(reply.code)).inc()
        return reply

    def refuse_reservation(self, why: str) -> Reply:
        """A reservation the transport will not take (no token configured)."""
        self.metrics.requests.labels("reservation", "403").inc()
        return Reply(403, {"error": why})

    def nodes(self, query: str) -> Reply:
        """``GET /api/v1/nodes``: the whole ranked list, for a request or none."""
        try:
            parsed = parse_query(query, required=())
            ranking = self._rank(parsed.request, parsed.policy, reserve=False)
        except BadRequest as exc:
            reply = Reply(400, {"error": str(exc)})
        except RecordsUnavailable as exc:
            reply = Reply(503, {"error": str(exc)})
        else:
            reply = Reply(200, ranking_doc(ranking, limit=None))
        self.metrics.requests.labels("nodes", str(reply.code)).inc()
        return reply

    def ranking(self, request: Request) -> Ranking:
        """The ranked list for ``request`` under the placer's policy, reserving nothing (for
        adapters that build the request themselves: the kube-scheduler extender).
        RecordsUnavailable when Prometheus cannot answer."""
        return self._rank(request, None, reserve=False)

    def count(self, endpoint: str, code: int) -> None:
        """Count one answer of an adapter's endpoint (``gpuguard_placer_requests_total``)."""
        self.metrics.requests.labels(endpoint, str(code)).inc()

    def _placement(self, query: str, reserve: bool) -> Reply:
        try:
            parsed = parse_query(query)
            ranking = self._rank(parsed.request, parsed.policy, reserve=reserve)
        except BadRequest as exc:
            return Reply(400, {"error": str(exc)})
        except RecordsUnavailable as exc:
            return Reply(503, {"error": str(exc)})
        choice = ranking.choice
        doc = ranking_doc(ranking, limit=RANKED_IN_REPLY)
        if choice is None:
            return Reply(409, {"error": "no node can take this container now", **doc})
        return Reply(200, {"node": choice.node, "gpu": choice.gpu, "why": explain(ranking), **doc})

    def _rank(self, request: Request, policy: Policy | None, reserve: bool) -> Ranking:
        try:
            views = self.source.views()
        except RecordsUnavailable:
            self.metrics.records_up.set(0)
            raise
        self.metrics.records_up.set(1)
        self.metrics.nodes.set(len(views))
        started = time.perf_counter()
        with self._lock:
            now = self._clock()
            times = {v.record.node: v.record.timestamp for v in views}
            ranking = rank(
                views,
                request,
                policy or self.settings.policy,
                self.reservations.pending(times, now),
                max_age_s=self.settings.max_age_s,
                headroom=self.settings.headroom,
            )
            choice = ranking.choice
            if reserve and choice is not None and choice.gpu is not None:
                self.reservations.add(choice.node, choice.gpu, request.memory_bytes, now)
        self.metrics.rank_seconds.observe(time.perf_counter() - started)
        return ranking


def ranking_doc(ranking: Ranking, limit: int | None) -> dict[str, Any]:
    """The ranked list as JSON, best first (``limit`` candidates, or all)."""
    request = ranking.request
    candidates = ranking.candidates if limit is None else ranking.candidates[:limit]
    return {
        "policy": str(ranking.policy),
        "request": {
            "deadline_s": request.deadline_s,
            "memory_bytes": request.memory_bytes,
            "runtime_s": request.runtime_s,
            "gpu_model": request.gpu_model,
        },
        "candidates": len(ranking.candidates),
        "eligible": sum(c.eligible for c in ranking.candidates),
        "ranked": [c.to_json() for c in candidates],
    }


def explain(ranking: Ranking) -> str:
    """Why the first candidate was chosen, in one sentence."""
    c = ranking.choice
    if c is None:
        return "no eligible node"
    eligible = sum(x.eligible for x in ranking.candidates)
    free = f"{c.memory_free_bytes / GIB:.1f} GiB free"
    if ranking.policy is Policy.PAPER_C:
        float_time = "unbounded" if math.isinf(c.float_time_s) else f"{c.float_time_s:.1f}s"
        return (
            f"paper C: the most free GPU memory ({free}) of {eligible} nodes in state 1 "
            f"whose float time ({float_time}) exceeds the deadline"
        )
    parts = [f"state 1, {c.running_tasks} task(s) on the GPU (slowdown x{c.slowdown:.2f}"]
    if c.predicted_s is not None:
        parts[0] += f", predicted {c.predicted_s:.2f}s within {ranking.request.deadline_s:g}s"
    parts[0] += ")"
    parts.append(f"busy {c.busy_ratio:.0%}")
    parts.append(free)
    return f"gpuguard: {', '.join(parts)}; first of {eligible} eligible GPUs"


def describe(candidate: Candidate) -> str:
    """A candidate's reasons as text (``gpuguard nodes``)."""
    return ", ".join(str(r) for r in candidate.reasons) or "eligible"
