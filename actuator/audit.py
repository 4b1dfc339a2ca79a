"""The audit log: one JSON object per line for every action, skip and notable event."""

from __future__ import annotations

import json
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
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open

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
