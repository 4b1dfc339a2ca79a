"""What the actuator paused, admitted and marked, kept on disk so a crash loses nothing.

Every change is written before the action it describes is taken (write a temporary file,
fsync it, ``os.replace`` it over the journal, fsync the directory), so after a ``kill -9``
the journal names every container the actuator may have frozen. The watchdog
(``actuator.watchdog``) and the next start (``plan_reconcile``) read it to resume them.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuguard.actuator.policy import Ledger

JOURNAL_FILE = "journal.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class PausedEntry:
    """A container this actuator paused (or is about to pause)."""

    container_id: str
    name: str
    task_id: str | None
    gpu: int | None
    paused_at: float
    reason: str


class Journal:
    """The on-disk record; all methods are thread-safe and every mutation is durable."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / JOURNAL_FILE
        self._lock = threading.RLock()
        self.paused: dict[str, PausedEntry] = {}
        self.admitted: dict[str, float] = {}
        self.last_admitted: dict[int, str] = {}
        self.exempt_tasks: dict[str, float] = {}
        self.nodes: dict[str, Any] = {}
        self._load()

    def _load(self) -> None:
        doc = read_journal(self.path)
        self.paused = {cid: PausedEntry(**entry) for cid, entry in doc.get("paused", {}).items()}
        self.admitted = {k: float(v) for k, v in doc.get("admitted", {}).items()}
        self.last_admitted = {int(k): v for k, v in doc.get("last_admitted", {}).items()}
        self.exempt_tasks = {k: float(v) for k, v in doc.get("exempt_tasks", {}).items()}
        self.nodes = dict(doc.get("nodes", {}))

    def to_doc(self) -> dict[str, Any]:
        with self._lock:
            return {
                "version": FORMAT_VERSION,
                "pid": os.getpid(),
                "paused": {cid: asdict(entry) for cid, entry in self.paused.items()},
                "admitted": dict(self.admitted),
                "last_admitted": {str(k): v for k, v in self.last_admitted.items()},
                "exempt_tasks": dict(self.exempt_tasks),
                "nodes": self.nodes,
            }

    def save(self) -> None:
        with self._lock:
            atomic_write_json(self.path, self.to_doc())

    def ledger(self) -> Ledger:
        with self._lock:
            return Ledger(
                paused={cid: e.paused_at for cid, e in self.paused.items()},
                admitted=dict(self.admitted),
                last_admitted=dict(self.last_admitted),
                exempt_tasks=frozenset(self.exempt_tasks),
            )

    def will_pause(self, entry: PausedEntry) -> None:
        """Record a pause before it is taken."""
        with self._lock:
            self.paused[entry.container_id] = entry
            self.admitted.pop(entry.container_id, None)
            self.save()

    def will_pause_many(self, entries: list[PausedEntry]) -> None:
        """Record several pauses, in one durable write, before they are taken."""
        with self._lock:
            for entry in entries:
                self.paused[entry.container_id] = entry
                self.admitted.pop(entry.container_id, None)
            self.save()

    def released(self, container_id: str, admitted_on: int | None = None, at: float = 0.0) -> None:
        """Forget a container once it is running again (or gone); remember admissions."""
        with self._lock:
            self.paused.pop(container_id, None)
            if admitted_on is not None:
                self.admitted[container_id] = at
                self.last_admitted[admitted_on] = container_id
            self.save()

    def exempt(self, task_id: str, at: float) -> None:
        with self._lock:
            self.exempt_tasks[task_id] = at
            self.save()

    def prune(self, live_task_ids: set[str], live_container_ids: set[str]) -> None:
        """Drop records of tasks and containers that no longer exist."""
        with self._lock:
            changed = False
            for task_id in [t for t in self.exempt_tasks if t not in live_task_ids]:
                del self.exempt_tasks[task_id]
                changed = True
            for cid in [c for c in self.admitted if c not in live_container_ids]:
                del self.admitted[cid]
                changed = True
            if changed:
                self.save()

    def set_nodes(self, nodes: Mapping[str, Any]) -> None:
        with self._lock:
            self.nodes = dict(nodes)
            self.save()


def read_journal(path: Path) -> dict[str, Any]:
    """The journal document, or an empty one when there is none yet."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: not a gpuguard actuator journal (version {FORMAT_VERSION})")
    return doc


def atomic_write_json(path: Path, doc: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``doc`` so that a reader sees the old or the new file, whole."""
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself must survive a power cut
    finally:
        os.close(dir_fd)


@dataclass(frozen=True)
class ReconcileStep:
    container_id: str
    verdict: str  # "unpause", "forget" or "keep"
    why: str


def plan_reconcile(
    paused: Mapping[str, PausedEntry],
    docker_paused: Mapping[str, bool | None],
    live_containers_with_tasks: set[str] | None,
    now: float,
    max_pause_s: float,
) -> list[ReconcileStep]:
    """Compare the journal with Docker (pure).

    ``docker_paused``: container id -> Docker's ``State.Paused``, or None when it is gone.
    ``live_containers_with_tasks``: containers with a running GPU task per the exporter, or
    None when the exporter cannot be asked (then every journalled container is resumed:
    holding a tenant without knowing why is never right).
    Only journalled containers are considered: one paused by someone else is left alone.
    """
    steps = []
    for cid, entry in sorted(paused.items()):
        state = docker_paused.get(cid)
        if state is None:
            steps.append(ReconcileStep(cid, "forget", "container is gone"))
        elif not state:
            steps.append(ReconcileStep(cid, "forget", "not paused any more"))
        elif now - entry.paused_at > max_pause_s:
            steps.append(ReconcileStep(cid, "unpause", "paused longer than --max-pause"))
        elif live_containers_with_tasks is None:
            steps.append(ReconcileStep(cid, "unpause", "exporter unavailable"))
        elif cid not in live_containers_with_tasks:
            steps.append(ReconcileStep(cid, "unpause", "its GPU task is gone"))
        else:
            steps.append(ReconcileStep(cid, "keep", "task still waits for the GPU"))
    return steps
