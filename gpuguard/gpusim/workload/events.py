"""The workload's log: JSON lines with wall-clock timestamps, flushed line by line."""

from __future__ import annotations

import json
import os
import time
from typing import IO, Any

from gpuguard.contract import WorkloadEvent, WorkloadKind

EXIT_FAILED = 1
EXIT_OUT_OF_MEMORY = 3


class EventLog:
    """One workload's events; ``fields`` go on every line (``size``, ``devices``)."""

    def __init__(self, stream: IO[str], kind: WorkloadKind, **fields: Any) -> None:
        self.stream = stream
        self.kind = kind
        self.fields = fields

    def event(self, name: WorkloadEvent, t: float | None = None, **extra: Any) -> None:
        """Log one event; ``t`` defaults to ``time.time()`` taken now."""
        record = {"event": name.value, "t": time.time() if t is None else t}
        record.update(pid=os.getpid(), kind=self.kind.value, **self.fields)
        record.update(extra)
        self.write(json.dumps(record))

    def write(self, line: str) -> None:
        """Append one line as it is (a child process's own line, relayed)."""
        self.stream.write(line.rstrip("\n") + "\n")
        self.stream.flush()
