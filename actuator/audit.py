"""The audit log: one JSON object per line for every action, skip and notable event.

Mode 0600: it names every tenant container and why it was paused. The actuator and the guard
both append to it (whole lines, ``O_APPEND``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from gpuguard import files

AUDIT_FILE = "audit.jsonl"

log = logging.getLogger("gpuguard.actuator")


class AuditLog:
    """Append-only JSON lines; ``ts`` is the wall time the entry was written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = os.fdopen(_open_log(path), "a", encoding="utf-8")

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        record: dict[str, Any] = {"ts": time.time(), "event": event}
        record.update({k: v for k, v in fields.items() if v is not None})
        line = json.dumps(record, sort_keys=True)
        with self._lock:
            self._handle.write(line + "\n")
            self._handle.flush()
        return record

    def close(self) -> None:
        with self._lock:
            self._handle.close()


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
