"""The exporter's HTTP endpoints: /, /metrics, /healthz, /api/v1/state, /api/v1/events.

Every handler reads the newest poll snapshot or the event log; none calls NVML or Docker.
They run on the shared server core (``gpuguard.web``): /metrics and /api/v1/state are
rendered once per poll however many clients ask (and gzipped once when asked), and a
long-polling follower of /api/v1/events waits on the server's event loop, not in a thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from gpuguard import __version__
from gpuguard.exporter.collector import TextRenderer
from gpuguard.exporter.events import EventBatch, EventLog
from gpuguard.exporter.poller import Poller, PollSnapshot
from gpuguard.exporter.state import state_json
from gpuguard.labels import LabelError, ascii_int
from gpuguard.web import HttpError, HttpServer, Limits, Request, Response, Router
from gpuguard.web.routes import JSON, compressed, json_response, landing_page
from gpuguard.web.webconfig import WebConfigCollector, WebConfigWatcher

EVENTS_TIMEOUT_DEFAULT_S = 10.0
EVENTS_TIMEOUT_MAX_S = 60.0
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"
PROCESS_METRICS_MAX_AGE_S = 1.0  # process_* series in a cached /metrics body are this fresh
_SINCE_DIGITS = 19  # any int64 sequence number
_TIMEOUT_CHARS = 12


class BadRequest(ValueError):
    """A request parameter is invalid (answered 400 with a JSON error)."""


def parse_events_query(query: str) -> tuple[int, float]:
    """``since`` (int >= 0, default 0) and ``timeout`` (0..60 s, default 10) (pure)."""
    params = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(params) - {"since", "timeout"})
    if unknown:
        raise BadRequest(f"unknown parameter {unknown[0][:40]!r}")
    since_text = params.get("since", ["0"])[-1]
    try:
        since = ascii_int(since_text, _SINCE_DIGITS)
    except LabelError:
        raise BadRequest(f"since must be an integer >= 0, got {since_text[:40]!r}") from None
    timeout_text = params.get("timeout", [str(EVENTS_TIMEOUT_DEFAULT_S)])[-1]
    try:
        if len(timeout_text) > _TIMEOUT_CHARS or not timeout_text.isascii():
            raise ValueError(timeout_text)
        timeout = float(timeout_text)
    except ValueError:
        raise BadRequest(f"timeout must be seconds, got {timeout_text[:40]!r}") from None
    if not 0 <= timeout <= EVENTS_TIMEOUT_MAX_S:  # also rejects nan
        raise BadRequest(f"timeout must be between 0 and {EVENTS_TIMEOUT_MAX_S:g} seconds")
    return since, timeout


class SnapshotCache:
    """One rendering of the newest snapshot (and its gzip), however many clients ask.

    Rendered again when the poller has a new generation, or when the cached body is older
    than ``max_age_s`` (for parts that do not come from the snapshot, like process_*).
    """

    def __init__(
        self,
        poller: Poller,
        render: Callable[[PollSnapshot | None], bytes],
        max_age_s: float | None = None,
        version: Callable[[], int] = lambda: 0,
    ) -> None:
        self._poller = poller
        self._render = render
        self._max_age_s = max_age_s
        self._version = version
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._body = b""
        self._gzipped: bytes | None = None

    def get(self, gzip: bool = False) -> bytes:
        with self._lock:
            snap = self._poller.snapshot
            generation = snap.generation if snap is not None else 0
            age_bucket = 0 if self._max_age_s is None else int(time.monotonic() / self._max_age_s)
            key = (generation, age_bucket, self._version())
            if key != self._key:
                self._body = self._render(snap)
                self._gzipped = None
                self._key = key
            if not gzip:
                return self._body
            if self._gzipped is None:
                self._gzipped = compressed(self._body)
            return self._gzipped


class MetricsCache(SnapshotCache):
    """/metrics: the snapshot's families, then prometheus_client's ``process_*``."""

    def __init__(self, poller: Poller, web: WebConfigWatcher | None = None) -> None:
        renderer = TextRenderer()
        process = CollectorRegistry()
        ProcessCollector(registry=process)
        if web is not None:
            process.register(WebConfigCollector(web))

        def render(snap: PollSnapshot | None) -> bytes:
            return renderer.render_snapshot(snap) + generate_latest(process)

        super().__init__(poller, render, PROCESS_METRICS_MAX_AGE_S)

    def body(self) -> bytes:
        return self.get()


class EventWaiters:
    """Long polls waiting on the server's loop, woken when the event log grows."""

    def __init__(self, events: EventLog) -> None:
        self._events = events
        self._loop: asyncio.AbstractEventLoop | None = None
        self._futures: set[asyncio.Future[None]] = set()
        self._last_key: tuple[int, int] | None = None
        self._last_body = b""
        events.subscribe(self._appended)

    def body(self, since: int, batch: EventBatch) -> bytes:
        """The JSON reply for ``batch``: followers woken by one event share one rendering.

        (``since``, ``next``) decides the batch: the same newest seq means the same ring.
        """
        key = (since, batch.next)
        if self._last_key != key:
            doc = {"events": list(batch.events), "next": batch.next, "truncated": batch.truncated}
            self._last_body = json.dumps(doc, separators=(",", ":")).encode() + b"\n"
            self._last_key = key
        return self._last_body

    def _appended(self) -> None:  # the poller's (or Docker watcher's) thread
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the loop is closed: the server stopped
                pass

    def _wake(self) -> None:
        futures, self._futures = self._futures, set()
        for future in futures:
            if not future.done():
                future.set_result(None)

    async def wait(
        self, since: int, timeout: float, interrupt: asyncio.Future[None] | None = None
    ) -> EventBatch:
        """Events after ``since``: at once if there are some, else when one comes or time's up."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        deadline = loop.time() + timeout
        while True:
            future: asyncio.Future[None] = loop.create_future()
            self._futures.add(future)
            try:
                # read after registering: an append in between wakes this future
                batch = self._events.since(since)
                remaining = deadline - loop.time()
                stop = interrupt is not None and interrupt.done()
                if batch.events or batch.truncated or remaining <= 0 or stop:
                    return batch
                waiting = [future] if interrupt is None else [future, interrupt]
                await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._futures.discard(future)


def exporter_router(
    poller: Poller, events: EventLog, web: WebConfigWatcher | None = None
) -> Router:
    """The exporter's endpoints (docs/interfaces.md section 3); none needs a token (a web
    config's basic auth, when it has users, guards them all)."""
    metrics = MetricsCache(poller, web)

    # the activity and gauges as of now, not of the last poll: a client that follows an
    # edge on the event stream reads a state that shows it (rendered again on every event)
    def live_state(snap: PollSnapshot | None) -> bytes:
        return _state_body(poller.with_live_activity(snap))

    state = SnapshotCache(poller, live_state, version=lambda: events.seq)
    waiters = EventWaiters(events)
    router = Router()
    links = [
        ("/metrics", "Prometheus metrics"),
        ("/healthz", "health"),
        ("/api/v1/state", "containers, GPUs and tasks (JSON)"),
        ("/api/v1/events?since=0&timeout=0", "task and container events (JSON long poll)"),
    ]
    page = landing_page("gpuguard exporter", __version__, links)

    def metrics_handler(request: Request) -> Response:
        gzipped = metrics.get(gzip=True) if request.accepts_gzip else None
        return Response(200, metrics.get(), CONTENT_TYPE_METRICS, gzipped=gzipped)

    def health_handler(request: Request) -> Response:
        why = poller.health()
        detail = why or poller.degraded() or "ok"  # 200 with a reason: degraded, not down
        return Response(200 if why is None else 503, f"{detail}\n".encode())

    def state_handler(request: Request) -> Response:
        if poller.snapshot is None:
            return json_response({"error": "no poll finished yet"}, 503)
        gzipped = state.get(gzip=True) if request.accepts_gzip else None
        return Response(200, state.get(), JSON, gzipped=gzipped)

    async def events_handler(request: Request) -> Response:
        try:
            since, timeout = parse_events_query(request.query)
        except BadRequest as exc:
            raise HttpError(400, str(exc)) from None
        batch = await waiters.wait(since, timeout, request.interrupt)
        return Response(200, waiters.body(since, batch), JSON)

    router.get("/", lambda request: page)
    router.get("/metrics", metrics_handler, compress=True)
    router.get("/healthz", health_handler)
    router.get("/api/v1/state", state_handler, compress=True)
    router.get("/api/v1/events", events_handler, compress=True, interruptible=True)
    return router


def _state_body(snap: PollSnapshot | None) -> bytes:
    if snap is None:
        return b""
    return json.dumps(state_json(snap), separators=(",", ":")).encode()


def exporter_server(
    address: tuple[str, int],
    poller: Poller,
    events: EventLog,
    limits: Limits | None = None,
    web: WebConfigWatcher | None = None,
) -> HttpServer:
    """Bind the exporter's server (``OSError`` when the address is taken)."""
    router = exporter_router(poller, events, web)
    return HttpServer(address, router, limits, name="gpuguard-exporter", web=web)
