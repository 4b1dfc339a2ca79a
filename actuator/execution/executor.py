"""Carry out pause/unpause through the container engine: idempotent, journalled first,
audited, retried.

* A pause freezes the container through its cgroup (``freezer``: about 1 ms) and is
  done; then, in the background, the frozen container is handed to the runtime's own pause
  (``docker pause``, containerd's task pause: ``ContainerFreezer.handover``, since runc
  refuses to pause a cgroup that is already frozen), so ``docker ps``/``inspect`` or ``ctr
  tasks list`` show it paused and an operator's unpause resumes it. Anything that comes next
  for that container waits for its hand-over (an unpause drops one not yet begun). Where no
  cgroup can be frozen from here (no access, another PID namespace, another layout) it is
  the runtime's pause alone, as with ``--pause.method=docker``: runc, 13 ms alone, ~100 ms
  for ten at once on two cores. The audit names which (``method`` ``cgroup`` or
  ``runtime_pause``, and the ``engine``).
* The live container is inspected before its first pause: a vanished container is a skip,
  one already paused is ``already``, and the ``gpuguard.managed`` / ``gpuguard.role`` labels
  are re-checked on the live container (the exporter's view may be stale). Labels never
  change in a container's life and its id is never reused, so that check, and its cgroup,
  are kept per container id (``vet`` makes them ahead, when a managed container appears); a
  later pause of it reads only its cgroup: still there (a stopped container's is removed), the
  same directory (a restart makes a new one), and thawed (frozen means someone else paused
  it, or an earlier pause of ours: it takes the inspected path). Nothing else is ever frozen.
* A pause is written to the journal before it is taken, so a crash in between still leaves a
  record the guard and the next start can undo (``resume_container`` thaws a cgroup frozen
  here even where the engine never heard of it).
* What the engine answers is read once (``engine.base.attempt``): a connection error is
  retried a few times, then the action fails with ``engine_down`` set (the webhook answers
  503 so Alertmanager retries). A freeze through the cgroup needs no engine: it succeeds
  while the engine is down, and the engine is told when it can be.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from gpuguard import labels
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.decision import PAUSE, UNPAUSE, Step
from gpuguard.actuator.engine.base import (
    Answer,
    Attempt,
    ContainerEngine,
    ContainerState,
    attempt,
    retried,
)
from gpuguard.actuator.engine.freezer import (
    THAWED,
    Cgroup,
    CgroupGone,
    ContainerFreezer,
    FreezerError,
)
from gpuguard.actuator.errors import EngineError, EngineRefused
from gpuguard.actuator.safety.journal import Journal, JournalUnwritable, PausedEntry
from gpuguard.actuator.safety.resume import resume_container
from gpuguard.contract import ADMITTING_REASONS, COMPONENT_ROLES, Result, SkipReason, Verb

log = logging.getLogger("gpuguard.actuator")

T = TypeVar("T")
_SOMEONE_ELSES = "already paused, not by us"
#: how a pause was taken (the audit record's ``method``): frozen through its cgroup, or the
#: runtime's own pause (``docker pause``, containerd's task pause: the record's ``engine``);
#: a ``runtime_pause`` record also follows a cgroup freeze once the runtime is told
CGROUP, RUNTIME_PAUSE = "cgroup", "runtime_pause"
#: containers whose live check is kept; past this the oldest are dropped (re-inspected)
MAX_VETTED = 4096
#: hand-overs to the runtime at once: each runs runc; more at once only share the same cores with
#: the exporter and this actuator's next decision (the frozen containers wait either way)
HANDOVER_WORKERS = 2


@dataclass(frozen=True)
class Outcome:
    """What became of one action."""

    action: Verb
    result: Result
    container_id: str
    skip_reason: SkipReason | None = None
    detail: str = ""
    started: float = 0.0
    finished: float = 0.0
    engine_down: bool = False
    #: a pause: ``cgroup`` or ``runtime_pause``; the wall time every process was frozen
    #: (the kernel said so, or the runtime's pause returned) and the freeze's own milliseconds
    method: str | None = None
    frozen_at: float | None = None
    freeze_ms: float | None = None


@dataclass(frozen=True)
class _Vetted:
    """A container whose live labels allow a pause, and its cgroup's directory as vetted."""

    cgroup: Cgroup
    inode: int


@dataclass(frozen=True)
class _Frozen:
    """A container this executor froze through its cgroup; the runtime not yet told."""

    cgroup: Cgroup
    asked_at: float  # wall time of the freeze's write
    frozen_at: float | None  # None: the kernel had not confirmed it within the timeout
    freeze_ms: float | None
    detail: str = ""


class PauseExecutor:
    """Pauses and unpauses containers through one container engine (and their cgroups)."""

    def __init__(
        self,
        engine: ContainerEngine,
        journal: Journal,
        audit: AuditLog,
        dry_run: bool = False,
        retries: int = 3,
        retry_delay_s: float = 0.05,
        freezer: ContainerFreezer | None = None,
    ) -> None:
        self.engine = engine
        self.journal = journal
        self.audit = audit
        self.dry_run = dry_run
        self.retries = retries
        self.retry_delay_s = retry_delay_s
        #: None: the runtime's pause only (``--pause.method=docker``)
        self.freezer = freezer
        self._vetted: dict[str, _Vetted] = {}
        self._vetting: set[str] = set()
        self._vet_lock = threading.Lock()
        self._vet_pool: ThreadPoolExecutor | None = None
        #: False once the kernel refused a freeze from here (no write access): the
        #: runtime's pause from then on; the freezer still thaws what it can
        self._freezing = freezer is not None
        #: containers whose cgroup cannot be found from here: the runtime's pause for them
        self._unfreezable: set[str] = set()
        self._freezer_warned = False
        #: container id -> its hand-over to the runtime, pending or running
        self._handovers: dict[str, Future[None]] = {}
        self._handover_lock = threading.Lock()
        self._handover_pool: ThreadPoolExecutor | None = None

    def execute_many(
        self, actions: Sequence[Step], trigger: str, pool: ThreadPoolExecutor
    ) -> list[Outcome]:
        """Several actions in parallel; the pauses' intents are journalled in one write first.

        Tasks that start together must all be frozen inside their input phase; one runtime
        pause costs ~11 ms here, and a journal write per pause would serialise them.
        """
        entries = [
            PausedEntry(a.container_id, a.container, a.task_id, a.gpu, time.time(), a.reason)
            for a in actions
            if a.verb == PAUSE and a.container_id not in self.journal.paused and not self.dry_run
        ]
        if entries:
            try:
                self.journal.will_pause_many(entries, durable=self.freezer is None)
            except JournalUnwritable:
                entries = []  # none recorded: each pause is skipped below (``execute``)
        fresh = {e.container_id for e in entries}
        # Every freeze first, here and together (~1 ms for all), before any runc runs: the
        # hand-overs to the runtime, and inspects of containers never vetted, then go in
        # parallel.
        frozen = self._freeze(self._vetted_cgroups([a.container_id for a in actions
                                                    if a.container_id in fresh]))  # fmt: skip
        if entries and self.freezer is not None:
            self.journal.sync()
        return list(
            pool.map(
                lambda a: self.execute(
                    a, trigger, a.container_id in fresh, frozen.get(a.container_id)
                ),
                actions,
            )
        )

    def execute(
        self, action: Step, trigger: str, journalled: bool = False, frozen: _Frozen | None = None
    ) -> Outcome:
        """Carry out one policy action; never raises for the engine's errors.

        ``journalled``: the pause intent is already in the journal (``execute_many``);
        ``frozen``: and the container is already frozen through its cgroup.
        """
        # Whatever comes next for a container, its hand-over to the runtime comes first (an
        # unpause drops one not yet begun: thawing the cgroup is then all there is to do).
        self._settle(action.container_id, cancel=action.verb == UNPAUSE)
        started = time.time() if frozen is None else frozen.asked_at
        if action.verb == PAUSE:
            try:
                outcome = self._pause(action, started, journalled, frozen)
            except JournalUnwritable as exc:  # raised before anything was frozen or paused
                outcome = self._done(
                    action, started, Result.SKIPPED, SkipReason.JOURNAL_UNWRITABLE, str(exc)
                )
        elif action.verb == UNPAUSE:
            outcome = self._unpause(action, started)
        else:  # pragma: no cover - the policy only makes these two
            raise ValueError(f"unknown action {action.verb!r}")
        self.audit.write(
            "action",
            trigger=trigger,
            action=outcome.action,
            result=outcome.result,
            container_id=action.container_id,
            container=action.container,
            task_id=action.task_id,
            gpu=action.gpu,
            reason=action.reason,
            skip_reason=outcome.skip_reason,
            detail=outcome.detail or None,
            started=outcome.started,
            finished=outcome.finished,
            method=outcome.method,
            engine=None if outcome.method is None else self.engine.name,
            frozen=outcome.frozen_at,
            freeze_ms=None if outcome.freeze_ms is None else round(outcome.freeze_ms, 3),
        )
        return outcome

    def _pause(
        self, action: Step, started: float, journalled: bool, frozen: _Frozen | None
    ) -> Outcome:
        cid = action.container_id
        vetted = None if frozen is not None or self.dry_run else self._vetted_cgroup(cid)
        if vetted is not None:
            if not journalled:
                entry = PausedEntry(
                    cid, action.container, action.task_id, action.gpu, started, action.reason
                )
                self.journal.will_pause(entry, durable=False)
                journalled = True
                frozen = self._freeze({cid: vetted}).get(cid)
                self.journal.sync()  # see journal.py: durable right after the freeze
            else:
                frozen = self._freeze({cid: vetted}).get(cid)
        if frozen is not None:
            outcome = self._frozen(action, started, frozen)
        else:
            outcome = self._try_pause(action, started, journalled)
        if (
            journalled
            and outcome.result not in (Result.OK, Result.ALREADY)
            and not outcome.engine_down
        ):
            self.journal.released(action.container_id)  # the batch intent did not happen
        elif journalled and outcome.detail == _SOMEONE_ELSES:
            self.journal.released(action.container_id)
        return outcome

    def _try_pause(self, action: Step, started: float, journalled: bool) -> Outcome:
        cid = action.container_id
        seen = self._attempt(self.engine.inspect, cid)
        if seen.value is None:
            return self._not_done(action, started, seen)
        info = seen.value
        refusal = _refuse_pause(info)
        if refusal is not None:
            return self._done(action, started, Result.SKIPPED, refusal[0], refusal[1])
        if info.paused:
            # Ours if it was in the journal before this decision; else someone else's, and
            # kept out of the journal so we never unpause what another operator froze.
            return self._done(
                action,
                started,
                Result.ALREADY,
                None,
                _SOMEONE_ELSES if journalled else "already paused",
            )
        cgroup = self._remember(cid, info)
        if cgroup is not None and _frozen_already(cgroup):
            # Frozen, though the engine does not say paused: by an earlier pause of ours
            # whose hand-over to the runtime failed (it is in the journal), or by someone else.
            return self._done(
                action,
                started,
                Result.ALREADY,
                None,
                _SOMEONE_ELSES if journalled else "already frozen in its cgroup",
            )
        if self.dry_run:
            return self._done(action, started, Result.DRY_RUN, None, "dry run: not paused")
        if not journalled:
            entry = PausedEntry(
                cid, action.container, action.task_id, action.gpu, started, action.reason
            )
            self.journal.will_pause(entry, durable=cgroup is None)
        if cgroup is not None:
            frozen = self._freeze({cid: cgroup}).get(cid)
            if not journalled:
                self.journal.sync()  # see journal.py: durable right after the freeze
            if frozen is not None:
                return self._frozen(action, started, frozen)
        paused = self._attempt(self.engine.pause, cid)
        now = paused.now  # a conflict: the container's state changed since the inspect
        if now is not None and now.paused:
            return self._done(action, started, Result.ALREADY, None, "already paused")
        if paused.answer is Answer.DOWN:
            # Unknown whether it took effect: keep the journal entry; reconcile settles it.
            return self._not_done(action, started, paused)
        if paused.answer is not Answer.DONE:
            self.journal.released(cid)
        if now is not None and not now.running:
            return self._done(action, started, Result.SKIPPED, SkipReason.VANISHED, "not running")
        if paused.answer is not Answer.DONE:
            return self._not_done(action, started, paused)
        outcome = self._done(action, started, Result.OK, None, "")
        return _with_freeze(outcome, RUNTIME_PAUSE, outcome.finished, None)

    # --- freezing through the cgroup ---------------------------------------------------

    def vet(self, container_ids: Sequence[str]) -> None:
        """Check, in the background, containers that may be paused soon (one inspect in
        each one's life), so that their first pause reads only their cgroup."""
        if not self._freezing or self.dry_run:
            return
        with self._vet_lock:
            skip = self._vetted.keys() | self._vetting | self._unfreezable
            todo = [c for c in container_ids if c not in skip]
            if not todo:
                return
            self._vetting.update(todo)
            if self._vet_pool is None:
                self._vet_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="vet")
            pool = self._vet_pool
        for cid in todo:
            pool.submit(self._vet_one, cid)

    def _vet_one(self, container_id: str) -> None:
        try:
            inspect = functools.partial(self.engine.inspect, container_id)
            self._remember(container_id, self._call(inspect))
        except EngineError as exc:
            log.debug("vetting %s: %s", container_id[:12], exc)
        except Exception:  # a background check must never take the pool down
            log.exception("vetting %s failed", container_id[:12])
        finally:
            with self._vet_lock:
                self._vetting.discard(container_id)

    def _remember(self, container_id: str, info: ContainerState) -> Cgroup | None:
        """Keep the container's cgroup when its live labels allow a pause; else forget it."""
        usable = self._freezing and container_id not in self._unfreezable
        if self.freezer is None or not usable or _refuse_pause(info) is not None:
            self._forget(container_id)
            return None
        try:
            cgroup = self.freezer.cgroup(container_id, info.pid)
            inode = os.stat(cgroup.path).st_ino
        except (CgroupGone, FileNotFoundError):  # stopped meanwhile
            self._forget(container_id)
            return None
        except (FreezerError, OSError) as exc:
            self._forget(container_id)
            with self._vet_lock:
                if len(self._unfreezable) >= MAX_VETTED:
                    self._unfreezable.clear()
                self._unfreezable.add(container_id)
            self._freezer_unusable(str(exc))
            return None
        with self._vet_lock:
            if len(self._vetted) >= MAX_VETTED:
                del self._vetted[next(iter(self._vetted))]
            self._vetted[container_id] = _Vetted(cgroup, inode)
        return cgroup

    def _forget(self, container_id: str) -> None:
        with self._vet_lock:
            self._vetted.pop(container_id, None)

    def _vetted_cgroup(self, container_id: str) -> Cgroup | None:
        """The vetted container's cgroup if it is the same one and thawed, else None."""
        if not self._freezing or self.dry_run:
            return None
        vetted = self._vetted.get(container_id)
        if vetted is None:
            return None
        try:
            if os.stat(vetted.cgroup.path).st_ino != vetted.inode:
                raise CgroupGone("restarted: a new cgroup")
            if vetted.cgroup.state() != THAWED:
                return None  # frozen already: by someone else, or by us; inspect to tell
        except (OSError, FreezerError):
            self._forget(container_id)
            return None
        return vetted.cgroup

    def _vetted_cgroups(self, container_ids: Sequence[str]) -> dict[str, Cgroup]:
        """The cgroup of each of these that is vetted and thawed."""
        found = {cid: self._vetted_cgroup(cid) for cid in container_ids}
        return {cid: cgroup for cid, cgroup in found.items() if cgroup is not None}

    def _freeze(self, cgroups: Mapping[str, Cgroup]) -> dict[str, _Frozen]:
        """Freeze these containers (vetted, thawed) through their cgroups: all the writes
        first, then the waits, so ten freezes cost about what one does."""
        asked: dict[str, tuple[Cgroup, float, float]] = {}
        for cid, cgroup in cgroups.items():
            asked_at, began = time.time(), time.monotonic()
            try:
                cgroup.freeze()
            except CgroupGone:
                self._forget(cid)
                continue
            except FreezerError as exc:  # refused (read-only, no permission): stop trying
                self._forget(cid)
                if self._freezing:
                    self._freezing = False
                    log.warning(
                        "the kernel refused a freeze (%s): the runtime's pause (docker or "
                        "containerd) from now on",
                        exc,
                    )
                continue
            asked[cid] = (cgroup, asked_at, began)
        frozen = {}
        for cid, (cgroup, asked_at, began) in asked.items():
            try:
                cgroup.wait_frozen()
            except CgroupGone:
                self._forget(cid)  # stopped meanwhile: the inspected path says so
                continue
            except FreezerError as exc:  # a process blocked in the kernel: asked, not done
                frozen[cid] = _Frozen(cgroup, asked_at, None, None, str(exc))
                continue
            took_ms = 1000 * (time.monotonic() - began)
            frozen[cid] = _Frozen(cgroup, asked_at, time.time(), took_ms)
        return frozen

    def _frozen(self, action: Step, started: float, frozen: _Frozen) -> Outcome:
        """The pause is done (the container is frozen); the runtime is told in the background.

        The runtime's pause costs 13-100 ms of runc per container: the decision does not
        wait for it, and anything that comes next for this container waits for it
        (``_settle``). Its own audit record (``runtime_pause``) says how it went.
        """
        detail = frozen.detail or ""
        with self._handover_lock:
            if self._handover_pool is None:
                self._handover_pool = ThreadPoolExecutor(
                    max_workers=HANDOVER_WORKERS, thread_name_prefix="handover"
                )
            future = self._handover_pool.submit(self._hand_to_runtime, action, frozen)
            self._handovers[action.container_id] = future
        future.add_done_callback(lambda done: self._handover_done(action.container_id, done))
        outcome = self._done(action, started, Result.OK, None, detail)
        return _with_freeze(outcome, CGROUP, frozen.frozen_at, frozen.freeze_ms)

    def _handover_done(self, container_id: str, future: Future[None]) -> None:
        with self._handover_lock:
            if self._handovers.get(container_id) is future:
                del self._handovers[container_id]

    def _settle(self, container_id: str, cancel: bool) -> None:
        """Wait for the container's hand-over to the runtime, or drop it if not begun."""
        with self._handover_lock:
            future = self._handovers.get(container_id)
        if future is None:
            return
        if cancel and future.cancel():
            self.audit.write(
                RUNTIME_PAUSE, engine=self.engine.name, container_id=container_id,
                result="cancelled",
                detail=f"resumed before {self.engine.name} was told: frozen in its cgroup only",
            )  # fmt: skip
            return
        future.result()  # it never raises: _hand_to_runtime audits its own failures

    def settle(self) -> None:
        """Wait for every hand-over to the runtime begun so far (tests, benchmarks, shutdown)."""
        with self._handover_lock:
            pending = list(self._handovers.values())
        for future in pending:
            if not future.cancelled():
                future.result()

    def _hand_to_runtime(self, action: Step, frozen: _Frozen) -> None:
        """The container is frozen: let the runtime pause it too, so its state says so."""
        assert self.freezer is not None
        cid = action.container_id
        began = time.time()
        result, detail = Result.OK, ""
        try:
            self.freezer.handover(frozen.cgroup, lambda: self._runtime_pause_frozen(cid))
        except CgroupGone:
            self._forget(cid)
            self.journal.released(cid)
            result, detail = Result.SKIPPED, "container is gone"
        except (FreezerError, EngineError) as exc:
            result, detail = Result.FAILED, f"frozen in its cgroup only: {exc}"
        except Exception as exc:  # a background thread: never lose what happened
            log.exception("hand-over of %s to %s failed", action.container, self.engine.name)
            result, detail = Result.FAILED, f"frozen in its cgroup only: {exc!r}"
        if result == Result.FAILED:
            log.warning("%s: the runtime's pause failed, %s", action.container, detail)
        self.audit.write(
            RUNTIME_PAUSE,
            engine=self.engine.name,
            container_id=cid,
            container=action.container,
            result=result,
            detail=detail or None,
            started=began,
            finished=time.time(),
        )

    def _runtime_pause_frozen(self, container_id: str) -> None:
        paused = self._attempt(self.engine.pause, container_id)
        in_line = paused.now is not None and paused.now.paused  # paused meanwhile by someone
        if paused.error is not None and not in_line:
            raise paused.error

    def _freezer_unusable(self, why: str) -> None:
        if not self._freezer_warned:
            self._freezer_warned = True
            log.warning(
                "cannot freeze through the cgroup (%s): the runtime's pause (docker or containerd) "
                "instead",
                why,
            )

    def _held_in_cgroup(self, container_id: str) -> bool:
        """True when the container's cgroup is frozen, or a freeze left a process stopped."""
        if self.freezer is None:
            return False
        vetted = self._vetted.get(container_id)
        try:
            if vetted is not None:
                cgroup = vetted.cgroup
            else:
                info = self._call(functools.partial(self.engine.inspect, container_id))
                cgroup = self.freezer.cgroup(container_id, info.pid)
            return self.freezer.held(cgroup)
        except (FreezerError, EngineRefused):
            return False

    def _unpause(self, action: Step, started: float) -> Outcome:
        cid = action.container_id
        admitted = action.reason in ADMITTING_REASONS
        if self.dry_run:
            return self._done(action, started, Result.DRY_RUN, None, "dry run: not unpaused")
        resumed = self._attempt(functools.partial(resume_container, self.engine, self.freezer), cid)
        if resumed.answer is Answer.GONE:
            self.journal.released(cid)
        if resumed.answer is Answer.DONE:
            result, detail = (Result.OK, "") if resumed.value else (Result.ALREADY, "not paused")
        elif resumed.now is not None and not resumed.now.paused:  # a conflict: unpaused now
            result, detail = Result.ALREADY, "not paused"
        else:
            return self._not_done(action, started, resumed)
        self.journal.released(cid, admitted_at=time.time() if admitted else None)
        return self._done(action, started, result, None, detail)

    def paused_states(self, container_ids: list[str]) -> dict[str, bool | None]:
        """Whether each container is held (None: gone): the engine's paused state from one
        list call, or, where the engine shows it running, a cgroup frozen (or a process
        left stopped) by a pause the engine never heard of."""
        if not container_ids:
            return {}
        listed = self._call(self.engine.containers)
        states: dict[str, bool | None] = {c.id: c.paused for c in listed}
        with self._handover_lock:
            # frozen here and being handed to the runtime: between the thaw and runc's
            # freeze the engine shows it running and the cgroup thawed, yet it is held
            handing_over = {cid for cid, f in self._handovers.items() if not f.done()}
        out = {}
        for cid in container_ids:
            state = states.get(cid)
            if state is False and (cid in handing_over or self._held_in_cgroup(cid)):
                state = True
            out[cid] = state
        return out

    def _attempt(self, call: Callable[[str], T], container_id: str) -> Attempt[T]:
        return attempt(self.engine, call, container_id, self.retries, self.retry_delay_s)

    def _call(self, call: Callable[[], T]) -> T:
        return retried(call, self.retries, self.retry_delay_s)

    def check(self) -> None:
        """Raise ``EngineDown`` unless the engine answers a ping."""
        self._call(self.engine.ping)

    def _not_done(self, action: Step, started: float, tried: Attempt[T]) -> Outcome:
        """An engine call that did not go through: a container gone is a skip; an engine
        down a failure worth a retry (the journal entry is kept); a refusal a failure."""
        if tried.answer is Answer.GONE:
            return self._done(
                action, started, Result.SKIPPED, SkipReason.VANISHED, "container is gone"
            )
        down = tried.answer is Answer.DOWN
        return self._done(action, started, Result.FAILED, None, tried.detail, engine_down=down)

    @staticmethod
    def _done(
        action: Step,
        started: float,
        result: Result,
        skip_reason: SkipReason | None,
        detail: str,
        engine_down: bool = False,
    ) -> Outcome:
        return Outcome(
            action=action.verb,
            result=result,
            container_id=action.container_id,
            skip_reason=skip_reason,
            detail=detail,
            started=started,
            finished=time.time(),
            engine_down=engine_down,
        )


def _refuse_pause(info: ContainerState) -> tuple[SkipReason, str] | None:
    """Why the live container must not be paused, or None."""
    if info.labels.get(labels.ROLE) in COMPONENT_ROLES:
        return SkipReason.GPUGUARD_COMPONENT, "gpuguard's own container"
    if not labels.parse_managed(info.labels.get(labels.MANAGED)):
        return SkipReason.UNMANAGED, f"no {labels.MANAGED}=true label"
    if not info.running:
        return SkipReason.VANISHED, "not running"
    return None


def _with_freeze(
    outcome: Outcome, method: str, frozen_at: float | None, freeze_ms: float | None
) -> Outcome:
    return dataclasses.replace(outcome, method=method, frozen_at=frozen_at, freeze_ms=freeze_ms)


def _frozen_already(cgroup: Cgroup) -> bool:
    try:
        return cgroup.state() != THAWED
    except FreezerError:
        return False  # gone: the engine's path says so
