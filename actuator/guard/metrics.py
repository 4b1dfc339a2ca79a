"""The guard's own ``/metrics`` (Prometheus job ``gpuguard-guard``, docs/interfaces.md §8).

Served on loopback by default, read-only (no token); if it cannot bind, the guard logs it
and guards on. Why it is scraped: docs/design-notes.md, "The guard's metrics". Sample::

    # HELP gpuguard_guard_actuator The actuator alive, stuck or gone, as the guard sees it.
    # TYPE gpuguard_guard_actuator gauge
    gpuguard_guard_actuator{state="alive"} 1.0
    gpuguard_guard_actuator_lease_age_seconds 0.4
    gpuguard_guard_journal_paused_containers 2.0
    gpuguard_guard_docker_up 1.0
    gpuguard_guard_last_check_timestamp_seconds 1.7e+09
    gpuguard_guard_resumed_total 3.0
    gpuguard_guard_state_write_failures_total{file="lease",reason="no_space"} 0.0
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuguard import __version__
from gpuguard.actuator.safety.statewrites import StateWrites, failures_family
from gpuguard.web import HttpServer, Response, Router
from gpuguard.web.routes import landing_page, text_response
from gpuguard.web.webconfig import WebConfigCollector, WebConfigWatcher

log = logging.getLogger("gpuguard.guard")

VERDICTS = ("alive", "stuck", "gone")


@dataclass
class Seen:
    """What the guard saw at its last check."""

    actuator_lease_age_s: float = math.inf
    journal_paused: int = 0
    docker_down: bool = False
    last_check: float = 0.0
    resumed: int = 0


class Watching(Protocol):
    """The guard, as its metrics see it."""

    @property
    def verdict(self) -> str: ...

    @property
    def seen(self) -> Seen: ...

    @property
    def writes(self) -> StateWrites: ...


class GuardCollector(Collector):
    """Fresh families from the guard's last check, on every scrape."""

    def __init__(self, guard: Watching) -> None:
        self.guard = guard

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        return iter(self._families())

    def _families(self) -> list[Metric]:
        seen = self.guard.seen
        state = GaugeMetricFamily(
            "gpuguard_guard_actuator",
            "The actuator alive, stuck or gone, as the guard sees it.",
            labels=["state"],
        )
        for verdict in VERDICTS:
            state.add_metric([verdict], 1.0 if self.guard.verdict == verdict else 0.0)
        return [
            state,
            GaugeMetricFamily(
                "gpuguard_guard_actuator_lease_age_seconds",
                "Seconds since the actuator renewed its lease (+Inf: never).",
                value=seen.actuator_lease_age_s,
            ),
            GaugeMetricFamily(
                "gpuguard_guard_journal_paused_containers",
                "Containers the journal says are paused, at the guard's last check.",
                value=seen.journal_paused,
            ),
            GaugeMetricFamily(
                "gpuguard_guard_docker_up",
                "1 while the Docker engine answers the guard.",
                value=0.0 if seen.docker_down else 1.0,
            ),
            GaugeMetricFamily(
                "gpuguard_guard_last_check_timestamp_seconds",
                "When the guard last looked at the actuator (a stuck guard stops it).",
                value=seen.last_check,
            ),
            CounterMetricFamily(
                "gpuguard_guard_resumed",
                "Containers the guard resumed.",
                value=seen.resumed,
            ),
            failures_family("gpuguard_guard_state_write_failures", self.guard.writes),
        ]


def guard_router(guard: Watching, web: WebConfigWatcher | None = None) -> Router:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(GuardCollector(guard))
    if web is not None:
        registry.register(WebConfigCollector(web))
    router = Router(None)
    page = landing_page(
        "gpuguard guard", __version__, [("/metrics", "Prometheus metrics"), ("/healthz", "health")]
    )
    router.get("/", lambda request: page)
    router.get("/healthz", lambda request: text_response("ok\n"))
    router.get(
        "/metrics",
        lambda request: Response(200, generate_latest(registry), CONTENT_TYPE_LATEST),
        compress=True,
    )
    return router


def guard_server(
    guard: Watching, host: str, port: int, web: WebConfigWatcher | None = None
) -> HttpServer | None:
    """The guard's metrics server (TLS and basic auth by ``web``, the --web.config.file),
    serving; None (logged) when it cannot listen."""
    try:
        server = HttpServer((host, port), guard_router(guard, web), name="gpuguard-guard", web=web)
    except OSError as exc:
        log.error(
            "cannot serve /metrics on %s:%d (%s): guarding on without them; "
            "GpuguardGuardMissing will fire", host, port, exc.strerror,
        )  # fmt: skip
        return None
    server.serve_in_thread()
    return server
