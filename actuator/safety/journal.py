"""What the actuator paused, admitted and marked, kept on disk so a crash loses nothing.

Every change is written atomically before the action it describes (a pause intent: visible
before the freeze, durable right after it). One writer: the holder of ``JournalLock``. An
unreadable journal is moved aside (``set_aside``). A failed write never raises out of a
record of what was done (it is kept and retried); a pause intent that cannot be written
raises ``JournalUnwritable``. Why: docs/design-notes.md, "The journal".
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuguard import files
from gpuguard.actuator.decision import Ledger
from gpuguard.actuator.safety.journaldoc import FORMAT_VERSION, JournalContent, PausedEntry, check
from gpuguard.actuator.safety.journallock import JournalLock
from gpuguard.actuator.safety.pauseclock import PauseClock, host_clock
from gpuguard.actuator.safety.statewrites import StateWrites
from gpuguard.contract import StepReason

__all__ = [
    "FORMAT_VERSION",
    "Journal",
    "JournalContent",
    "JournalCorrupt",
    "JournalUnwritable",
    "PausedEntry",
]

log = logging.getLogger("gpuguard.actuator")

JOURNAL_FILE = "journal.json"
#: Far above any real journal (1,000 paused containers take ~300 KB); a reader never
#: takes more than this into memory.
MAX_JOURNAL_BYTES = 64 << 20


class JournalCorrupt(ValueError):
    """The journal exists but is not a whole, valid gpuguard journal.

    ``salvaged``: its valid part when it could be parsed (None when it could not).
    """

    def __init__(self, message: str, salvaged: JournalContent | None = None) -> None:
        super().__init__(message)
        self.salvaged = salvaged


class JournalUnwritable(RuntimeError):
    """A pause intent could not be recorded: the pause must not be taken."""


class Journal:
    """The on-disk record; all methods are thread-safe and every mutation is durable.

    Made from the file in ``state_dir`` (``JournalCorrupt`` when it cannot be trusted), or
    from ``content`` (what was salvaged from one that was moved aside). Every pause carries
    its moment on the boot clock (``clock``): entries of older journals are dated when
    loaded, and keep that date once saved. Failed writes go to ``writes``; with ``lock``
    (its owner's), nothing is written unless it is held, and a save first tries to take it.
    """

    def __init__(
        self,
        state_dir: Path,
        content: JournalContent | None = None,
        clock: PauseClock | None = None,
        writes: StateWrites | None = None,
        lock: JournalLock | None = None,
    ) -> None:
        self.path = state_dir / JOURNAL_FILE
        self._lock = threading.RLock()
        self.clock = clock or host_clock()
        self.writes = writes or StateWrites()
        self.owner_lock = lock
        #: why the last save failed (the file is behind what is held here), or None
        self.unwritable: str | None = None
        #: the file found here could not be moved aside: move it before the next write
        self.set_aside_first = False
        if content is None:
            content = load(self.path)
        self.paused: dict[str, PausedEntry] = {
            cid: self.clock.stamp(entry) for cid, entry in content.paused.items()
        }
        self.admitted: dict[str, float] = content.admitted
        self.exempt_tasks: dict[str, float] = content.exempt_tasks
        self.nodes: dict[str, Any] = content.nodes
        #: resolved alert episodes (``AlertOrder.to_doc``) and firing resume_all alerts
        self.resolved_alerts: dict[str, list[Any]] = content.resolved_alerts
        self.fail_open: dict[str, float] = content.fail_open
        #: the owner's --max-pause, recorded so the guard enforces the same limit
        self.max_pause_s: float | None = content.max_pause_s
        #: why every managed paused container must be resumed (a journal was lost), or None
        self.lost: str | None = content.lost

    def to_doc(self) -> dict[str, Any]:
        with self._lock:
            return {
                "version": FORMAT_VERSION,
                "pid": os.getpid(),
                "paused": {cid: asdict(entry) for cid, entry in self.paused.items()},
                "admitted": dict(self.admitted),
                "exempt_tasks": dict(self.exempt_tasks),
                "nodes": self.nodes,
                "alerts": {"resolved": self.resolved_alerts, "fail_open": self.fail_open},
                "max_pause_s": self.max_pause_s,
                "lost": self.lost,
            }

    def save(self, durable: bool = True) -> bool:
        """Write all of it; False (``unwritable`` says why) when it could not be."""
        with self._lock:
            if not self._may_write():
                return False
            try:
                if self.set_aside_first:
                    kept = set_aside(self.path)
                    self.set_aside_first = False
                    self.writes.log.error("%s: unreadable at start: moved to %s", self.path, kept)
                atomic_write_json(self.path, self.to_doc(), durable)
            except OSError as exc:
                self.writes.failed("journal", self.path, exc)
                self.unwritable = f"{exc.strerror or exc}"
                return False
            self.writes.ok("journal")
            self.unwritable = None
            return True

    def retry(self) -> str | None:
        """Write what an earlier save could not; why it still cannot be, or None."""
        with self._lock:
            if self.owner_lock is not None:
                self.owner_lock.retry()
            if self.unwritable is not None:
                self.save()
            return self.unwritable

    def _may_write(self) -> bool:
        """Its owner holds the lock (or it has none); a save first tries to take it."""
        lock = self.owner_lock
        if lock is None or lock.held:
            return True
        try:
            if lock.try_acquire():
                return True
            why = "journal.lock held by another process"
        except OSError as exc:
            self.writes.failed("lock", lock.path, exc)
            why = f"journal.lock cannot be opened: {exc.strerror or exc}"
        self.unwritable = why
        return False

    def sync(self) -> None:
        """Make what a ``durable=False`` write left durable (fsync of file and directory);
        a failure is reported, and the next ``retry`` writes it all again, durably."""
        with self._lock:
            try:
                files.sync_file(self.path)
            except OSError as exc:
                self.writes.failed("journal", self.path, exc)
                self.unwritable = f"{exc.strerror or exc}"

    def ledger(self) -> Ledger:
        with self._lock:
            return Ledger(
                # judged on the boot clock: a step of the wall clock moves no pause's start
                paused={cid: self.clock.started_at(e) for cid, e in self.paused.items()},
                yielded={
                    cid: e.gpu for cid, e in self.paused.items() if e.reason == StepReason.YIELD
                },
                admitted=dict(self.admitted),
                exempt_tasks=frozenset(self.exempt_tasks),
            )

    def will_pause(self, entry: PausedEntry, durable: bool = True) -> None:
        """Record a pause before it is taken (``durable=False``: ``sync`` after it)."""
        self.will_pause_many([entry], durable)

    def will_pause_many(self, entries: list[PausedEntry], durable: bool = True) -> None:
        """Record several pauses, in one write, before they are taken; when they cannot be
        recorded, none is, and ``JournalUnwritable`` says why."""
        with self._lock:
            before = [
                (e.container_id, self.paused.get(e.container_id), self.admitted.get(e.container_id))
                for e in entries
            ]
            for entry in entries:
                self.paused[entry.container_id] = self.clock.stamp(entry)
                self.admitted.pop(entry.container_id, None)
            if self.save(durable):
                return
            for cid, paused, admitted in reversed(before):  # as it was: nothing recorded
                if paused is None:
                    self.paused.pop(cid, None)
                else:
                    self.paused[cid] = paused
                if admitted is not None:
                    self.admitted[cid] = admitted
            raise JournalUnwritable(f"the journal cannot be written: {self.unwritable}")

    def released(self, container_id: str, admitted_at: float | None = None) -> None:
        """Forget a container once it is running again (or gone); remember admissions."""
        with self._lock:
            self.paused.pop(container_id, None)
            if admitted_at is not None:
                self.admitted[container_id] = admitted_at
            self.save()

    def forget(self, container_ids: Iterable[str]) -> None:
        """Forget several containers (gone, or unpaused behind our back) in one write."""
        with self._lock:
            gone = [cid for cid in container_ids if self.paused.pop(cid, None) is not None]
            if gone:
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

    def set_nodes(
        self, nodes: Mapping[str, Any], resolved: Mapping[str, list[Any]] | None = None
    ) -> None:
        """The node list (and the resolved alert episodes, when given), in one write."""
        with self._lock:
            self.nodes = dict(nodes)
            if resolved is not None:
                self.resolved_alerts = dict(resolved)
            self.save()

    def set_alerts(self, resolved: Mapping[str, list[Any]], fail_open: Mapping[str, float]) -> None:
        """The resolved alert episodes and the firing resume_all alerts, in one write."""
        with self._lock:
            self.resolved_alerts = dict(resolved)
            self.fail_open = dict(fail_open)
            self.save()

    def set_lost(self, why: str | None) -> None:
        """Record (or, once done, clear) that every managed pause must be undone."""
        with self._lock:
            self.lost = why
            self.save()


def read_journal(path: Path) -> dict[str, Any]:
    """The journal document, or an empty one when there is none yet; ``JournalCorrupt``
    when it cannot be read for any other reason (a directory, a FIFO, a link, too large,
    not JSON, not a journal)."""
    try:
        text = files.read_bytes(path, MAX_JOURNAL_BYTES, follow_symlinks=False)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise JournalCorrupt(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise JournalCorrupt(f"{path}: unreadable ({len(text)} bytes): {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
        raise JournalCorrupt(f"{path}: not a gpuguard actuator journal (version {FORMAT_VERSION})")
    return doc


def load(path: Path) -> JournalContent:
    """The journal at ``path``, every field checked; ``JournalCorrupt`` (with the valid
    part as ``salvaged`` when it could be parsed) unless all of it is valid."""
    content = check(read_journal(path))
    if content.problems:
        raise JournalCorrupt(f"{path}: invalid entries: {content.summary()}", content)
    return content


def set_aside(path: Path, tag: str = "corrupt") -> Path:
    """Move a journal that cannot be used out of the way, keeping it for the operator:
    ``journal.json.corrupt-<time>-<pid>`` (``files.set_aside``)."""
    return files.set_aside(path, tag)


def atomic_write_json(path: Path, doc: Mapping[str, Any], durable: bool = True) -> None:
    """Replace ``path`` with ``doc`` so that a reader sees the old or the new file, whole.

    ``durable=False`` skips both fsyncs (``sync_file`` does them later): the new file is
    what every process reads at once, and what a power cut may lose.
    """
    files.replace(path, json.dumps(doc, indent=1, sort_keys=True).encode(), durable=durable)


@dataclass(frozen=True)
class ReconcileStep:
    container_id: str
    verdict: str  # "unpause", "forget" or "keep"
    why: str


def plan_reconcile(
    paused: Mapping[str, PausedEntry],
    docker_paused: Mapping[str, bool | None],
    live_containers_with_tasks: set[str] | None,
    paused_for: Callable[[PausedEntry], float],
    max_pause_s: float,
) -> list[ReconcileStep]:
    """Compare the journal with Docker (pure).

    ``docker_paused``: container id -> Docker's ``State.Paused``, or None when it is gone.
    ``paused_for``: how long an entry has been paused (``PauseClock.paused_for``).
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
        elif paused_for(entry) > max_pause_s:
            steps.append(ReconcileStep(cid, "unpause", "paused longer than --max-pause"))
        elif live_containers_with_tasks is None:
            steps.append(ReconcileStep(cid, "unpause", "exporter unavailable"))
        elif cid not in live_containers_with_tasks and entry.reason == StepReason.YIELD:
            # yielded between two tasks: the policy thaws it in its turn (or --max-yield)
            steps.append(ReconcileStep(cid, "keep", "yielded its GPU until its turn"))
        elif cid not in live_containers_with_tasks:
            steps.append(ReconcileStep(cid, "unpause", "its GPU task is gone"))
        else:
            steps.append(ReconcileStep(cid, "keep", "task still waits for the GPU"))
    return steps
