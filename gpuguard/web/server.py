"""One asyncio loop serving a ``Router`` over HTTP/1.1, in a thread of its own.

h11 does the framing; the I/O, caps and timeouts are here. Plain handlers run in a small
thread pool, ``async`` ones (long polls) on the loop. Per connection it guarantees: a
request head within ``header_timeout_s`` (else 408), an idle kept-alive connection closed
after ``idle_timeout_s``, a body within ``body_timeout_s`` (408) and never buffered beyond
the route's ``max_body``; token, content type and length checked from the head before any
body byte (401/415/413); a 4xx for every bad request and ``Connection: close`` on every
reply after which it closes. At ``max_connections`` a newcomer replaces the oldest
connection still waiting for a head, else ends the oldest interruptible long poll, else
gets 503; accept errors back off. With a web config (``webconfig.py``) TLS handshakes and
basic auth obey the same bounds, and a changed file applies to the next handshake and
request. Why this and not ``http.server``: docs/design-notes.md, "HTTP (exporter,
actuator, placer)".
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import resource
import socket
import ssl
import threading
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import h11

from gpuguard.web.routes import (
    JSON,
    HttpError,
    Request,
    Response,
    Route,
    Router,
    bearer_matches,
    encode,
    error_response,
    json_response,
    media_type,
    reason,
)
from gpuguard.web.webconfig import BasicAuth, WebConfig, WebConfigWatcher, parse_basic
from gpuguard.web.wire import Wire

log = logging.getLogger("gpuguard.web")

_RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
READ_CHUNK = 32 * 1024  # the shared receive buffer: the most one socket read brings
STREAM_LIMIT = 32 * 1024  # bytes queued per connection before reading from it pauses
NOFILE_TARGET = 65536
MAX_PENDING_BCRYPT = 64  # basic-auth checks waiting for the one bcrypt thread


@dataclass(frozen=True)
class Limits:
    """Caps and timeouts of one server (defaults suit the exporter and the actuator)."""

    max_connections: int = 4096
    backlog: int = 1024
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    body_timeout_s: float = 10.0
    write_timeout_s: float = 10.0
    linger_s: float = 5.0
    linger_bytes: int = 8 * 1024 * 1024
    max_head_bytes: int = 16 * 1024
    workers: int = 8
    fd_reserve: int = 64


def connection_cap(limits: Limits, nofile: int) -> int:
    """Connections allowed at once: the configured cap, below the file limit (pure)."""
    return max(16, min(limits.max_connections, nofile - limits.fd_reserve))


def raise_nofile_limit(target: int = NOFILE_TARGET) -> int:
    """Raise the soft file limit towards the hard one (as Go does); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, want, exc)
    return NOFILE_TARGET if soft == resource.RLIM_INFINITY else soft


class _SlowHead(Exception):
    """Part of a request head came, the rest not within the header timeout."""


class _Conn:
    """One client connection and what the server may do to it."""

    __slots__ = (
        "broken", "certificate", "close_after", "evicted", "id", "interrupt", "peer", "wire",
    )  # fmt: skip

    def __init__(self, conn_id: int, wire: Wire):
        self.id = conn_id
        self.wire = wire
        peer = wire.transport.get_extra_info("peername") if wire.transport else None
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        # only a verified certificate is seen here (Python's ssl returns {} otherwise)
        cert = wire.transport.get_extra_info("peercert") if wire.transport else None
        self.certificate = certificate_name(cert)
        self.interrupt: asyncio.Future[None] | None = None
        self.close_after = False  # answer the request in progress, then close
        self.evicted = False
        self.broken = False  # a write timed out: abort instead of a graceful close


class HttpServer:
    """Binds at construction (so a busy port fails at once), serves after ``serve_in_thread``."""

    def __init__(
        self,
        address: tuple[str, int],
        router: Router,
        limits: Limits | None = None,
        name: str = "gpuguard",
        web: WebConfigWatcher | None = None,
    ) -> None:
        self.router = router
        self.web = web
        self.basic_auth = BasicAuth()
        self._bcrypt = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-bcrypt")
        self._bcrypt_pending = 0
        self._handshakes = 0
        self.limits = limits or Limits()
        self.name = name
        self._sock = _listen(address, self.limits.backlog)
        self.server_address: tuple[str, int] = self._sock.getsockname()[:2]
        self.cap = connection_cap(self.limits, raise_nofile_limit())
        self.counters: Counter[str] = Counter()  # accepted, evicted, interrupted, rejected, ...
        self._pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix=f"{name}-handler")
        self._conns: dict[int, _Conn] = {}
        self._waiting: OrderedDict[int, _Conn] = OrderedDict()  # oldest first
        self._polls: OrderedDict[int, _Conn] = OrderedDict()
        self._ids = itertools.count()
        self._scratch = bytearray(READ_CHUNK)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def serve_in_thread(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-http", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self._thread

    def shutdown(self) -> None:
        """Stop accepting, end long polls and idle connections, wait briefly for the rest."""
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._bcrypt.shutdown(wait=False, cancel_futures=True)

    def server_close(self) -> None:
        self._sock.close()

    # --- loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("%s: HTTP server loop failed", self.name)
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._sock.setblocking(False)
        accepting = asyncio.create_task(self._accept_loop())
        self._ready.set()
        await self._stop.wait()
        accepting.cancel()
        self._sock.close()
        self._closing = True
        for conn in list(self._polls.values()):
            self._interrupt(conn)
        for conn in list(self._waiting.values()):
            conn.wire.close()
        deadline = self._loop.time() + 2.0
        while self._conns and self._loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self._conns.values()):
            conn.wire.abort()

    async def _accept_loop(self) -> None:
        """One accept at a time, so evictions keep up and descriptors stay under the cap.

        (asyncio's own server accepts up to ``backlog`` connections per tick, and on EMFILE
        goes on trying, logging a traceback and scheduling a retry for each: a spin.)
        """
        loop = asyncio.get_running_loop()
        backoff = 0.0
        while True:
            try:
                sock, _ = await loop.sock_accept(self._sock)
            except OSError as exc:
                if exc.errno not in _RESOURCE_ERRNOS:
                    raise
                self.counters["accept_errors"] += 1
                if self._waiting and self._make_room():
                    await asyncio.sleep(0.01)  # an idle connection gives its descriptor back
                    continue
                if not backoff:
                    log.warning("%s: cannot accept (%s): backing off", self.name, exc.strerror)
                backoff = min(1.0, (backoff or 0.05) * 2)
                await asyncio.sleep(backoff)
                continue
            backoff = 0.0
            context = self._web_config().context
            if context is not None:
                self._start_handshake(sock, context)
                continue
            try:
                await loop.connect_accepted_socket(self._new_wire, sock)
            except OSError:
                sock.close()

    def _web_config(self) -> WebConfig:
        return self.web.current() if self.web is not None else _PLAIN

    def _start_handshake(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        """TLS: the handshake runs in a task of its own, so a client that stalls in it holds
        neither the accept loop nor more than ``header_timeout_s``; at most ``cap`` at once."""
        if self._handshakes >= self.cap:
            self.counters["rejected"] += 1
            sock.close()
            return
        self._handshakes += 1
        task = asyncio.get_running_loop().create_task(self._handshake(sock, context))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handshake(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                self._new_wire,
                sock,
                ssl=context,
                ssl_handshake_timeout=self.limits.header_timeout_s,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            self.counters["tls_handshake_errors"] += 1
            if self.web is not None:
                self.web.tls_refused["handshake"] += 1
            log.debug("%s: TLS handshake failed: %s", self.name, exc)
            sock.close()
        finally:
            self._handshakes -= 1

    def _new_wire(self) -> Wire:
        return Wire(self._scratch, STREAM_LIMIT, self._start_connection)

    def _start_connection(self, wire: Wire) -> None:
        tls = self._web_config().tls
        transport = wire.transport
        # after the handshake, before any request: the SANs the web config allows
        if tls is not None and transport and not tls.admits(transport.get_extra_info("peercert")):
            self.counters["tls_client_refused"] += 1
            if self.web is not None:
                self.web.tls_refused["client_san"] += 1
            wire.abort()
            return
        task = asyncio.get_running_loop().create_task(self._on_connection(wire))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_connection(self, wire: Wire) -> None:
        conn = _Conn(next(self._ids), wire)
        self._conns[conn.id] = conn
        self.counters["accepted"] += 1
        try:
            if len(self._conns) > self.cap and not self._make_room():
                self.counters["rejected"] += 1
                await self._send_raw(conn, 503, "too many connections", (("Retry-After", "1"),))
                await self._linger(conn)
            else:
                await self._serve(conn)
        except (ConnectionError, TimeoutError):
            conn.broken = True
        except Exception:
            conn.broken = True
            log.exception("%s: connection %d failed", self.name, conn.id)
        finally:
            self._conns.pop(conn.id, None)
            self._waiting.pop(conn.id, None)
            self._polls.pop(conn.id, None)
            if conn.broken:
                wire.abort()
            else:
                wire.close()

    def _make_room(self) -> bool:
        """Free a place for a new connection; False when every connection is busy."""
        if self._waiting:
            _, victim = self._waiting.popitem(last=False)
            victim.evicted = True
            victim.wire.close()  # what its idle or header timeout would have done
            self.counters["evicted"] += 1
            return True
        for victim in self._polls.values():
            if victim.interrupt is not None and not victim.interrupt.done():
                self._interrupt(victim)
                self.counters["interrupted"] += 1
                return True
        return False

    @staticmethod
    def _interrupt(conn: _Conn) -> None:
        conn.close_after = True
        if conn.interrupt is not None and not conn.interrupt.done():
            conn.interrupt.set_result(None)

    # --- one connection -------------------------------------------------------------------

    async def _serve(self, conn: _Conn) -> None:
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head_bytes)
        first = True
        while not self._closing:
            self._waiting[conn.id] = conn
            try:
                head = await self._read_head(h, conn, first)
            except h11.RemoteProtocolError as exc:
                if not conn.evicted:
                    await self._send_raw(conn, exc.error_status_hint, f"bad request: {exc}")
                    await self._linger(conn)
                return
            except _SlowHead:
                self.counters["slow_head"] += 1
                await self._send_raw(conn, 408, "request head not received in time")
                await self._linger(conn)
                return
            finally:
                self._waiting.pop(conn.id, None)
            if head is None or conn.evicted:
                return
            if not await self._exchange(h, conn, head):
                return
            h.start_next_cycle()
            first = False

    async def _read_head(self, h: h11.Connection, conn: _Conn, first: bool) -> h11.Request | None:
        """The next request head; None when the client closed or stayed idle too long."""
        loop = asyncio.get_running_loop()
        limits = self.limits
        idle_deadline = loop.time() + (limits.header_timeout_s if first else limits.idle_timeout_s)
        head_deadline: float | None = None
        got = 0
        if h.trailing_data[0]:
            head_deadline = loop.time() + limits.header_timeout_s
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                deadline = idle_deadline if head_deadline is None else head_deadline
                try:
                    async with asyncio.timeout_at(deadline):
                        # h11 measures only what it holds incomplete: never hand it more
                        # than the head limit (+1, to trip it) in one cycle
                        data = await conn.wire.read(max(1, limits.max_head_bytes + 1 - got))
                except TimeoutError:
                    if head_deadline is None:
                        return None  # idle: close quietly, as HTTP allows
                    raise _SlowHead from None
                if data and head_deadline is None:
                    started = loop.time()
                    head_deadline = idle_deadline if first else started + limits.header_timeout_s
                got += len(data)
                h.receive_data(data)  # b"" is end of stream
                continue
            if isinstance(event, h11.Request):
                return event
            return None  # ConnectionClosed, or PAUSED after a close

    async def _exchange(self, h: h11.Connection, conn: _Conn, head: h11.Request) -> bool:
        """Answer one request; True when the connection may carry the next one."""
        request = _request(head)
        request.peer = conn.peer
        route: Route | None = None
        try:
            web = self._web_config()
            try:
                route = self.router.resolve(request.method, request.path)
            except HttpError:
                if web.users:  # who asks comes first, as in exporter-toolkit: before a 404
                    await self._check_basic(web, request)
                raise
            who = await self._check_basic(web, request) if web.users else ""
            _check_head(self.router, route, request, bool(web.users))
            request.credential = who or _credential(self.router, request, conn)
            request.body = await self._read_body(h, conn, route, request)
            response = await self._call(route, request, conn)
        except HttpError as exc:
            response = error_response(exc)
        except h11.RemoteProtocolError as exc:
            response = error_response(HttpError(exc.error_status_hint, f"bad request: {exc}"))
        if route is not None and route.observe is not None:
            route.observe(response.status)
        response = encode(response, route, request)
        body_read = _finish_empty_body(h)
        keep = body_read and not (self._closing or conn.close_after)
        if h.their_state is h11.ERROR:
            await self._send_raw(conn, response.status, "", response=response)
            return False
        await self._send(h, conn, request.method, response, keep)
        if not keep:
            if not body_read:
                await self._linger(conn)
            return False
        return h.our_state is h11.DONE and h.their_state is h11.DONE

    async def _check_basic(self, web: WebConfig, request: Request) -> str:
        """Basic auth against the web config's users, or the router's bearer token; the
        credential that passed (``Request.credential``)."""
        header = request.headers.get("authorization")
        if self.router.token is not None and bearer_matches(header, self.router.token):
            return BEARER
        credentials = parse_basic(header)
        if credentials is not None:
            outcome = self.basic_auth.cached(web.users, *credentials)
            if outcome is None:
                if self._bcrypt_pending >= MAX_PENDING_BCRYPT:
                    raise HttpError(503, "too many logins at once", (("Retry-After", "1"),))
                self._bcrypt_pending += 1
                try:
                    loop = asyncio.get_running_loop()
                    check = self.basic_auth.check
                    outcome = await loop.run_in_executor(
                        self._bcrypt, check, web.users, *credentials
                    )
                finally:
                    self._bcrypt_pending -= 1
            if outcome:
                return f"user {credentials[0]}"
        self.counters["unauthorized"] += 1
        raise HttpError(401, "missing or bad credentials", (("WWW-Authenticate", "Basic"),))

    async def _read_body(
        self, h: h11.Connection, conn: _Conn, route: Route, request: Request
    ) -> bytes:
        """The request body, bounded in size and time; only called once the head passed."""
        headers = request.headers
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        try:
            length = int(headers.get("content-length", "0") or "0")
        except ValueError:
            raise HttpError(400, "bad Content-Length") from None
        if route.max_body == 0 and (chunked or length):
            raise HttpError(413, "this endpoint takes no request body")
        if length > route.max_body:
            raise HttpError(413, f"request body larger than {route.max_body} bytes")
        if h.they_are_waiting_for_100_continue:
            await self._write(conn, h.send(h11.InformationalResponse(status_code=100, headers=[])))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout_s
        chunks: list[bytes] = []
        size = 0
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                try:
                    async with asyncio.timeout_at(deadline):
                        data = await conn.wire.read(READ_CHUNK)
                except TimeoutError:
                    raise HttpError(408, "request body not received in time") from None
                h.receive_data(data)
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > route.max_body:
                    raise HttpError(413, f"request body larger than {route.max_body} bytes")
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            else:
                raise HttpError(400, "incomplete request body")

    async def _call(self, route: Route, request: Request, conn: _Conn) -> Response:
        try:
            if not route.is_async:
                loop = asyncio.get_running_loop()
                call = cast(Callable[[Request], Response], route.handler)
                return await loop.run_in_executor(self._pool, call, request)
            if route.interruptible:
                conn.interrupt = request.interrupt = asyncio.get_running_loop().create_future()
                self._polls[conn.id] = conn
                if self._closing:
                    self._interrupt(conn)
            try:
                return await cast(Callable[[Request], Awaitable[Response]], route.handler)(request)
            finally:
                self._polls.pop(conn.id, None)
                conn.interrupt = None
        except HttpError:
            raise
        except Exception:
            log.exception("%s: %s %s failed", self.name, request.method, request.path)
            return json_response({"error": "internal error"}, 500)

    # --- writing ----------------------------------------------------------------------------

    async def _send(
        self, h: h11.Connection, conn: _Conn, method: str, response: Response, keep: bool
    ) -> None:
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            ("Server", self.name),
            *response.headers,
            *self._web_config().headers,
        ]
        if not keep:
            headers.append(("Connection", "close"))
        status_line = h11.Response(
            status_code=response.status, headers=headers, reason=reason(response.status).encode()
        )
        data = h.send(status_line) or b""
        if method != "HEAD" and response.body:
            data += h.send(h11.Data(data=response.body)) or b""
        data += h.send(h11.EndOfMessage()) or b""
        await self._write(conn, data)

    async def _send_raw(
        self,
        conn: _Conn,
        status: int,
        message: str,
        headers: tuple[tuple[str, str], ...] = (),
        response: Response | None = None,
    ) -> None:
        """A closing reply written without h11 (its state machine is in error or unused)."""
        if response is None:
            response = error_response(HttpError(status, message, headers))
        lines = [
            f"HTTP/1.1 {response.status} {reason(response.status)}",
            f"Content-Type: {response.content_type or JSON}",
            f"Content-Length: {len(response.body)}",
            f"Server: {self.name}",
            "Connection: close",
            *(f"{k}: {v}" for k, v in (*response.headers, *self._web_config().headers)),
        ]
        await self._write(conn, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body)

    async def _write(self, conn: _Conn, data: bytes) -> None:
        conn.wire.write(data)
        try:
            async with asyncio.timeout(self.limits.write_timeout_s):
                await conn.wire.drain()
        except TimeoutError:
            conn.broken = True
            raise

    async def _linger(self, conn: _Conn) -> None:
        """Half-close and discard what the client still sends, so it reads our answer."""
        try:
            async with asyncio.timeout(self.limits.linger_s):
                await conn.wire.discard(self.limits.linger_bytes)
        except (TimeoutError, OSError, RuntimeError):
            return


_PLAIN = WebConfig()


def _listen(address: tuple[str, int], backlog: int) -> socket.socket:
    host, port = address
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return socket.create_server((host, port), family=infos[0][0], backlog=backlog)


def _request(head: h11.Request) -> Request:
    headers: dict[str, str] = {}
    for name, value in head.headers:
        key = name.decode("latin-1")
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    target = urlsplit(head.target.decode("latin-1"))
    return Request(head.method.decode("latin-1"), target.path or "/", target.query, headers)


BEARER = "the bearer token"


def _credential(router: Router, request: Request, conn: _Conn) -> str:
    """What the request proved without basic auth: the token, else a verified certificate."""
    header = request.headers.get("authorization")
    if router.token is not None and bearer_matches(header, router.token):
        return BEARER
    return f"certificate {conn.certificate}" if conn.certificate else ""


def certificate_name(peercert: object) -> str:
    """A verified client certificate's common name, else its first SAN; empty for none."""
    if not isinstance(peercert, dict) or not peercert:
        return ""
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return str(value)
    sans = peercert.get("subjectAltName", ())
    return str(sans[0][1]) if sans else ""


def _check_head(router: Router, route: Route, request: Request, authenticated: bool) -> None:
    """What can be refused from the head alone, in Alertmanager's order: 401, then 415.

    ``authenticated``: basic auth already admitted the request (or the token did), which
    stands in for the token on routes that want it."""
    if route.auth and not authenticated and not router.authorized(request.headers):
        raise HttpError(401, "missing or bad bearer token", (("WWW-Authenticate", "Bearer"),))
    if route.content_types:
        given = media_type(request.headers.get("content-type"))
        if given not in route.content_types:
            wanted = " or ".join(sorted(route.content_types))
            raise HttpError(415, f"content type must be {wanted}, got {given or 'none'}")


def _finish_empty_body(h: h11.Connection) -> bool:
    """Consume an empty request body's end; False when body bytes were left unread."""
    if h.their_state is h11.SEND_BODY:
        try:
            event = h.next_event()
        except h11.RemoteProtocolError:
            return False
        return isinstance(event, h11.EndOfMessage)
    return h.their_state is h11.DONE
