"""The audit log: one JSON object per line for every action, skip and notable event.

Mode 0600: it names every tenant container and why it was paused. The actuator and the guard
both append to it (whole lines, ``O_APPEND``).

Writing it never fails whoever records: a line that cannot be written (the state directory
full or read-only) is reported to ``StateWrites`` and kept, up to ``BACKLOG`` lines, to be
written before the next one; the file is opened again when it could not be. A line cut short
by a full disk is cut off again, so every line of the file stays whole JSON.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from gpuguard import files
from gpuguard.actuator.safety.statewrites import StateWrites

AUDIT_FILE = "audit.jsonl"
#: lines kept while the log cannot be written (the oldest go first)
BACKLOG = 1000

log = logging.getLogger("gpuguard.actuator")


class AuditLog:
    """Append-only JSON lines; ``ts`` is the wall time the entry was written.

    ``writes``: where its failed writes are reported (the state directory's, shared with the
    journal and the leases).
    """

    def __init__(self, path: Path, writes: StateWrites | None = None) -> None:
        self.path = path
        self.writes = writes or StateWrites()
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._backlog: collections.deque[bytes] = collections.deque(maxlen=BACKLOG)
        with contextlib.suppress(OSError):  # reported by the open below
            path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._reopen()

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        record: dict[str, Any] = {"ts": time.time(), "event": event}
        record.update({k: v for k, v in fields.items() if v is not None})
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with self._lock:
            self._backlog.append(line)
            self._drain()
        return record

    def close(self) -> None:
        with self._lock:
            self._drain()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _reopen(self) -> bool:
        if self._fd is None:
            try:
                self._fd = _open_log(self.path)
            except OSError as exc:
                self.writes.failed("audit", self.path, exc)
        return self._fd is not None

    def _drain(self) -> None:
        """Write every kept line, oldest first; stop at the first that fails."""
        while self._backlog and self._reopen():
            assert self._fd is not None
            line = self._backlog[0]
            try:
                written = os.write(self._fd, line)
            except OSError as exc:
                self.writes.failed("audit", self.path, exc)
                return
            if written < len(line):  # the disk filled up mid-line: no half record stays
                self._cut(written)
                full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self.writes.failed("audit", self.path, full)
                return
            self._backlog.popleft()
            self.writes.ok("audit")

    def _cut(self, written: int) -> None:
        assert self._fd is not None
        with contextlib.suppress(OSError):  # shrinking a file of ours needs no space
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)


def _open_log(path: Path) -> int:
    """Our log, appended to, mode 0600; never through a link: one in its place (or a FIFO)
    is moved aside for the operator and a log of our own begun."""
    flags = os.O_WRONLY | os.O_APPEND
    try:
        fd = files.open_state_file(path, flags)
    except files.FileRefused as exc:
        kept = files.set_aside(path, "bad")
        log.error("%s: %s: moved to %s", path, exc.strerror, kept.name)
        fd = files.open_state_file(path, flags)
    try:
        os.fchmod(fd, 0o600)  # a file made wider by hand: ours (a regular file), so narrow it
    except OSError:
        pass
    return fd


def read_audit(path: Path) -> list[dict[str, Any]]:
    """Every record of an audit log (tests and benchmarks read it back)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]
