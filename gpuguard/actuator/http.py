"""The actuator's HTTP endpoints: Alertmanager's webhook, health, node list and metrics.

``POST /api/v1/alerts`` answers what Alertmanager can act on: 401 without the right bearer
token and 415 without a JSON content type (both decided from the request head, before the
body is read), 413 for a body over 4 MiB, 415 when the body is not JSON, 400 for a payload
that breaks the webhook contract (never retried), 503 only for faults a retry can cure
(Docker or the exporter unreachable), 200 otherwise, including alerts that need nothing done.
The server core (``gpuguard.web``) gives every other bad request its 4xx.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from gpuguard import __version__
from gpuguard.actuator.controller import Controller
from gpuguard.actuator.errors import PayloadError
from gpuguard.actuator.webhook import parse_body, parse_message
from gpuguard.web import HttpServer, Limits, Request, Response, Router
from gpuguard.web.render import SharedRender, metrics_text
from gpuguard.web.routes import json_response, landing_page, text_response
from gpuguard.web.webconfig import WebConfigWatcher

log = logging.getLogger("gpuguard.actuator.http")

MAX_BODY_BYTES = 4 * 1024 * 1024


class ActuatorServer(HttpServer):
    """The actuator's routes on the shared server core; binds at construction."""

    def __init__(
        self,
        address: tuple[str, int],
        controller: Controller,
        token: str | None,
        limits: Limits | None = None,
        web: WebConfigWatcher | None = None,
    ) -> None:
        router = actuator_router(controller, token)
        super().__init__(address, router, limits, "gpuguard-actuator", web)


def actuator_router(controller: Controller, token: str | None) -> Router:
    router = Router(token)
    page = landing_page(
        "gpuguard actuator",
        __version__,
        [
            ("/metrics", "Prometheus metrics"),
            ("/healthz", "health"),
            ("/api/v1/nodes", "the node list (JSON)"),
            ("/api/v1/alerts", "Alertmanager's webhook (POST, bearer token)"),
        ],
    )
    webhooks = controller.metrics.webhooks

    def alerts(request: Request) -> Response:
        code, doc = handle_alerts(controller, request.body)
        return json_response(doc, code)

    router.get("/", lambda request: page)
    router.get("/healthz", lambda request: text_response(controller.health() + "\n"))
    router.get("/api/v1/nodes", lambda request: json_response(controller.node_doc()), compress=True)
    metrics = SharedRender(lambda: metrics_text(controller.metrics.registry))
    router.get(
        "/metrics",
        lambda request: Response(200, metrics.get(), CONTENT_TYPE_LATEST),
        compress=True,
    )
    router.post(
        "/api/v1/alerts",
        alerts,
        max_body=MAX_BODY_BYTES,
        observe=lambda code: webhooks.labels(str(code)).inc(),
    )
    return router


def handle_alerts(controller: Controller, body: bytes) -> tuple[int, dict[str, Any]]:
    """Status and reply for one authenticated JSON webhook body."""
    if not body:
        return 400, {"error": "request body missing"}
    try:
        doc = parse_body(body)
    except PayloadError as exc:
        return 400, {"error": str(exc)}
    except ValueError as exc:
        return 415, {"error": str(exc)}
    try:
        message = parse_message(doc)
    except PayloadError as exc:
        log.warning("rejected webhook: %s", exc)
        return 400, {"error": str(exc)}
    report = controller.handle_webhook(message)
    if report.docker_down or report.exporter_down:
        return 503, {"error": "docker or exporter unavailable; retry", **report.to_doc()}
    return 200, {"status": "ok", **report.to_doc()}
