"""The actuator's HTTP server: Alertmanager's webhook, health, node list and metrics.

``POST /api/v1/alerts`` answers what Alertmanager can act on: 401 without the right bearer
token, 415 when the content type or body is not JSON, 400 for a payload that breaks the
webhook contract (never retried), 503 only for faults a retry can cure (Docker or the exporter
unreachable), 200 otherwise, including alerts that need nothing done.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpuguard.actuator.controller import Controller
from gpuguard.actuator.errors import PayloadError
from gpuguard.actuator.webhook import parse_body, parse_message

log = logging.getLogger("gpuguard.actuator.http")

MAX_BODY_BYTES = 4 * 1024 * 1024


class ActuatorServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], controller: Controller, token: str | None):
        super().__init__(address, _Handler)
        self.controller = controller
        self.token = token

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="http", daemon=True
        )
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: ActuatorServer
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; without TCP_NODELAY, Nagle's algorithm and the
    # client's delayed ACK stall kept-alive replies by ~40 ms.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:  # http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/healthz":  # 200 while serving; the body says what is degraded
            self._reply(200, (self.server.controller.health() + "\n").encode(), "text/plain")
        elif path == "/api/v1/nodes":
            self._json(200, self.server.controller.node_doc())
        elif path == "/metrics":
            body = generate_latest(self.server.controller.metrics.registry)
            self._reply(200, body, CONTENT_TYPE_LATEST)
        else:
            self._json(404, {"error": f"no such path {path}"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path != "/api/v1/alerts":
            self._drain()
            self._json(404, {"error": f"no such path {path}"})
            return
        code, doc = self._alerts()
        self.server.controller.metrics.webhooks.labels(str(code)).inc()
        self._json(code, doc)

    def _alerts(self) -> tuple[int, dict[str, Any]]:
        body = self._drain()
        if not self._authorized():
            return 401, {"error": "missing or bad bearer token"}
        ctype = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            return 415, {"error": f"content type must be application/json, got {ctype or 'none'}"}
        if body is None:
            return 400, {"error": "body missing or larger than 4 MiB"}
        try:
            doc = parse_body(body)
        except ValueError as exc:
            return 415, {"error": str(exc)}
        try:
            message = parse_message(doc)
        except PayloadError as exc:
            log.warning("rejected webhook: %s", exc)
            return 400, {"error": str(exc)}
        report = self.server.controller.handle_webhook(message)
        if report.docker_down or report.exporter_down:
            return 503, {"error": "docker or exporter unavailable; retry", **report.to_doc()}
        return 200, {"status": "ok", **report.to_doc()}

    def _authorized(self) -> bool:
        token = self.server.token
        if token is None:
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), token.encode())

    def _drain(self) -> bytes | None:
        """Read the whole body (keeps the connection usable); None when absent or too big."""
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            return None
        return self.rfile.read(length) if length else None

    def _json(self, code: int, doc: Any) -> None:
        self._reply(code, json.dumps(doc).encode() + b"\n", "application/json")

    def _reply(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if code == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # base signature
        log.debug("%s %s", self.address_string(), format % args)
