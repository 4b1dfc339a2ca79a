"""The audit log: one JSON object per line for every action, skip and notable event.

Mode 0600: it names every tenant container and why it was paused. The actuator and the guard
both append to it (whole lines, ``O_APPEND``).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

AUDIT_FILE = "audit.jsonl"


class AuditLog:
    """Append-only JSON lines; ``ts`` is the wall time the entry was written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with contextlib.suppress(OSError):  # a file made wider by hand: ours, so narrow it
            os.fchmod(fd, 0o600)
        self._handle = os.fdopen(fd, "a", encoding="utf-8")

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


def read_audit(path: Path) -> list[dict[str, Any]]:
    """Every record of an audit log (tests and benchmarks read it back)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]
