"""A Docker engine that hangs: a Unix socket that accepts every connection and never answers.

What a dockerd stuck on a dead storage driver or a wedged containerd looks like to a
client: the connect succeeds, the request is sent, no reply ever comes. Used by the fault
tests and ``bench/faults.py``; part of the harness, never imported by the runtime.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path
from types import TracebackType


class HungEngine:
    """``with HungEngine(path) as engine:`` serves ``engine.url``; every connection is
    held open, unanswered, until the block ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"unix://{path}"
        self.accepted = 0
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hung-engine", daemon=True)

    def __enter__(self) -> HungEngine:
        self._server.bind(str(self.path))
        self._server.listen(128)
        self._server.settimeout(0.1)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._held:
            conn.close()
        self._server.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)  # read nothing, answer nothing, close nothing
            self.accepted += 1
