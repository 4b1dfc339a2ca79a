"""HTTP for the placer: a thin adapter from requests to ``service.Placer``'s handlers.

Routes: ``GET /api/v1/placement``, ``GET /api/v1/nodes`` (bearer token when
``--web.token-file`` is set, checked before anything else), ``GET /healthz``,
``GET /metrics``. Everything the API decides lives in ``service``; this module only maps
paths, checks the token and writes JSON, so it can move onto a shared server core.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpuguard.placer.service import Placer, Reply

log = logging.getLogger("gpuguard.placer.http")

_SOCKET_TIMEOUT_S = 10.0


class PlacerServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], placer: Placer, token: str | None) -> None:
        super().__init__(address, _Handler)
        self.placer = placer
        self.token = token
        self.routes: dict[str, tuple[str, Callable[[str], Reply]]] = {
            "/api/v1/placement": ("placement", placer.placement),
            "/api/v1/nodes": ("nodes", placer.nodes),
        }

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        thread.start()
        return thread

    def authorized(self, header: str) -> bool:
        if self.token is None:
            return True
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), self.token.encode()
        )


class _Handler(BaseHTTPRequestHandler):
    server: PlacerServer
    protocol_version = "HTTP/1.1"
    server_version = "gpuguard-placer"
    timeout = _SOCKET_TIMEOUT_S  # a client that stops sending does not hold a thread
    disable_nagle_algorithm = True

    def do_GET(self) -> None:  # http.server's naming
        url = urlsplit(self.path)
        route = self.server.routes.get(url.path)
        if route is not None:
            endpoint, handle = route
            if not self.server.authorized(self.headers.get("Authorization", "")):
                self.server.placer.metrics.requests.labels(endpoint, "401").inc()
                self._json(401, {"error": "missing or bad bearer token"})
                return
            reply = handle(url.query)
            self._json(reply.code, reply.doc)
        elif url.path == "/healthz":
            self._send(200, b"ok\n", "text/plain")
        elif url.path == "/metrics":
            body = generate_latest(self.server.placer.metrics.registry)
            self._send(200, body, CONTENT_TYPE_LATEST)
        else:
            self._json(404, {"error": "no such path"})

    def _refuse(self) -> None:
        self.close_connection = True
        self._json(405, {"error": "only GET"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def _json(self, code: int, doc: Any) -> None:
        self._send(code, json.dumps(doc).encode() + b"\n", "application/json")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if code == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away

    def log_message(self, format: str, *args: Any) -> None:  # base signature
        log.debug("%s %s", self.address_string(), format % args)
