"""The exporter's HTTP server: /metrics, /healthz, /api/v1/state, /api/v1/events.

Every handler reads the newest poll snapshot or the event log; none calls NVML or Docker.
``ThreadingHTTPServer`` with daemon threads, so a long-polling follower never blocks a
scrape and never holds the process open at exit.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpuguard.exporter.collector import TextRenderer
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.poller import Poller
from gpuguard.exporter.state import state_json

log = logging.getLogger(__name__)

EVENTS_TIMEOUT_DEFAULT_S = 10.0
EVENTS_TIMEOUT_MAX_S = 60.0
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


class BadRequest(ValueError):
    """A request parameter is invalid (answered 400 with a JSON error)."""


def parse_events_query(query: str) -> tuple[int, float]:
    """``since`` (int >= 0, default 0) and ``timeout`` (0..60 s, default 10) (pure)."""
    params = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(params) - {"since", "timeout"})
    if unknown:
        raise BadRequest(f"unknown parameter {unknown[0]!r}")
    since_text = params.get("since", ["0"])[-1]
    if not since_text.isdigit():
        raise BadRequest(f"since must be an integer >= 0, got {since_text!r}")
    timeout_text = params.get("timeout", [str(EVENTS_TIMEOUT_DEFAULT_S)])[-1]
    try:
        timeout = float(timeout_text)
    except ValueError:
        raise BadRequest(f"timeout must be a number of seconds, got {timeout_text!r}") from None
    if not 0 <= timeout <= EVENTS_TIMEOUT_MAX_S:  # also rejects nan
        raise BadRequest(f"timeout must be between 0 and {EVENTS_TIMEOUT_MAX_S:g} seconds")
    return int(since_text), timeout


class MetricsCache:
    """Renders /metrics once per poll generation, however many scrapers ask."""

    def __init__(self, poller: Poller) -> None:
        self._poller = poller
        self._renderer = TextRenderer()
        self._lock = threading.Lock()
        self._generation = -1
        self._body = b""

    def body(self) -> bytes:
        with self._lock:
            snap = self._poller.snapshot
            generation = snap.generation if snap is not None else 0
            if generation != self._generation:
                self._body = self._renderer.render_snapshot(snap)
                self._generation = generation
            return self._body


class ExporterHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], poller: Poller, events: EventLog) -> None:
        super().__init__(address, _Handler)
        self.poller = poller
        self.events = events
        self.metrics = MetricsCache(poller)


class _Handler(BaseHTTPRequestHandler):
    server: ExporterHTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "gpuguard-exporter"
    # Headers and body go out in two writes; without TCP_NODELAY, Nagle's algorithm holds
    # the body until the client's delayed ACK (about 40 ms) on a kept-alive connection.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        try:
            if url.path == "/metrics":
                self._send(200, self.server.metrics.body(), CONTENT_TYPE_METRICS)
            elif url.path == "/healthz":
                reason = self.server.poller.health()
                detail = reason or self.server.poller.degraded() or "ok"
                self._send(200 if reason is None else 503, f"{detail}\n".encode(), "text/plain")
            elif url.path == "/api/v1/state":
                snap = self.server.poller.snapshot
                if snap is None:
                    self._json(503, {"error": "no poll finished yet"})
                else:
                    self._json(200, state_json(snap))
            elif url.path == "/api/v1/events":
                since, timeout = parse_events_query(url.query)
                batch = self.server.events.since(since, timeout)
                body = {
                    "events": list(batch.events),
                    "next": batch.next,
                    "truncated": batch.truncated,
                }
                self._json(200, body)
            else:
                self._json(404, {"error": f"no such path {url.path}"})
        except BadRequest as exc:
            self._json(400, {"error": str(exc)})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (e.g. a follower gave up its long poll)

    def _json(self, code: int, doc: Any) -> None:
        self._send(code, json.dumps(doc, separators=(",", ":")).encode(), "application/json")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)
