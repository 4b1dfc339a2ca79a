"""The actuator's HTTP client of the exporter's ``/api/v1/state`` and ``/api/v1/events``.

The only place that talks HTTP to the exporter: it translates ``requests`` errors into
``ExporterUnavailable`` and hands the documents to the shared reader,
``gpuguard/statedoc.py``.
"""

from __future__ import annotations

from typing import Any

import requests

from gpuguard.actuator.errors import ExporterUnavailable, StateError
from gpuguard.actuator.state import EventBatch, ExporterState, parse_events, parse_state
from gpuguard.web import client
from gpuguard.web.client import ClientConfig


class ExporterClient:
    """HTTP client of the exporter's JSON API: pooled keep-alive connections, short timeouts.

    Thread-safe for these GETs (urllib3's pool). A kept-alive connection that the server
    closes (idle timeout) just as it is reused fails without an answer; GET is idempotent,
    so such a request is sent once more on a fresh connection. Timeouts are not retried.
    """

    def __init__(
        self, base_url: str, timeout_s: float = 2.0, tls_auth: ClientConfig = client.NONE
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.session = tls_auth.session()  # https and basic auth (--exporter.http-config-file)
        self.retries = 0  # requests sent again after a connection failed without an answer

    def state(self) -> ExporterState:
        """A fresh snapshot; raises ``ExporterUnavailable`` or ``StateError``."""
        return parse_state(self._get("/api/v1/state", {}, self.timeout_s))

    def events(self, since: int, timeout: float) -> EventBatch:
        """Long poll for events after ``since`` (the server waits up to ``timeout`` s)."""
        params = {"since": str(since), "timeout": f"{timeout:g}"}
        return parse_events(self._get("/api/v1/events", params, timeout + self.timeout_s))

    def _get(self, path: str, params: dict[str, str], timeout: float) -> Any:
        try:
            reply = self._send(self.base_url + path, params, timeout)
        except requests.RequestException as exc:
            raise ExporterUnavailable(f"exporter {self.base_url}: {exc}") from exc
        if reply.status_code != 200:
            raise ExporterUnavailable(f"exporter {path}: HTTP {reply.status_code}")
        try:
            return reply.json()
        except ValueError as exc:
            raise StateError(f"exporter {path}: not JSON") from exc

    def _send(self, url: str, params: dict[str, str], timeout: float) -> requests.Response:
        try:
            return self.session.get(url, params=params, timeout=timeout)
        except requests.ConnectionError as exc:
            if isinstance(exc, requests.Timeout):
                raise
            self.retries += 1
            return self.session.get(url, params=params, timeout=timeout)

    def close(self) -> None:
        self.session.close()
