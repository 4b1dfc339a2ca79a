"""The bytes of one client connection, with memory bounded by design.

asyncio's streams read 256 KiB per ``recv`` into a fresh object and keep up to twice their
limit per connection: 100 unauthenticated senders of 4 MiB bodies then cost tens of MB.
``Wire`` receives into one scratch buffer shared by every connection of a server (the loop
copies each read out before the next), keeps at most ``limit`` bytes queued per connection
(then stops reading from the socket), and while lingering drops what comes without keeping
any of it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable


class Wire(asyncio.BufferedProtocol):
    """One connection: ``read`` what came, ``write``/``drain`` replies, ``discard`` the rest."""

    def __init__(self, scratch: bytearray, limit: int, on_open: Callable[[Wire], None]) -> None:
        self._scratch = memoryview(scratch)
        self._limit = limit
        self._on_open = on_open
        self.transport: asyncio.Transport | None = None
        self._chunks: deque[bytes] = deque()
        self._queued = 0
        self._eof = False
        self._lost = False
        self._reading_paused = False
        self._writing_paused = False
        self._discard_left: int | None = None  # None: keep what comes
        self._readable: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None

    # --- protocol callbacks (the loop calls these) -----------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._on_open(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._discard_left is not None:
            self._discard_left -= nbytes
            if self._discard_left <= 0:
                self._wake_reader()
            return
        self._chunks.append(bytes(self._scratch[:nbytes]))
        self._queued += nbytes
        if self._queued >= self._limit and not self._reading_paused and self.transport:
            self.transport.pause_reading()
            self._reading_paused = True
        self._wake_reader()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake_reader()
        return True  # keep the transport: the reply may still be on its way out

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = self._eof = True
        self._wake_reader()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # --- what the server calls -------------------------------------------------------------

    async def read(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` received bytes; ``b""`` at end of stream."""
        while not self._chunks:
            if self._eof:
                return b""
            await self._wait_readable()
        chunk = self._chunks.popleft()
        if len(chunk) > max_bytes:
            self._chunks.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        self._queued -= len(chunk)
        if self._reading_paused and self._queued < self._limit and self.transport:
            self._reading_paused = False
            self.transport.resume_reading()
        return chunk

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def drain(self) -> None:
        while self._writing_paused and not self._lost:
            self._writable = asyncio.get_running_loop().create_future()
            await self._writable
        if self._lost:
            raise ConnectionResetError("connection lost")

    async def discard(self, limit: int) -> None:
        """Half-close, then drop what still comes until end of stream or ``limit`` bytes."""
        if self.transport is None:
            return
        if self.transport.can_write_eof() and not self.transport.is_closing():
            self.transport.write_eof()
        self._discard_left = limit - self._queued
        self._chunks.clear()
        self._queued = 0
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        while not self._eof and self._discard_left > 0:
            await self._wait_readable()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _wait_readable(self) -> asyncio.Future[None]:
        self._readable = asyncio.get_running_loop().create_future()
        return self._readable

    def _wake_reader(self) -> None:
        if self._readable is not None and not self._readable.done():
            self._readable.set_result(None)
