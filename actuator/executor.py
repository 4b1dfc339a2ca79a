"""Carry pause/unpause out on Docker: idempotent, journalled first, audited, retried.

* The live container is inspected first: a vanished container is a skip, a container already
  in the wanted state is ``already``, and the ``gpuguard.managed`` / ``gpuguard.role`` labels
  are re-checked on the live container before any pause (the exporter's view may be stale).
* A pause is written to the journal before it is taken, so a crash in between still leaves a
  record the guard and the next start can undo.
* Connection errors are retried a few times, then the action fails with ``docker_down`` set
  (the webhook answers 503 so Alertmanager retries).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeVar

import docker
import docker.errors
import requests

from gpuguard import labels
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.errors import DockerUnavailable
from gpuguard.actuator.journal import Journal, PausedEntry
from gpuguard.actuator.policy import PAUSE, UNPAUSE, Action
from gpuguard.contract import (
    ADMITTING_REASONS,
    COMPONENT_ROLES,
    ActionKind,
    ActionReason,
    Result,
    SkipReason,
)

T = TypeVar("T")
_SOMEONE_ELSES = "already paused, not by us"
DOCKER_TIMEOUT_S = 5
# A fixed API version: docker-py would otherwise ask the engine for its version when the
# client is made, and fail the actuator's (or guard's) start while Docker is down. 1.41 is
# Docker 20.10; newer engines answer it too.
DOCKER_API_VERSION = "1.41"


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

    action: ActionKind
    result: Result
    container_id: str
    skip_reason: SkipReason | None = None
    detail: str = ""
    started: float = 0.0
    finished: float = 0.0
    docker_down: bool = False


class DockerExecutor:
    """Pauses and unpauses containers through one Docker engine."""

    def __init__(
        self,
        api: Any,
        journal: Journal,
        audit: AuditLog,
        dry_run: bool = False,
        retries: int = 3,
        retry_delay_s: float = 0.05,
    ) -> None:
        self.api = api  # docker.APIClient
        self.journal = journal
        self.audit = audit
        self.dry_run = dry_run
        self.retries = retries
        self.retry_delay_s = retry_delay_s

    def execute_many(
        self, actions: Sequence[Action], trigger: str, pool: ThreadPoolExecutor
    ) -> list[Outcome]:
        """Several actions in parallel; the pauses' intents are journalled in one write first.

        Tasks that start together must all be frozen inside their input phase; one docker
        pause costs ~11 ms here, and a journal write per pause would serialise them.
        """
        entries = [
            PausedEntry(a.container_id, a.container, a.task_id, a.gpu, time.time(), a.reason)
            for a in actions
            if a.kind == PAUSE and a.container_id not in self.journal.paused and not self.dry_run
        ]
        if entries:
            self.journal.will_pause_many(entries)
        fresh = {e.container_id for e in entries}
        return list(pool.map(lambda a: self.execute(a, trigger, a.container_id in fresh), actions))

    def execute(self, action: Action, trigger: str, journalled: bool = False) -> Outcome:
        """Carry out one policy action; never raises for Docker errors.

        ``journalled``: the pause intent is already in the journal (``execute_many``).
        """
        started = time.time()
        if action.kind == PAUSE:
            outcome = self._pause(action, started, journalled)
        elif action.kind == UNPAUSE:
            outcome = self._unpause(action, started)
        else:  # pragma: no cover - the policy only makes these two
            raise ValueError(f"unknown action {action.kind!r}")
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
        )
        return outcome

    def _pause(self, action: Action, started: float, journalled: bool) -> Outcome:
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

    def _try_pause(self, action: Action, started: float, journalled: bool) -> Outcome:
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
        if self.dry_run:
            return self._done(action, started, Result.DRY_RUN, None, "dry run: not paused")
        if not journalled:
            entry = PausedEntry(
                cid, action.container, action.task_id, action.gpu, started, action.reason
            )
            self.journal.will_pause(entry)
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
        return self._done(action, started, Result.OK, None, "")

    def _unpause(self, action: Action, started: float) -> Outcome:
        cid = action.container_id
        admitted = action.reason in ADMITTING_REASONS
        if self.dry_run:
            return self._done(action, started, Result.DRY_RUN, None, "dry run: not unpaused")
        try:
            unpaused = self._call(lambda: unpause_if_paused(self.api, cid))
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
        """Docker's ``State.Paused`` of each container (None: gone), in one list call."""
        if not container_ids:
            return {}
        listed = self._call(lambda: self.api.containers(all=True))
        states = {c["Id"]: c.get("State") == "paused" for c in listed}
        return {cid: states.get(cid) for cid in container_ids}

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
        action: Action,
        started: float,
        result: Result,
        skip_reason: SkipReason | None,
        detail: str,
        docker_down: bool = False,
    ) -> Outcome:
        return Outcome(
            action=action.kind,
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


def resume_managed_paused(api: Any, audit: AuditLog, why: str) -> list[str]:
    """Unpause every container labelled ``gpuguard.managed=true`` that Docker shows paused.

    The fallback when the journal cannot be read: it no longer says which pauses were ours,
    and a tenant left frozen is the one outcome gpuguard must never cause, so every managed
    pause is undone (audited with the reason). Managed containers are by contract under
    gpuguard's admission control; the cost is undoing a manual ``docker pause`` of one.
    Containers not labelled managed, and gpuguard's own, are never touched. Raises
    ``DockerUnavailable`` (retry later).
    """
    listed = docker_call(
        lambda: api.containers(filters={"status": "paused", "label": labels.MANAGED})
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
            unpaused = docker_call(functools.partial(unpause_if_paused, api, cid))
            result, detail = (Result.OK if unpaused else Result.ALREADY), why
        except docker.errors.APIError as exc:  # gone or changed meanwhile: nothing frozen
            result, detail = Result.FAILED, _explain(exc)
        audit.write(
            "action",
            action=ActionKind.UNPAUSE,
            result=result,
            container_id=cid,
            reason=ActionReason.JOURNAL_LOST,
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


def _explain(exc: docker.errors.APIError) -> str:
    return str(getattr(exc, "explanation", None) or exc)
