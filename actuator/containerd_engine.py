"""containerd behind the few engine calls the actuator and the guard make: admission without
Docker (``--container.source containerd``).

The executor, the guard and reconcile speak the Docker engine's calls (``inspect_container``,
``pause``, ``unpause``, ``containers``, ``ping``, ``info``) and decide by docker-py's error
types; this answers them from containerd through ``ctr`` and translates at this one boundary:
containerd unreachable is a ``requests.ConnectionError`` (retried, then "engine down"), a
container that is gone is ``docker.errors.NotFound``, a task not in the state an operation
needs is a 409 ``APIError`` (decided from the task's state, never from ``ctr``'s words).

So the freeze is the same runtime-agnostic cgroup freeze (``actuator/admission/freezer.py``, by
container id and task PID, under either kubelet cgroup driver), handed over to containerd's
own task pause so ``ctr tasks list`` and the kubelet's view agree; the journal, the guard and
the maximum pause work unchanged. On a Kubernetes node ``gpuguard.managed`` (and the other
``gpuguard.*`` labels) may be pod labels: they are read from the pod's sandbox, as the
exporter reads them. The sandbox itself is never listed (nor paused).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import docker.errors
import requests

from gpuguard import kube
from gpuguard.ctr import Ctr, CtrError


def _conflict(message: str) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = HTTPStatus.CONFLICT
    return docker.errors.APIError(message, response=response)


class ContainerdEngine:
    """The Docker engine calls the actuator makes, answered by containerd (one namespace)."""

    def __init__(self, ctr: Ctr) -> None:
        self.ctr = ctr

    def _run(self, *args: str) -> str:
        try:
            return self.ctr.run(*args)
        except CtrError as exc:
            self._raise_if_down(exc)
            raise

    def _raise_if_down(self, exc: CtrError) -> None:
        try:
            self.ctr.run("version")
        except CtrError:
            raise requests.ConnectionError(f"containerd unreachable: {exc}") from exc

    def ping(self) -> bool:
        try:
            self.ctr.run("version")
        except CtrError as exc:
            raise requests.ConnectionError(f"containerd unreachable: {exc}") from exc
        return True

    def info(self) -> dict[str, Any]:
        return {}  # no Swarm here: node marks on Kubernetes are taints (issue 17, item 4)

    def _doc(self, container_id: str) -> dict[str, Any]:
        try:
            return self.ctr.info(container_id)
        except CtrError as exc:
            self._raise_if_down(exc)
            if container_id not in self.ctr.container_ids():
                raise docker.errors.NotFound(f"no container {container_id}") from exc
            raise requests.ConnectionError(str(exc)) from exc

    def _sandbox_labels(self, labels: dict[str, str]) -> dict[str, str] | None:
        identity = kube.pod_identity(labels)
        if identity is None or kube.is_sandbox(labels):
            return None
        uid = identity.pod_uid.replace('"', "")
        found = self._run(
            "containers", "list", "--quiet",
            f'labels."{kube.KIND}"=={kube.KIND_SANDBOX},labels."{kube.POD_UID}"=={uid}',
        ).split()  # fmt: skip
        return self._doc(found[0])["Labels"] if found else None

    def inspect_container(self, container_id: str) -> dict[str, Any]:
        """Docker's inspect document, as far as the actuator reads it."""
        doc = self._doc(container_id)
        states, pids = self.ctr.tasks()
        return _inspect_doc(doc, states.get(container_id, "created"), pids.get(container_id, 0),
                            self._sandbox_labels(doc["Labels"]))  # fmt: skip

    def containers(
        self, all: bool = False, filters: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Docker's container list (``Id``, ``State``, ``Labels``), with its ``status`` and
        ``label`` (key present) filters; the pods' sandboxes are left out."""
        filters = filters or {}
        statuses = filters.get("status")
        label = filters.get("label")
        states, _ = self.ctr.tasks()
        docs = {cid: self._doc_or_none(cid) for cid in self.ctr.container_ids()}
        sandboxes = {
            identity.pod_uid: doc["Labels"]
            for doc in docs.values()
            if doc is not None and kube.is_sandbox(doc["Labels"])
            and (identity := kube.pod_identity(doc["Labels"])) is not None
        }  # fmt: skip
        out = []
        for cid, doc in docs.items():
            if doc is None or kube.is_sandbox(doc["Labels"]):
                continue
            identity = kube.pod_identity(doc["Labels"])
            pod_labels = sandboxes.get(identity.pod_uid) if identity is not None else None
            labels = kube.effective_labels(doc["Labels"], pod_labels)
            state = states.get(cid, "created")
            if statuses is not None and state not in statuses:
                continue
            if statuses is None and not all and state not in ("running", "paused"):
                continue
            if label is not None and label not in labels:
                continue
            out.append({"Id": cid, "State": state, "Labels": labels})
        return out

    def _doc_or_none(self, container_id: str) -> dict[str, Any] | None:
        try:
            return self._doc(container_id)
        except docker.errors.NotFound:
            return None

    def pause(self, container_id: str) -> None:
        self._task_op("pause", container_id, "running")

    def unpause(self, container_id: str) -> None:
        self._task_op("resume", container_id, "paused")

    def _task_op(self, verb: str, container_id: str, needs: str) -> None:
        try:
            self.ctr.run("tasks", verb, container_id)
        except CtrError as exc:
            self._raise_if_down(exc)
            states, _ = self.ctr.tasks()
            if container_id not in states and container_id not in self.ctr.container_ids():
                raise docker.errors.NotFound(f"no container {container_id}") from exc
            if states.get(container_id) != needs:
                raise _conflict(f"container {container_id} is {states.get(container_id)}") from exc
            raise docker.errors.APIError(str(exc)) from exc

    def close(self) -> None:
        pass


def _inspect_doc(
    doc: dict[str, Any], state: str, pid: int, sandbox_labels: dict[str, str] | None
) -> dict[str, Any]:
    """A trimmed ``ctr containers info`` document and its task as Docker's inspect (pure)."""
    identity = kube.pod_identity(doc["Labels"])
    name = identity.container if identity is not None and identity.container else doc["ID"]
    return {
        "Id": doc["ID"],
        "Name": f"/{name}",
        "Config": {"Labels": kube.effective_labels(doc["Labels"], sandbox_labels)},
        "State": {
            "Status": state,
            "Running": state in ("running", "paused"),
            "Paused": state == "paused",
            "Pid": pid if state in ("running", "paused") else 0,
        },
    }


def engine_api(docker_host: str | None, containerd_address: str | None, namespace: str) -> Any:
    """The engine the actuator and the guard act through: containerd where its address is
    given (``--containerd.address``), else Docker."""
    if containerd_address:
        return ContainerdEngine(Ctr(containerd_address, namespace))
    from gpuguard.actuator.admission.executor import docker_api

    return docker_api(docker_host)
