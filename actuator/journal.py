"""What the actuator paused, admitted and marked, kept on disk so a crash loses nothing.

Every change is written before the action it describes is taken (write a temporary file,
fsync it, ``os.replace`` it over the journal, fsync the directory), so after a ``kill -9``
the journal names every container the actuator may have frozen. The guard
(``actuator.guard``) and the next start (``plan_reconcile``) read it to resume them.

A pause intent is the one exception to the order, not to the record: it is replaced over the
journal (``durable=False``: every other process, the guard included, reads it from then on)
before the freeze, and made durable (``sync``) right after. The fsyncs cost 1-45 ms on a
busy disk, on the path from a new task to its container frozen; what they add protects
against power loss, and a frozen cgroup does not outlive the kernel.

One owner writes it: whoever holds the ``flock`` on ``journal.lock`` in the state directory
(``JournalLock``). A running actuator holds it for its whole life; the kernel drops it when
the process dies, however it dies, so the guard can both tell that the actuator is gone and
write the journal without ever overwriting the one of an actuator that replaced it.

A journal that cannot be read (empty, truncated, garbage: ``JournalCorrupt``) is moved
aside for the operator (``set_aside``) rather than crash-looping whoever reads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuguard.actuator.policy import Ledger
from gpuguard.contract import ActionReason

JOURNAL_FILE = "journal.json"
LOCK_FILE = "journal.lock"
FORMAT_VERSION = 1


class JournalCorrupt(ValueError):
    """The journal exists but is not a whole gpuguard journal."""


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
        self.exempt_tasks: dict[str, float] = {}
        self.nodes: dict[str, Any] = {}
        #: the owner's --max-pause, recorded so the guard enforces the same limit
        self.max_pause_s: float | None = None
        self._load()

    def _load(self) -> None:
        doc = read_journal(self.path)
        try:
            self.paused = paused_entries(doc)
            self.admitted = {k: float(v) for k, v in doc.get("admitted", {}).items()}
            self.exempt_tasks = {k: float(v) for k, v in doc.get("exempt_tasks", {}).items()}
            self.nodes = dict(doc.get("nodes", {}))
        except (AttributeError, TypeError, ValueError) as exc:
            raise JournalCorrupt(f"{self.path}: malformed journal: {exc}") from None

    def to_doc(self) -> dict[str, Any]:
        with self._lock:
            return {
                "version": FORMAT_VERSION,
                "pid": os.getpid(),
                "paused": {cid: asdict(entry) for cid, entry in self.paused.items()},
                "admitted": dict(self.admitted),
                "exempt_tasks": dict(self.exempt_tasks),
                "nodes": self.nodes,
                "max_pause_s": self.max_pause_s,
            }

    def save(self, durable: bool = True) -> None:
        with self._lock:
            atomic_write_json(self.path, self.to_doc(), durable)

    def sync(self) -> None:
        """Make what a ``durable=False`` write left durable (fsync of file and directory)."""
        with self._lock:
            sync_file(self.path)

    def ledger(self) -> Ledger:
        with self._lock:
            return Ledger(
                paused={cid: e.paused_at for cid, e in self.paused.items()},
                yielded={
                    cid: e.gpu for cid, e in self.paused.items() if e.reason == ActionReason.YIELD
                },
                admitted=dict(self.admitted),
                exempt_tasks=frozenset(self.exempt_tasks),
            )

    def will_pause(self, entry: PausedEntry, durable: bool = True) -> None:
        """Record a pause before it is taken (``durable=False``: ``sync`` after it)."""
        self.will_pause_many([entry], durable)

    def will_pause_many(self, entries: list[PausedEntry], durable: bool = True) -> None:
        """Record several pauses, in one write, before they are taken."""
        with self._lock:
            for entry in entries:
                self.paused[entry.container_id] = entry
                self.admitted.pop(entry.container_id, None)
            self.save(durable)

    def released(self, container_id: str, admitted_at: float | None = None) -> None:
        """Forget a container once it is running again (or gone); remember admissions."""
        with self._lock:
            self.paused.pop(container_id, None)
            if admitted_at is not None:
                self.admitted[container_id] = admitted_at
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
    """The journal document, or an empty one when there is none yet; ``JournalCorrupt``."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        doc = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JournalCorrupt(f"{path}: unreadable ({len(text)} bytes): {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
        raise JournalCorrupt(f"{path}: not a gpuguard actuator journal (version {FORMAT_VERSION})")
    return doc


def paused_entries(doc: Mapping[str, Any]) -> dict[str, PausedEntry]:
    """The ``paused`` records of a journal document; ``JournalCorrupt`` when malformed."""
    try:
        return {cid: PausedEntry(**entry) for cid, entry in doc.get("paused", {}).items()}
    except (AttributeError, TypeError) as exc:
        raise JournalCorrupt(f"malformed paused entry: {exc}") from None


def set_aside(path: Path) -> Path:
    """Move an unreadable journal out of the way, keeping it for the operator."""
    target = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    os.replace(path, target)
    return target


class JournalLock:
    """The journal's single writer: an exclusive ``flock`` on ``journal.lock``.

    The lock belongs to the open file: it is dropped when the holder releases it or when its
    process ends, ``kill -9`` included, and it works between containers sharing the state
    directory (same host, same file), where a PID cannot be waited on.
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; True when we hold it now."""
        return self._take(blocking=False)

    def acquire(self) -> None:
        """Wait for the lock, however long its holder keeps it."""
        self._take(blocking=True)

    def _take(self, blocking: bool) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # for people: who holds it
        self._fd = fd
        return True

    def holder(self) -> str:
        """The PID the holder wrote (as seen in its PID namespace), for log lines."""
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def atomic_write_json(path: Path, doc: Mapping[str, Any], durable: bool = True) -> None:
    """Replace ``path`` with ``doc`` so that a reader sees the old or the new file, whole.

    ``durable=False`` skips both fsyncs (``sync_file`` does them later): the new file is
    what every process reads at once, and what a power cut may lose.
    """
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(path.parent)  # the rename itself must survive a power cut


def sync_file(path: Path) -> None:
    """fsync a file that was replaced without it, and its directory (the rename)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
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
        elif cid not in live_containers_with_tasks and entry.reason == ActionReason.YIELD:
            # yielded between two tasks: the policy thaws it in its turn (or --max-yield)
            steps.append(ReconcileStep(cid, "keep", "yielded its GPU until its turn"))
        elif cid not in live_containers_with_tasks:
            steps.append(ReconcileStep(cid, "unpause", "its GPU task is gone"))
        else:
            steps.append(ReconcileStep(cid, "keep", "task still waits for the GPU"))
    return steps
