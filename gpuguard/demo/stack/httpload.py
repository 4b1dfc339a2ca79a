"""Raw asyncio HTTP/1.1 clients for load and fault tests of gpuguard's servers, on loopback.

Bursts, idle and slow-loris connections, long-poll followers and unauthenticated senders of
big bodies, each bounded in count and time; and what ``/proc`` says about a server process
(threads, RSS, CPU time). Used by ``bench/http_load.py`` and the integration tests; part of
the harness, never imported by the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float  # from the first byte sent to the last byte read


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit towards ``wanted``; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def head(method: str, path: str, headers: Sequence[tuple[str, str]] = (), length: int = 0):
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in headers]
    if length or method == "POST":
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response with a Content-Length (gpuguard's servers always send one)."""
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").strip().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), headers, body


async def request(
    port: int,
    method: str,
    path: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes = b"",
    timeout: float = 10.0,
) -> Reply:
    """One request on a fresh connection to 127.0.0.1:``port``."""
    started = time.monotonic()
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head(method, path, headers, len(body)) + body)
            status, reply_headers, reply_body = await read_reply(reader)
        finally:
            writer.close()
    return Reply(status, reply_headers, reply_body, time.monotonic() - started)


async def burst(port: int, path: str, clients: int, timeout: float = 10.0) -> list[Reply | str]:
    """``clients`` GETs started at the same moment; a failure is its exception's name."""
    results = await asyncio.gather(
        *(request(port, "GET", path, timeout=timeout) for _ in range(clients)),
        return_exceptions=True,
    )
    return [r if isinstance(r, Reply) else type(r).__name__ for r in results]


class Siege:
    """Idle connections (connect, send nothing) and slow-loris ones (a head byte by byte)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.refused = 0

    async def _connect(self) -> asyncio.StreamReader | None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            self.refused += 1
            return None
        self.writers.append(writer)
        return reader

    async def open_idle(self, count: int) -> None:
        for _ in range(count):
            await self._connect()

    async def open_slow_loris(
        self, count: int, interval: float = 0.5
    ) -> asyncio.StreamReader | None:
        """Start ``count`` slow heads; returns the last one's reader (to see its answer)."""
        reader = None
        for _ in range(count):
            reader = await self._connect()
            if reader is not None:
                self.tasks.append(asyncio.create_task(_drip(self.writers[-1], interval)))
        return reader

    @property
    def still_open(self) -> int:
        return sum(1 for w in self.writers if not w.transport.is_closing())

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for writer in self.writers:
            writer.transport.abort()
        await asyncio.sleep(0)


async def _drip(writer: asyncio.StreamWriter, interval: float) -> None:
    writer.write(b"GET /metrics HTTP/1.1\r\n")
    with contextlib.suppress(OSError, RuntimeError):
        while True:
            await asyncio.sleep(interval)
            writer.write(b"X-Slow: 1\r\n")
            await writer.drain()


async def follow(port: int, since: int, timeout: float) -> tuple[float, bytes]:
    """One long poll of /api/v1/events; the wall clock when it was answered, and the body."""
    reply = await request(
        port, "GET", f"/api/v1/events?since={since}&timeout={timeout:g}", timeout=timeout + 10
    )
    return time.time(), reply.body


async def unauthenticated_senders(
    port: int, path: str, senders: int, size: int, timeout: float = 30.0
) -> list[int | str]:
    """``senders`` POSTs of ``size`` bytes without a token; each status, or the error's name."""

    async def send() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head("POST", path, [("Content-Type", "application/json")], size))
            chunk = b"x" * 65536
            with contextlib.suppress(ConnectionError):
                for _ in range(size // len(chunk)):
                    writer.write(chunk)
                    await writer.drain()
            status, _, _ = await read_reply(reader)
            return status
        finally:
            writer.transport.abort()

    async with asyncio.timeout(timeout):
        results = await asyncio.gather(*(send() for _ in range(senders)), return_exceptions=True)
    return [r if isinstance(r, int) else type(r).__name__ for r in results]


def proc_status(pid: int) -> dict[str, int]:
    """Threads and VmRSS / VmHWM (kB) of a process, from /proc/<pid>/status."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("Threads", "VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def rss_growth(pid: int, work: Awaitable[T], every: float = 0.01) -> tuple[T, int]:
    """Run ``work`` while sampling the process's RSS; its result and the peak growth (kB)."""
    before = proc_status(pid)["VmRSS"]
    peak = before
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc_status(pid)["VmRSS"])
            await asyncio.sleep(every)

    sampler = asyncio.create_task(sample())
    try:
        result = await work
    finally:
        done.set()
        await sampler
    return result, max(peak, proc_status(pid)["VmRSS"]) - before


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
