"""containerd behind the engine interface: admission without Docker
(``--containerd.address``), through Debian's ``ctr`` (``gpuguard/ctr.py``).

Why: docs/design-notes.md, "The containerd adapter".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from gpuguard import kube
from gpuguard.actuator.engine.base import ContainerState
from gpuguard.actuator.errors import ContainerGone, EngineConflict, EngineDown, EngineRefused
from gpuguard.containerd import ContainerdContainer, read_container, read_containers
from gpuguard.ctr import Ctr, CtrError

T = TypeVar("T")


class ContainerdEngine:
    """One containerd namespace."""

    name = "containerd"

    def __init__(self, ctr: Ctr) -> None:
        self.ctr = ctr

    def ping(self) -> None:
        try:
            self.ctr.run("version")
        except CtrError as exc:
            raise EngineDown(f"containerd unreachable: {exc}") from exc

    def inspect(self, container_id: str) -> ContainerState:
        doc = self._doc(container_id)
        states, pids = self._ctr(self.ctr.tasks)
        container = read_container(
            doc,
            states.get(container_id, "created"),
            pids.get(container_id, 0),
            self._sandbox_labels(doc["Labels"]),
        )
        return container_state(container)

    def containers(
        self, statuses: Collection[str] | None = None, label: str | None = None
    ) -> list[ContainerState]:
        states, pids = self._ctr(self.ctr.tasks)
        docs = {cid: self._doc_or_none(cid) for cid in self._ctr(self.ctr.container_ids)}
        found = read_containers({c: d for c, d in docs.items() if d is not None}, states, pids)
        return [
            container_state(container)
            for container in found.values()
            if (statuses is None or container.state in statuses)
            and (label is None or label in container.labels)
        ]

    def pause(self, container_id: str) -> None:
        self._task_op("pause", container_id, "running")

    def unpause(self, container_id: str) -> None:
        self._task_op("resume", container_id, "paused")

    def _ctr(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except CtrError as exc:
            self._raise_if_down(exc)
            raise EngineRefused(str(exc)) from exc

    def _raise_if_down(self, exc: CtrError) -> None:
        try:
            self.ctr.run("version")
        except CtrError:
            raise EngineDown(f"containerd unreachable: {exc}") from exc

    def _doc(self, container_id: str) -> dict[str, Any]:
        try:
            return self.ctr.info(container_id)
        except CtrError as exc:
            self._raise_if_down(exc)
            if container_id not in self._ctr(self.ctr.container_ids):
                raise ContainerGone(f"no container {container_id}") from exc
            raise EngineDown(str(exc)) from exc  # listed, yet unreadable: ask again

    def _doc_or_none(self, container_id: str) -> dict[str, Any] | None:
        try:
            return self._doc(container_id)
        except ContainerGone:
            return None

    def _sandbox_labels(self, labels: Mapping[str, str]) -> Mapping[str, str] | None:
        identity = kube.pod_identity(labels)
        if identity is None or kube.is_sandbox(labels):
            return None
        uid = identity.pod_uid.replace('"', "")
        found = self._ctr(lambda: self.ctr.run(
            "containers", "list", "--quiet",
            f'labels."{kube.KIND}"=={kube.KIND_SANDBOX},labels."{kube.POD_UID}"=={uid}',
        )).split()  # fmt: skip
        return self._doc(found[0])["Labels"] if found else None

    def _task_op(self, verb: str, container_id: str, needs: str) -> None:
        try:
            self.ctr.run("tasks", verb, container_id)
        except CtrError as exc:
            self._raise_if_down(exc)
            states, _ = self._ctr(self.ctr.tasks)
            state = states.get(container_id)
            if state is None and container_id not in self._ctr(self.ctr.container_ids):
                raise ContainerGone(f"no container {container_id}") from exc
            if state != needs:
                raise EngineConflict(f"container {container_id} is {state}") from exc
            raise EngineRefused(str(exc)) from exc


def container_state(container: ContainerdContainer) -> ContainerState:
    """The engine interface's view of a container the shared layer read (pure)."""
    return ContainerState(
        id=container.id,
        name=container.name,
        labels=container.labels,
        status=container.state,
        running=container.running,
        paused=container.paused,
        pid=container.pid,
    )
