"""Which containers may be frozen through their cgroups, and freezing them.

``vet`` checks a container's live labels once in its life (in the background) and keeps its
cgroup; ``ready`` gives that cgroup back only while it is the same directory and thawed;
``freeze`` freezes several at once (all the writes, then the waits). Nothing that fails
here raises: a container that cannot be frozen is left to the runtime's pause.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gpuguard import labels
from gpuguard.actuator.engine.base import ContainerState
from gpuguard.actuator.engine.freezer import (
    THAWED,
    Cgroup,
    CgroupGone,
    ContainerFreezer,
    FreezerError,
)
from gpuguard.actuator.errors import EngineError, EngineRefused
from gpuguard.contract import COMPONENT_ROLES, SkipReason

log = logging.getLogger("gpuguard.actuator")

#: containers whose live check is kept; past this the oldest are dropped (re-inspected)
MAX_VETTED = 4096


@dataclass(frozen=True)
class Vetted:
    """A container whose live labels allow a pause, and its cgroup's directory as vetted."""

    cgroup: Cgroup
    inode: int


@dataclass(frozen=True)
class Frozen:
    """A container frozen here through its cgroup; the runtime not yet told."""

    cgroup: Cgroup
    asked_at: float  # wall time of the freeze's write
    frozen_at: float | None  # None: the kernel had not confirmed it within the timeout
    freeze_ms: float | None
    detail: str = ""


class Vetting:
    """The live checks and cgroups of the containers that may be paused; thread-safe."""

    def __init__(
        self, freezer: ContainerFreezer | None, inspect: Callable[[str], ContainerState]
    ) -> None:
        """``inspect(container_id)``: the live container, retried; raises the engine's errors."""
        self.freezer = freezer
        self._inspect = inspect
        self._vetted: dict[str, Vetted] = {}
        self._vetting: set[str] = set()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        #: False once the kernel refused a freeze from here (no write access): the
        #: runtime's pause from then on; the freezer still thaws what it can
        self.freezing = freezer is not None
        #: containers whose cgroup cannot be found from here: the runtime's pause for them
        self._unfreezable: set[str] = set()
        self._warned = False

    def vet(self, container_ids: Sequence[str]) -> None:
        """Check, in the background, containers that may be paused soon."""
        if not self.freezing:
            return
        with self._lock:
            skip = self._vetted.keys() | self._vetting | self._unfreezable
            todo = [c for c in container_ids if c not in skip]
            if not todo:
                return
            self._vetting.update(todo)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="vet")
            pool = self._pool
        for cid in todo:
            pool.submit(self._vet_one, cid)

    def _vet_one(self, container_id: str) -> None:
        try:
            self.remember(container_id, self._inspect(container_id))
        except EngineError as exc:
            log.debug("vetting %s: %s", container_id[:12], exc)
        except Exception:  # a background check must never take the pool down
            log.exception("vetting %s failed", container_id[:12])
        finally:
            with self._lock:
                self._vetting.discard(container_id)

    def remember(self, container_id: str, info: ContainerState) -> Cgroup | None:
        """Keep the container's cgroup when its live labels allow a pause; else forget it."""
        usable = self.freezing and container_id not in self._unfreezable
        if self.freezer is None or not usable or refuse_pause(info) is not None:
            self.forget(container_id)
            return None
        try:
            cgroup = self.freezer.cgroup(container_id, info.pid)
            inode = os.stat(cgroup.path).st_ino
        except (CgroupGone, FileNotFoundError):  # stopped meanwhile
            self.forget(container_id)
            return None
        except (FreezerError, OSError) as exc:
            self.forget(container_id)
            with self._lock:
                if len(self._unfreezable) >= MAX_VETTED:
                    self._unfreezable.clear()
                self._unfreezable.add(container_id)
            self._unusable(str(exc))
            return None
        with self._lock:
            if len(self._vetted) >= MAX_VETTED:
                del self._vetted[next(iter(self._vetted))]
            self._vetted[container_id] = Vetted(cgroup, inode)
        return cgroup

    def forget(self, container_id: str) -> None:
        with self._lock:
            self._vetted.pop(container_id, None)

    def ready(self, container_id: str) -> Cgroup | None:
        """The vetted container's cgroup if it is the same one and thawed, else None."""
        if not self.freezing:
            return None
        try:
            cgroup = self._same_cgroup(container_id)
            if cgroup is None or cgroup.state() != THAWED:
                return None  # frozen already: by someone else, or by us; inspect to tell
        except (OSError, FreezerError):
            self.forget(container_id)
            return None
        return cgroup

    def _same_cgroup(self, container_id: str) -> Cgroup | None:
        """The vetted container's cgroup (None: not vetted); ``CgroupGone`` where its
        directory is not the one vetted (restarted), ``OSError`` where it cannot be read."""
        vetted = self._vetted.get(container_id)
        if vetted is None:
            return None
        if os.stat(vetted.cgroup.path).st_ino != vetted.inode:
            raise CgroupGone("restarted: a new cgroup")
        return vetted.cgroup

    def ready_many(self, container_ids: Sequence[str]) -> dict[str, Cgroup]:
        """The cgroup of each of these that is vetted and thawed."""
        found = {cid: self.ready(cid) for cid in container_ids}
        return {cid: cgroup for cid, cgroup in found.items() if cgroup is not None}

    def freeze(self, cgroups: Mapping[str, Cgroup]) -> dict[str, Frozen]:
        """Freeze these containers (vetted, thawed) through their cgroups: all the writes
        first, then the waits, so ten freezes cost about what one does."""
        asked: dict[str, tuple[Cgroup, float, float]] = {}
        for cid, cgroup in cgroups.items():
            asked_at, began = time.time(), time.monotonic()
            try:
                cgroup.freeze()
            except CgroupGone:
                self.forget(cid)
                continue
            except FreezerError as exc:  # refused (read-only, no permission): stop trying
                self.forget(cid)
                if self.freezing:
                    self.freezing = False
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
                self.forget(cid)  # stopped meanwhile: the inspected path says so
                continue
            except FreezerError as exc:  # a process blocked in the kernel: asked, not done
                frozen[cid] = Frozen(cgroup, asked_at, None, None, str(exc))
                continue
            took_ms = 1000 * (time.monotonic() - began)
            frozen[cid] = Frozen(cgroup, asked_at, time.time(), took_ms)
        return frozen

    def thaw(self, container_id: str) -> bool | None:
        """Thaw a vetted container frozen here that the runtime was never told of, through its
        cgroup alone (``ensure_running``): whether anything was thawed; None where that
        cannot be done from here (not vetted, restarted, or refused): ask the runtime."""
        if self.freezer is None:
            return None
        try:
            cgroup = self._same_cgroup(container_id)
            return None if cgroup is None else self.freezer.ensure_running(cgroup)
        except (OSError, FreezerError):
            return None

    def held(self, container_id: str, freezer: ContainerFreezer | None) -> bool:
        """True when the container's cgroup is frozen, or a freeze left a process stopped."""
        if freezer is None:
            return False
        vetted = self._vetted.get(container_id)
        try:
            if vetted is not None:
                cgroup = vetted.cgroup
            else:
                info = self._inspect(container_id)
                cgroup = freezer.cgroup(container_id, info.pid)
            return freezer.held(cgroup)
        except (FreezerError, EngineRefused):
            return False

    def _unusable(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "cannot freeze through the cgroup (%s): the runtime's pause (docker or containerd) "
                "instead",
                why,
            )


def refuse_pause(info: ContainerState) -> tuple[SkipReason, str] | None:
    """Why the live container must not be paused, or None. A container labelled managed is
    a tenant whatever role it claims (the exporter believes a managed container's role only
    where the operator's trust policy grants it, and then no decision names it)."""
    if not labels.parse_managed(info.labels.get(labels.MANAGED)):
        if info.labels.get(labels.ROLE) in COMPONENT_ROLES:
            return SkipReason.GPUGUARD_COMPONENT, "gpuguard's own container"
        return SkipReason.UNMANAGED, f"no {labels.MANAGED}=true label"
    if not info.running:
        return SkipReason.VANISHED, "not running"
    return None


def frozen_already(cgroup: Cgroup) -> bool:
    """Whether the cgroup is frozen (or freezing); False when it is gone."""
    try:
        return cgroup.state() != THAWED
    except FreezerError:
        return False  # gone: the engine's path says so
