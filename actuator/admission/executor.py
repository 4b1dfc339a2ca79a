"""Carry pause/unpause out on Docker: idempotent, journalled first, audited, retried.

* A pause freezes the container through its cgroup (``freezer``: about 1 ms) and is
  done; then, in the background, the frozen container is handed to Docker (``docker pause``,
  through ``ContainerFreezer.handover``: runc refuses to pause a cgroup that is already
  frozen), so ``docker ps``/``inspect`` show it paused and an operator's ``docker unpause``
  resumes it. Anything that comes next for that container waits for its hand-over (an unpause
  drops one not yet begun). Where no cgroup can be frozen from here (no access, another PID
  namespace, another layout) it is ``docker pause`` alone, as with ``--pause.method=docker``:
  runc, 13 ms alone, ~100 ms for ten at once on two cores.
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
  here even where Docker never heard of it).
* Connection errors are retried a few times, then the action fails with ``docker_down`` set
  (the webhook answers 503 so Alertmanager retries). A freeze through the cgroup needs no
  Docker: it succeeds while Docker is down, and Docker is told when it can be.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeVar

import docker
import docker.errors
import requests

from gpuguard import labels
from gpuguard.actuator.admission.freezer import (
    THAWED,
    Cgroup,
    CgroupGone,
    ContainerFreezer,
    FreezerError,
)
from gpuguard.actuator.admission.policy.types import PAUSE, UNPAUSE, Step
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.errors import DockerUnavailable
from gpuguard.actuator.safety.journal import Journal, PausedEntry
from gpuguard.contract import (
    ADMITTING_REASONS,
    COMPONENT_ROLES,
    Result,
    SkipReason,
    StepReason,
    Verb,
)

log = logging.getLogger("gpuguard.actuator")

T = TypeVar("T")
_SOMEONE_ELSES = "already paused, not by us"
DOCKER_TIMEOUT_S = 5
# A fixed API version: docker-py would otherwise ask the engine for its version when the
# client is made, and fail the actuator's (or guard's) start while Docker is down. 1.41 is
# Docker 20.10; newer engines answer it too.
DOCKER_API_VERSION = "1.41"
#: how a pause was taken (the audit record's ``method``)
CGROUP, DOCKER = "cgroup", "docker"
#: containers whose live check is kept; past this the oldest are dropped (re-inspected)
MAX_VETTED = 4096
#: hand-overs to Docker at once: each runs runc; more at once only share the same cores with
#: the exporter and this actuator's next decision (the frozen containers wait either way)
HANDOVER_WORKERS = 2


def docker_api(url: str | None) -> Any:
    """A low-level Docker client for ``url``, or for DOCKER_HOST / the local socket.

    Making it never contacts the engine: the actuator and the guard start while Docker is
    down and act once it answers.
    """
    if url:
        return docker.APIClient(base_url=url, version=DOCKER_API_VERSION, timeout=DOCKER_TIMEOUT_S)
    return docker.from_env(version=DOCKER_API_VERSION, timeout=DOCKER_TIMEOUT_S).api


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
    docker_down: bool = False
    #: a pause: ``cgroup`` or ``docker``; the wall time every process was frozen (the
    #: kernel said so, or ``docker pause`` returned) and the freeze's own milliseconds
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
    """A container this executor froze through its cgroup; Docker not yet told."""

    cgroup: Cgroup
    asked_at: float  # wall time of the freeze's write
    frozen_at: float | None  # None: the kernel had not confirmed it within the timeout
    freeze_ms: float | None
    detail: str = ""


class DockerExecutor:
    """Pauses and unpauses containers through one Docker engine (and their cgroups)."""

    def __init__(
        self,
        api: Any,
        journal: Journal,
        audit: AuditLog,
        dry_run: bool = False,
        retries: int = 3,
        retry_delay_s: float = 0.05,
        freezer: ContainerFreezer | None = None,
    ) -> None:
        self.api = api  # docker.APIClient
        self.journal = journal
        self.audit = audit
        self.dry_run = dry_run
        self.retries = retries
        self.retry_delay_s = retry_delay_s
        #: None: ``docker pause`` only (``--pause.method=docker``)
        self.freezer = freezer
        self._vetted: dict[str, _Vetted] = {}
        self._vetting: set[str] = set()
        self._vet_lock = threading.Lock()
        self._vet_pool: ThreadPoolExecutor | None = None
        #: False once the kernel refused a freeze from here (no write access): docker
        #: pause from then on; the freezer still thaws what it can
        self._freezing = freezer is not None
        #: containers whose cgroup cannot be found from here: docker pause for them
        self._unfreezable: set[str] = set()
        self._freezer_warned = False
        #: container id -> its hand-over to Docker, pending or running
        self._handovers: dict[str, Future[None]] = {}
        self._handover_lock = threading.Lock()
        self._handover_pool: ThreadPoolExecutor | None = None

    def execute_many(
        self, actions: Sequence[Step], trigger: str, pool: ThreadPoolExecutor
    ) -> list[Outcome]:
        """Several actions in parallel; the pauses' intents are journalled in one write first.

        Tasks that start together must all be frozen inside their input phase; one docker
        pause costs ~11 ms here, and a journal write per pause would serialise them.
        """
        entries = [
            PausedEntry(a.container_id, a.container, a.task_id, a.gpu, time.time(), a.reason)
            for a in actions
            if a.verb == PAUSE and a.container_id not in self.journal.paused and not self.dry_run
        ]
        if entries:
            self.journal.will_pause_many(entries, durable=self.freezer is None)
        fresh = {e.container_id for e in entries}
        # Every freeze first, here and together (~1 ms for all), before any runc runs: the
        # hand-overs to Docker, and inspects of containers never vetted, then go in parallel.
        frozen = self._freeze_vetted([a.container_id for a in actions if a.container_id in fresh])
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
        """Carry out one policy action; never raises for Docker errors.

        ``journalled``: the pause intent is already in the journal (``execute_many``);
        ``frozen``: and the container is already frozen through its cgroup.
        """
        # Whatever comes next for a container, its hand-over to Docker comes first (an
        # unpause drops one not yet begun: thawing the cgroup is then all there is to do).
        self._settle(action.container_id, cancel=action.verb == UNPAUSE)
        started = time.time() if frozen is None else frozen.asked_at
        if action.verb == PAUSE:
            outcome = self._pause(action, started, journalled, frozen)
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
            frozen=outcome.frozen_at,
            freeze_ms=None if outcome.freeze_ms is None else round(outcome.freeze_ms, 3),
        )
        return outcome

    def _pause(
        self, action: Step, started: float, journalled: bool, frozen: _Frozen | None
    ) -> Outcome:
        cid = action.container_id
        if frozen is None and not self.dry_run and self._vetted_cgroup(cid) is not None:
            if not journalled:
                entry = PausedEntry(
                    cid, action.container, action.task_id, action.gpu, started, action.reason
                )
                self.journal.will_pause(entry, durable=False)
                journalled = True
                frozen = self._freeze_vetted([cid]).get(cid)
                self.journal.sync()  # see journal.py: durable right after the freeze
            else:
                frozen = self._freeze_vetted([cid]).get(cid)
        if frozen is not None:
            outcome = self._frozen(action, started, frozen)
        else:
            outcome = self._try_pause(action, started, journalled)
        if (
            journalled
            and outcome.result not in (Result.OK, Result.ALREADY)
            and not outcome.docker_down
        ):
            self.journal.released(action.container_id)  # the batch intent did not happen
        elif journalled and outcome.detail == _SOMEONE_ELSES:
            self.journal.released(action.container_id)
        return outcome

    def _try_pause(self, action: Step, started: float, journalled: bool) -> Outcome:
        cid = action.container_id
        try:
            info = self._call(lambda: self.api.inspect_container(cid))
        except docker.errors.NotFound:
            return self._done(
                action, started, Result.SKIPPED, SkipReason.VANISHED, "container is gone"
            )
        except DockerUnavailable as exc:
            return self._done(action, started, Result.FAILED, None, str(exc), docker_down=True)
        except docker.errors.APIError as exc:
            return self._done(action, started, Result.FAILED, None, _explain(exc))
        refusal = _refuse_pause(info)
        if refusal is not None:
            return self._done(action, started, Result.SKIPPED, refusal[0], refusal[1])
        if info["State"].get("Paused"):
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
            # Frozen, though Docker does not say paused: by an earlier pause of ours whose
            # hand-over to Docker failed (it is in the journal), or by someone else.
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
            frozen = self._freeze_vetted([cid]).get(cid)
            if not journalled:
                self.journal.sync()  # see journal.py: durable right after the freeze
            if frozen is not None:
                return self._frozen(action, started, frozen)
        try:
            self._call(lambda: self.api.pause(cid))
        except docker.errors.NotFound:
            self.journal.released(cid)
            return self._done(
                action, started, Result.SKIPPED, SkipReason.VANISHED, "container is gone"
            )
        except DockerUnavailable as exc:
            # Unknown whether it took effect: keep the journal entry; reconcile settles it.
            return self._done(action, started, Result.FAILED, None, str(exc), docker_down=True)
        except docker.errors.APIError as exc:
            # 409: the container's state changed since the inspect; look again to say how.
            now = self._state_after_conflict(exc, cid)
            if now is not None and now.get("Paused"):
                return self._done(action, started, Result.ALREADY, None, "already paused")
            self.journal.released(cid)
            if now is not None and not now.get("Running"):
                return self._done(
                    action, started, Result.SKIPPED, SkipReason.VANISHED, "not running"
                )
            return self._done(action, started, Result.FAILED, None, _explain(exc))
        outcome = self._done(action, started, Result.OK, None, "")
        return _with_freeze(outcome, DOCKER, outcome.finished, None)

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
            self._remember(
                container_id, self._call(lambda: self.api.inspect_container(container_id))
            )
        except (docker.errors.APIError, DockerUnavailable) as exc:
            log.debug("vetting %s: %s", container_id[:12], exc)
        except Exception:  # a background check must never take the pool down
            log.exception("vetting %s failed", container_id[:12])
        finally:
            with self._vet_lock:
                self._vetting.discard(container_id)

    def _remember(self, container_id: str, info: dict[str, Any]) -> Cgroup | None:
        """Keep the container's cgroup when its live labels allow a pause; else forget it."""
        usable = self._freezing and container_id not in self._unfreezable
        if self.freezer is None or not usable or _refuse_pause(info) is not None:
            self._forget(container_id)
            return None
        try:
            cgroup = self.freezer.cgroup(container_id, int(info["State"].get("Pid") or 0))
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

    def _freeze_vetted(self, container_ids: Sequence[str]) -> dict[str, _Frozen]:
        """Freeze every vetted, thawed container of these through its cgroup: all the
        writes first, then the waits, so ten freezes cost about what one does."""
        asked: dict[str, tuple[Cgroup, float, float]] = {}
        for cid in container_ids:
            cgroup = self._vetted_cgroup(cid)
            if cgroup is None:
                continue
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
        """The pause is done (the container is frozen); Docker is told in the background.

        ``docker pause`` costs 13-100 ms of runc per container: the decision does not wait
        for it, and anything that comes next for this container waits for it (``_settle``).
        Its own audit record (``docker_pause``) says how it went.
        """
        detail = frozen.detail or ""
        with self._handover_lock:
            if self._handover_pool is None:
                self._handover_pool = ThreadPoolExecutor(
                    max_workers=HANDOVER_WORKERS, thread_name_prefix="handover"
                )
            future = self._handover_pool.submit(self._hand_to_docker, action, frozen)
            self._handovers[action.container_id] = future
        future.add_done_callback(lambda done: self._handover_done(action.container_id, done))
        outcome = self._done(action, started, Result.OK, None, detail)
        return _with_freeze(outcome, CGROUP, frozen.frozen_at, frozen.freeze_ms)

    def _handover_done(self, container_id: str, future: Future[None]) -> None:
        with self._handover_lock:
            if self._handovers.get(container_id) is future:
                del self._handovers[container_id]

    def _settle(self, container_id: str, cancel: bool) -> None:
        """Wait for the container's hand-over to Docker, or drop it if not begun (cancel)."""
        with self._handover_lock:
            future = self._handovers.get(container_id)
        if future is None:
            return
        if cancel and future.cancel():
            self.audit.write(
                "docker_pause", container_id=container_id, result="cancelled",
                detail="resumed before docker was told: frozen in its cgroup only",
            )  # fmt: skip
            return
        future.result()  # it never raises: _hand_to_docker audits its own failures

    def settle(self) -> None:
        """Wait for every hand-over to Docker begun so far (tests, benchmarks, shutdown)."""
        with self._handover_lock:
            pending = list(self._handovers.values())
        for future in pending:
            if not future.cancelled():
                future.result()

    def _hand_to_docker(self, action: Step, frozen: _Frozen) -> None:
        """The container is frozen: let Docker pause it too, so its state says so."""
        assert self.freezer is not None
        cid = action.container_id
        began = time.time()
        result, detail = Result.OK, ""
        try:
            self.freezer.handover(frozen.cgroup, lambda: self._docker_pause_frozen(cid))
        except CgroupGone:
            self._forget(cid)
            self.journal.released(cid)
            result, detail = Result.SKIPPED, "container is gone"
        except (FreezerError, DockerUnavailable) as exc:
            result, detail = Result.FAILED, f"frozen in its cgroup only: {exc}"
        except docker.errors.APIError as exc:
            result, detail = Result.FAILED, f"frozen in its cgroup only: {_explain(exc)}"
        except Exception as exc:  # a background thread: never lose what happened
            log.exception("hand-over of %s to docker failed", action.container)
            result, detail = Result.FAILED, f"frozen in its cgroup only: {exc!r}"
        if result == Result.FAILED:
            log.warning("%s: the runtime's pause failed, %s", action.container, detail)
        self.audit.write(
            "docker_pause",
            container_id=cid,
            container=action.container,
            result=result,
            detail=detail or None,
            started=began,
            finished=time.time(),
        )

    def _docker_pause_frozen(self, container_id: str) -> None:
        try:
            self._call(lambda: self.api.pause(container_id))
        except docker.errors.APIError as exc:
            now = self._state_after_conflict(exc, container_id)
            if now is None or not now.get("Paused"):  # paused meanwhile by someone: in line
                raise

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
                info = self._call(lambda: self.api.inspect_container(container_id))
                cgroup = self.freezer.cgroup(container_id, int(info["State"].get("Pid") or 0))
            return self.freezer.held(cgroup)
        except (FreezerError, docker.errors.APIError):
            return False

    def _unpause(self, action: Step, started: float) -> Outcome:
        cid = action.container_id
        admitted = action.reason in ADMITTING_REASONS
        if self.dry_run:
            return self._done(action, started, Result.DRY_RUN, None, "dry run: not unpaused")
        try:
            unpaused = self._call(lambda: resume_container(self.api, self.freezer, cid))
            result, detail = (Result.OK, "") if unpaused else (Result.ALREADY, "not paused")
        except docker.errors.NotFound:
            self.journal.released(cid)
            return self._done(
                action, started, Result.SKIPPED, SkipReason.VANISHED, "container is gone"
            )
        except DockerUnavailable as exc:
            return self._done(action, started, Result.FAILED, None, str(exc), docker_down=True)
        except docker.errors.APIError as exc:
            now = self._state_after_conflict(exc, cid)
            if now is None or now.get("Paused"):
                return self._done(action, started, Result.FAILED, None, _explain(exc))
            result, detail = Result.ALREADY, "not paused"
        self.journal.released(cid, admitted_at=time.time() if admitted else None)
        return self._done(action, started, result, None, detail)

    def paused_states(self, container_ids: list[str]) -> dict[str, bool | None]:
        """Whether each container is held (None: gone): Docker's ``State.Paused`` from one
        list call, or, where Docker shows it running, a cgroup frozen (or a process left
        stopped) by a pause Docker never heard of."""
        if not container_ids:
            return {}
        listed = self._call(lambda: self.api.containers(all=True))
        states: dict[str, bool | None] = {c["Id"]: c.get("State") == "paused" for c in listed}
        with self._handover_lock:
            # frozen here and being handed to Docker: between the thaw and runc's freeze
            # Docker shows it running and the cgroup thawed, yet it is held (stopped)
            handing_over = {cid for cid, f in self._handovers.items() if not f.done()}
        out = {}
        for cid in container_ids:
            state = states.get(cid)
            if state is False and (cid in handing_over or self._held_in_cgroup(cid)):
                state = True
            out[cid] = state
        return out

    def is_paused(self, container_id: str) -> bool | None:
        """Docker's ``State.Paused``, or None when the container is gone."""
        try:
            info = self._call(lambda: self.api.inspect_container(container_id))
        except docker.errors.NotFound:
            return None
        return bool(info["State"].get("Paused"))

    def _state_after_conflict(
        self, exc: docker.errors.APIError, container_id: str
    ) -> dict[str, Any] | None:
        """The container's ``State`` after a 409 Conflict, else None (decide by status)."""
        if exc.status_code != HTTPStatus.CONFLICT:
            return None
        try:
            info = self._call(lambda: self.api.inspect_container(container_id))
        except (docker.errors.APIError, DockerUnavailable):
            return None
        return dict(info.get("State") or {})

    def _call(self, fn: Callable[[], T]) -> T:
        return docker_call(fn, self.retries, self.retry_delay_s)

    def check(self) -> None:
        """Raise ``DockerUnavailable`` unless the engine answers a ping."""
        self._call(self.api.ping)

    @staticmethod
    def _done(
        action: Step,
        started: float,
        result: Result,
        skip_reason: SkipReason | None,
        detail: str,
        docker_down: bool = False,
    ) -> Outcome:
        return Outcome(
            action=action.verb,
            result=result,
            container_id=action.container_id,
            skip_reason=skip_reason,
            detail=detail,
            started=started,
            finished=time.time(),
            docker_down=docker_down,
        )


def docker_call(fn: Callable[[], T], retries: int = 3, delay_s: float = 0.05) -> T:
    """Run a Docker call, retrying connection failures; raises ``DockerUnavailable``.

    A read timeout is not retried: the engine took the request and did not answer within
    ``DOCKER_TIMEOUT_S``, and asking a hung dockerd again only multiplies the wait.
    """
    last: Exception | None = None
    for attempt in range(retries):
        try:
            return fn()
        except (requests.ConnectionError, requests.Timeout) as exc:
            last = exc
            if isinstance(exc, requests.ReadTimeout):
                break
            time.sleep(delay_s * (attempt + 1))
    raise DockerUnavailable(f"docker engine unreachable: {last}")


def unpause_if_paused(api: Any, container_id: str) -> bool:
    """Unpause the container if Docker shows it paused; True when it did. Raises docker's
    and requests' errors (``NotFound`` for a container that is gone)."""
    if not api.inspect_container(container_id)["State"].get("Paused"):
        return False
    api.unpause(container_id)
    return True


def resume_container(api: Any, freezer: ContainerFreezer | None, container_id: str) -> bool:
    """Resume a container gpuguard may have frozen; True when anything was resumed.

    ``docker unpause`` if Docker shows it paused; then, with a freezer, its cgroup thawed if
    it is still frozen and any process a freeze left stopped continued: what a crash between
    the cgroup freeze and ``docker pause`` leaves (Docker never heard of that freeze). Raises
    docker's and requests' errors (``NotFound`` for a container that is gone).
    """
    info = api.inspect_container(container_id)
    resumed = False
    if info["State"].get("Paused"):
        api.unpause(container_id)
        resumed = True
    if freezer is None or not info["State"].get("Running"):
        return resumed
    try:
        cgroup = freezer.cgroup(container_id, int(info["State"].get("Pid") or 0))
    except FreezerError as exc:  # not visible from here: nothing can have been frozen here
        log.debug("%s: no cgroup to check: %s", container_id[:12], exc)
        return resumed
    try:
        resumed |= freezer.ensure_running(cgroup)
    except CgroupGone:
        pass  # stopped meanwhile: nothing is frozen
    except FreezerError as exc:
        log.warning("%s: cannot thaw its cgroup: %s", container_id[:12], exc)
    return resumed


def resume_managed_paused(
    api: Any, audit: AuditLog, why: str, freezer: ContainerFreezer | None = None
) -> list[str]:
    """Unpause every container labelled ``gpuguard.managed=true`` that Docker shows paused
    (with a freezer, also every running one whose cgroup a freeze left frozen).

    The fallback when the journal cannot be read: it no longer says which pauses were ours,
    and a tenant left frozen is the one outcome gpuguard must never cause, so every managed
    pause is undone (audited with the reason). Managed containers are by contract under
    gpuguard's admission control; the cost is undoing a manual ``docker pause`` of one.
    Containers not labelled managed, and gpuguard's own, are never touched. Raises
    ``DockerUnavailable`` (retry later).
    """
    statuses = ["paused"] if freezer is None else ["paused", "running"]
    listed = docker_call(
        lambda: api.containers(filters={"status": statuses, "label": labels.MANAGED})
    )
    resumed = []
    for summary in listed:
        container_labels = summary.get("Labels") or {}
        if not labels.parse_managed(container_labels.get(labels.MANAGED)):
            continue
        if container_labels.get(labels.ROLE) in COMPONENT_ROLES:
            continue
        cid: str = summary["Id"]
        try:
            unpaused = docker_call(functools.partial(resume_container, api, freezer, cid))
            result, detail = (Result.OK if unpaused else Result.ALREADY), why
        except docker.errors.APIError as exc:  # gone or changed meanwhile: nothing frozen
            result, detail = Result.FAILED, _explain(exc)
        if result == Result.ALREADY and summary.get("State") != "paused":
            continue  # running and nothing held: not one of the pauses undone here
        audit.write(
            "action",
            action=Verb.UNPAUSE,
            result=result,
            container_id=cid,
            reason=StepReason.JOURNAL_LOST,
            detail=detail,
        )
        if result == Result.OK:
            resumed.append(cid)
    return resumed


def _refuse_pause(info: dict[str, Any]) -> tuple[SkipReason, str] | None:
    """Why the live container must not be paused, or None."""
    container_labels = (info.get("Config") or {}).get("Labels") or {}
    if container_labels.get(labels.ROLE) in COMPONENT_ROLES:
        return SkipReason.GPUGUARD_COMPONENT, "gpuguard's own container"
    if not labels.parse_managed(container_labels.get(labels.MANAGED)):
        return SkipReason.UNMANAGED, f"no {labels.MANAGED}=true label"
    if not info["State"].get("Running"):
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
        return False  # gone: the Docker path says so


def _explain(exc: docker.errors.APIError) -> str:
    return str(getattr(exc, "explanation", None) or exc)
