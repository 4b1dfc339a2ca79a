"""The gpusim daemon: a single-threaded selector loop over a Unix socket.

One thread owns all state, so there are no locks: it reads requests, hands them to
``SimulatedGpu``, sleeps until the next simulated job completes or a socket is readable, and
writes replies. A connection with a blocking op in flight has its later requests queued (its
replies stay in order) but is still watched, so a client that dies mid-kernel frees its
context and memory at once.

Each connection's buffers are bounded: past ``MAX_PENDING_BYTES`` of unread requests the
daemon stops reading that socket, and past as many bytes of unsent replies it stops taking
requests from it, so a client that pipelines without reading gets backpressure (its sends
block) instead of growing the daemon. Such a connection is watched again, and its hang-up
noticed, as soon as its buffers drain.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import socket
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuguard.gpusim import driver
from gpuguard.gpusim.config import DaemonConfig
from gpuguard.gpusim.errors import BAD_REQUEST, GpusimError
from gpuguard.gpusim.gpu import SimulatedGpu
from gpuguard.gpusim.protocol import MAX_LINE_BYTES, encode, error_reply, parse_request

log = logging.getLogger("gpusim.daemon")

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_RECV_BYTES = 65536
#: Bound of each connection's unread requests and of its unsent replies.
MAX_PENDING_BYTES = 1024 * 1024


def peer_pid(sock: socket.socket) -> int:
    """Host PID of the process at the other end of a Unix socket (SO_PEERCRED)."""
    pid, _uid, _gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return int(pid)


@dataclass
class _Connection:
    id: int
    sock: socket.socket
    pid: int
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    busy: bool = False  # a blocking op is in flight; later requests wait
    discarding: bool = False  # skipping the rest of an over-long line
    closing: bool = False


class SocketInUse(RuntimeError):
    """Another live daemon already listens on the socket path."""


def prepare_socket_path(path: Path) -> None:
    """Create the parent directory; remove a stale socket file, refuse a live one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody listens: a daemon died without cleaning up
        return
    finally:
        probe.close()
    raise SocketInUse(f"another gpusim daemon is listening on {path}")


class Daemon:
    """Serves one ``SimulatedGpu`` on a Unix socket until ``stop()``."""

    def __init__(
        self,
        socket_path: Path,
        config: DaemonConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.config = config
        self.clock = clock
        self.gpu = SimulatedGpu(config, clock(), lambda: time.time() - clock())
        self._selector = selectors.DefaultSelector()
        self._connections: dict[int, _Connection] = {}
        self._next_conn = 1
        self._stopping = False
        self._listener: socket.socket | None = None
        # A socketpair wakes the loop from stop() in another thread or a signal handler.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def bind(self) -> None:
        """Create the listening socket (mode 0666 so processes in containers can connect),
        with the driver stand-in beside it (``driver.install``)."""
        prepare_socket_path(self.socket_path)
        driver.install(self.socket_path.parent)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o666)
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, self._accept)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._drain_wake)

    def stop(self) -> None:
        """Ask the loop to end; safe from another thread or a signal handler."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def serve_forever(self) -> None:
        """Run until ``stop()``; then close every connection and remove the socket file."""
        if self._listener is None:
            self.bind()
        try:
            while not self._stopping:
                self._step()
        finally:
            self._shutdown()

    def _step(self) -> None:
        wake = self.gpu.next_wakeup()
        timeout = None if wake is None else max(0.0, wake - self.clock())
        for key, mask in self._selector.select(timeout):
            key.data(key.fileobj, mask)
        self.gpu.advance(self.clock())
        self._deliver_completions()

    def _shutdown(self) -> None:
        for conn in list(self._connections.values()):
            self._close(conn)
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _drain_wake(self, sock: socket.socket, _mask: int) -> None:
        with contextlib.suppress(BlockingIOError):
            sock.recv(4096)

    def _accept(self, listener: socket.socket, _mask: int) -> None:
        try:
            sock, _addr = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        conn = _Connection(self._next_conn, sock, peer_pid(sock))
        self._next_conn += 1
        self._connections[conn.id] = conn
        self._watch(conn)
        log.debug("connection %d from pid %d", conn.id, conn.pid)

    def _watch(self, conn: _Connection) -> None:
        """Watch for input while its buffer has room, for output while replies wait."""
        if conn.id not in self._connections:
            return
        events = selectors.EVENT_READ if len(conn.inbuf) < MAX_PENDING_BYTES else 0
        events |= selectors.EVENT_WRITE if conn.outbuf else 0
        key = self._selector.get_map().get(conn.sock)
        if events == 0:
            if key is not None:
                self._selector.unregister(conn.sock)
        elif key is None:
            self._selector.register(conn.sock, events, lambda s, m: self._io(conn, m))
        elif key.events != events:
            self._selector.modify(conn.sock, events, key.data)

    def _io(self, conn: _Connection, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
            self._process(conn)  # requests held back while replies could not be sent
        if mask & selectors.EVENT_READ and not conn.closing:
            try:
                data = conn.sock.recv(_RECV_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._close(conn)  # process exited or was killed: free everything now
                return
            conn.inbuf += data
            self._process(conn)
        self._watch(conn)

    def _process(self, conn: _Connection) -> None:
        """Handle complete request lines until one starts a blocking job."""
        while (
            not conn.busy and conn.id in self._connections and len(conn.outbuf) < MAX_PENDING_BYTES
        ):
            newline = conn.inbuf.find(b"\n")
            if newline < 0:
                if len(conn.inbuf) > MAX_LINE_BYTES:
                    conn.inbuf.clear()
                    if not conn.discarding:
                        conn.discarding = True
                        self._reply_error(conn, "request line too long")
                return
            line = bytes(conn.inbuf[:newline]).strip()
            del conn.inbuf[: newline + 1]
            if conn.discarding:
                conn.discarding = False  # end of the over-long line
                continue
            if line:
                self._handle_line(conn, line)

    def _handle_line(self, conn: _Connection, line: bytes) -> None:
        try:
            request = parse_request(line)
            reply = self.gpu.handle(conn.id, conn.pid, request, self.clock())
        except GpusimError as exc:
            self._send(conn, error_reply(exc))
            return
        if reply is None:
            conn.busy = True
        else:
            self._send(conn, reply)

    def _reply_error(self, conn: _Connection, message: str) -> None:
        self._send(conn, error_reply(GpusimError(BAD_REQUEST, message)))

    def _deliver_completions(self) -> None:
        for conn_id, reply in self.gpu.pop_completions():
            conn = self._connections.get(conn_id)
            if conn is None:
                continue
            conn.busy = False
            self._send(conn, reply)
            self._process(conn)  # requests that queued up behind the blocking one
            self._watch(conn)

    def _send(self, conn: _Connection, reply: dict[str, object]) -> None:
        conn.outbuf += encode(reply)
        self._flush(conn)

    def _flush(self, conn: _Connection) -> None:
        if conn.id not in self._connections:
            return
        try:
            sent = conn.sock.send(conn.outbuf) if conn.outbuf else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                log.warning("connection %d: %s", conn.id, exc)
            self._close(conn)
            return
        del conn.outbuf[:sent]

    def _close(self, conn: _Connection) -> None:
        if self._connections.pop(conn.id, None) is None:
            return
        conn.closing = True
        self.gpu.disconnect(conn.id, self.clock())
        if conn.sock in self._selector.get_map():
            self._selector.unregister(conn.sock)
        conn.sock.close()
        log.debug("connection %d from pid %d closed", conn.id, conn.pid)
        self._deliver_completions()
