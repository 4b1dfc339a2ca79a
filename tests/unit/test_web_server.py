"""The HTTP server core over real loopback sockets, in-process, with short limits.

Timeouts here are a fraction of a second so that slow-loris, idle and slow-body handling
run fast; the integration tests check the real services with their defaults.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gpuguard.web import HttpServer, Limits, Request, Response, Router
from gpuguard.web.routes import json_response

TOKEN = "s3cret"
SHORT = Limits(
    max_connections=20,
    header_timeout_s=0.4,
    idle_timeout_s=0.4,
    body_timeout_s=0.4,
    linger_s=0.5,
    workers=2,
    fd_reserve=0,
)


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def closes(self) -> bool:
        return self.headers.get("connection", "").lower() == "close"


class Client:
    """A raw HTTP/1.1 client connection that keeps what it read past one reply."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=5)
        self.buffer = b""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {self.buffer!r}")
        self.buffer += chunk

    def recv_until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            self._fill()
        data, _, self.buffer = self.buffer.partition(marker)
        return data + marker

    def reply(self) -> Reply:
        """One response (the servers always send Content-Length); skips a 100 Continue."""
        head = self.recv_until(b"\r\n\r\n").decode("latin-1")
        lines = head.strip().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return self.reply() if status == 100 else Reply(status, headers, body)

    def closed_by_peer(self, within: float = 3.0) -> bool:
        self.sock.settimeout(within)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


@pytest.fixture
def served() -> Iterator[tuple[HttpServer, dict[str, threading.Event]]]:
    gates = {"release": threading.Event(), "entered": threading.Event()}
    router = Router(token=TOKEN)
    router.get("/hello", lambda request: json_response({"hello": request.query}), compress=True)

    def boom(request: Request) -> Response:
        raise RuntimeError("handler bug")

    def block(request: Request) -> Response:
        gates["entered"].set()
        gates["release"].wait(10)
        return json_response({"released": True})

    async def poll(request: Request) -> Response:
        assert request.interrupt is not None
        await asyncio.wait([request.interrupt], timeout=30)
        return json_response({"interrupted": request.interrupt.done()})

    router.get("/boom", boom)
    router.get("/block", block)
    router.get("/poll", poll, interruptible=True)
    router.post("/echo", lambda request: Response(200, request.body), max_body=1000)
    server = HttpServer(("127.0.0.1", 0), router, SHORT)
    server.serve_in_thread()
    yield server, gates
    gates["release"].set()
    server.shutdown()
    server.server_close()


def connect(server: HttpServer) -> Client:
    return Client(server.server_address)


def get(path: str, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n".encode()


def post(path: str, body: bytes, *headers: str, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    extra = "".join(f"{h}\r\n" for h in headers)
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {size}\r\n{extra}\r\n"
    return head.encode() + body


AUTH = ("Authorization: Bearer s3cret", "Content-Type: application/json")


def test_keep_alive_serves_many_requests_then_says_close(served: tuple[HttpServer, dict]) -> None:
    server, _ = served
    with connect(server) as sock:
        for i in range(50):
            sock.sendall(get(f"/hello?n={i}"))
            reply = sock.reply()
            assert reply.status == 200 and not reply.closes
            assert reply.body == b'{"hello":"n=%d"}\n' % i
        sock.sendall(get("/hello", "Connection: close"))
        assert sock.reply().closes
        assert sock.closed_by_peer()


def test_http10_and_pipelined_requests(served: tuple[HttpServer, dict]) -> None:
    server, _ = served
    with connect(server) as sock:
        sock.sendall(get("/hello?a") + get("/hello?b"))
        assert [sock.reply().body for _ in range(2)] == [b'{"hello":"a"}\n', b'{"hello":"b"}\n']
    with connect(server) as sock:
        sock.sendall(b"GET /hello HTTP/1.0\r\n\r\n")
        assert sock.reply().closes and sock.closed_by_peer()


def test_errors_keep_the_connection_when_the_request_was_whole(served: tuple[HttpServer, dict]):
    server, _ = served
    with connect(server) as sock:
        sock.sendall(get("/nope"))
        assert sock.reply().status == 404
        sock.sendall(post("/hello", b""))
        reply = sock.reply()
        assert reply.status == 405 and reply.headers["allow"] == "GET, HEAD"
        sock.sendall(get("/boom"))
        reply = sock.reply()
        assert reply.status == 500 and reply.body == b'{"error":"internal error"}\n'
        sock.sendall(get("/hello"))
        assert sock.reply().status == 200


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n", 400),
        (b"GET /hello HTTP/1.1\r\nHost: t\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431),
        (b"GET /hello HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc", 413),
        (b"GET /hello HTTP/1.1\r\nHost: t\r\nContent-Length: x\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc", 401),
    ],
)
def test_bad_requests_get_a_4xx_not_a_dropped_connection(
    served: tuple[HttpServer, dict], request_bytes: bytes, status: int
) -> None:
    server, _ = served
    with connect(server) as sock:
        sock.sendall(request_bytes)
        reply = sock.reply()
        assert reply.status == status and b"error" in reply.body
        assert reply.closes


def test_bad_chunked_body_is_a_400(served: tuple[HttpServer, dict]) -> None:
    server, _ = served
    with connect(server) as sock:
        head = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
        sock.sendall((head + "\r\n".join(AUTH) + "\r\n\r\nzz\r\nhello\r\n").encode())
        reply = sock.reply()
        assert reply.status == 400 and reply.closes


def test_chunked_body_within_the_limit_is_read(served: tuple[HttpServer, dict]) -> None:
    server, _ = served
    with connect(server) as sock:
        head = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
        body = "5\r\nhello\r\n0\r\n\r\n"
        sock.sendall((head + "\r\n".join(AUTH) + "\r\n\r\n" + body).encode())
        assert sock.reply().body == b"hello"


def test_token_is_checked_before_the_body_is_read(served: tuple[HttpServer, dict]) -> None:
    """Only the head of a 4 MiB POST is sent: the 401 must come without waiting for it."""
    server, _ = served
    for headers in [("Content-Type: application/json",), ("Authorization: Bearer nope",)]:
        with connect(server) as sock:
            sock.sendall(post("/echo", b"", *headers, length=4 * 1024 * 1024))
            reply = sock.reply()
            assert reply.status == 401 and reply.headers["www-authenticate"] == "Bearer"
            assert reply.closes


def test_content_type_and_size_are_checked_before_the_body(served: tuple[HttpServer, dict]):
    server, _ = served
    with connect(server) as sock:
        sock.sendall(post("/echo", b"", AUTH[0], "Content-Type: text/plain", length=10))
        assert sock.reply().status == 415
    with connect(server) as sock:
        sock.sendall(post("/echo", b"", *AUTH, length=1001))
        assert sock.reply().status == 413


def test_unauthorized_sender_still_sending_reads_its_401(served: tuple[HttpServer, dict]) -> None:
    """The server lingers: the client's send completes and it reads the answer, no reset."""
    server, _ = served
    with connect(server) as sock:
        body = b"x" * (2 * 1024 * 1024)
        sock.sendall(post("/echo", body, "Content-Type: application/json"))
        assert sock.reply().status == 401


def test_expect_100_continue(served: tuple[HttpServer, dict]) -> None:
    server, _ = served
    with connect(server) as sock:
        sock.sendall(post("/echo", b"", *AUTH, "Expect: 100-continue", length=5))
        assert sock.recv_until(b"\r\n\r\n").startswith(b"HTTP/1.1 100 ")
        sock.sendall(b"hello")
        assert sock.reply().body == b"hello"
    with connect(server) as sock:  # no token: refused without inviting the body
        sock.sendall(post("/echo", b"", "Expect: 100-continue", length=5))
        assert sock.reply().status == 401


def test_slow_loris_head_gets_408(served: tuple[HttpServer, dict]) -> None:
    server, _ = served
    with connect(server) as sock:
        sock.sendall(b"GET /hello HTTP/1.1\r\n")
        for _ in range(6):  # a byte now and then never buys more time
            time.sleep(0.1)
            sock.sendall(b"X")
        reply = sock.reply()
        assert reply.status == 408 and reply.closes


def test_slow_body_gets_408(served: tuple[HttpServer, dict]) -> None:
    server, _ = served
    with connect(server) as sock:
        sock.sendall(post("/echo", b"ab", *AUTH, length=10))
        assert sock.reply().status == 408


def test_silent_and_idle_connections_are_closed(served: tuple[HttpServer, dict]) -> None:
    server, _ = served
    with connect(server) as silent, connect(server) as idle:
        idle.sendall(get("/hello"))
        assert idle.reply().status == 200
        assert silent.closed_by_peer() and idle.closed_by_peer()


def test_at_the_cap_the_oldest_idle_connection_makes_room(served: tuple[HttpServer, dict]):
    server, _ = served
    idle = [connect(server) for _ in range(server.cap)]
    try:
        time.sleep(0.1)
        with connect(server) as fresh:
            fresh.sendall(get("/hello"))
            assert fresh.reply().status == 200
        assert idle[0].closed_by_peer(within=1)
        assert server.counters["evicted"] >= 1
    finally:
        for sock in idle:
            sock.close()


def test_at_the_cap_a_long_poll_is_answered_early(served: tuple[HttpServer, dict]) -> None:
    server, _ = served
    polls = [connect(server) for _ in range(server.cap)]
    try:
        for sock in polls:
            sock.sendall(get("/poll"))
        time.sleep(0.2)
        with connect(server) as fresh:
            fresh.sendall(get("/hello"))
            assert fresh.reply().status == 200
        first = polls[0].reply()
        assert first.body == b'{"interrupted":true}\n' and first.closes
    finally:
        for sock in polls:
            sock.close()


def test_at_the_cap_with_every_connection_busy_a_newcomer_gets_503(
    served: tuple[HttpServer, dict],
) -> None:
    server, gates = served
    busy = [connect(server) for _ in range(server.cap)]
    try:
        for sock in busy:
            sock.sendall(get("/block"))
        assert gates["entered"].wait(5)
        time.sleep(0.2)
        with connect(server) as fresh:
            reply = fresh.reply()
            assert reply.status == 503 and reply.headers["retry-after"] == "1"
        gates["release"].set()
        assert all(sock.reply().status == 200 for sock in busy)
    finally:
        for sock in busy:
            sock.close()


def test_shutdown_answers_long_polls_at_once(served: tuple[HttpServer, dict]) -> None:
    server, _ = served
    with connect(server) as sock:
        sock.sendall(get("/poll"))
        time.sleep(0.1)
        started = time.monotonic()
        threading.Thread(target=server.shutdown).start()
        reply = sock.reply()
        assert reply.body == b'{"interrupted":true}\n' and reply.closes
        assert time.monotonic() - started < 5  # not the poll's 30 s


def test_head_request_has_no_body(served: tuple[HttpServer, dict]) -> None:
    server, _ = served
    with connect(server) as sock:
        sock.sendall(b"HEAD /hello HTTP/1.1\r\nHost: t\r\n\r\n" + get("/hello?x"))
        head = sock.recv_until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: 13" in head
        assert sock.reply().body == b'{"hello":"x"}\n'  # no body came after the head
