"""Undoing a pause: the one way the executor, reconcile and the guard resume a container
gpuguard may have frozen, through the engine and, where a freeze left something behind,
through the container's cgroup."""

from __future__ import annotations

import functools
import logging

from gpuguard import labels
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.engine.base import Answer, ContainerEngine, attempt, retried
from gpuguard.actuator.engine.freezer import CgroupGone, ContainerFreezer, FreezerError
from gpuguard.contract import Result, StepReason, Verb

log = logging.getLogger("gpuguard.actuator")


def resume_container(
    engine: ContainerEngine, freezer: ContainerFreezer | None, container_id: str
) -> bool:
    """Resume a container gpuguard may have frozen; True when anything was resumed.

    The runtime's unpause if the engine shows it paused; then, with a freezer, its cgroup
    thawed if it is still frozen and any process a freeze left stopped continued: what a
    crash between the cgroup freeze and the runtime's pause leaves (the engine never heard
    of that freeze). Raises the engine's errors (``ContainerGone`` for one that is gone).
    """
    state = engine.inspect(container_id)
    resumed = False
    if state.paused:
        engine.unpause(container_id)
        resumed = True
    if freezer is None or not state.running:
        return resumed
    try:
        cgroup = freezer.cgroup(container_id, state.pid)
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
    engine: ContainerEngine, audit: AuditLog, why: str, freezer: ContainerFreezer | None = None
) -> list[str]:
    """Unpause every container labelled ``gpuguard.managed=true`` that the engine shows
    paused (with a freezer, also every running one whose cgroup a freeze left frozen).

    The fallback when the journal cannot be read: it no longer says which pauses were ours,
    and a tenant left frozen is the one outcome gpuguard must never cause, so every managed
    pause is undone (audited with the reason). Managed containers are by contract under
    gpuguard's admission control; the cost is undoing a manual ``docker pause`` of one.
    Containers not labelled managed (gpuguard's own among them) are never touched; a managed
    one is resumed whatever role it claims, since it may have been paused as a tenant. Raises
    ``EngineDown`` (retry later).
    """
    statuses = ["paused"] if freezer is None else ["paused", "running"]
    listed = retried(functools.partial(engine.containers, statuses, labels.MANAGED))
    resumed = []
    for container in listed:
        if not labels.parse_managed(container.labels.get(labels.MANAGED)):
            continue
        cid = container.id
        resume = functools.partial(resume_container, engine, freezer)
        tried = attempt(engine, resume, cid, look_again=False)
        if tried.answer is Answer.DOWN and tried.error is not None:
            raise tried.error
        if tried.answer is Answer.DONE:
            result, detail = (Result.OK if tried.value else Result.ALREADY), why
        else:  # gone or changed meanwhile: nothing frozen
            result, detail = Result.FAILED, tried.detail
        if result == Result.ALREADY and container.status != "paused":
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
