"""A containerd container as gpuguard reads it (pure): the one translation shared by the
exporter's containerd source and the actuator's containerd engine.

From a trimmed ``ctr containers info`` document (``ctr.trim_info``), its task's state and
PID (``ctr.parse_task_list``, ``ctr.parse_task_pids``) and its pod's sandbox labels: the
name (its Kubernetes container name, else its id), the labels gpuguard reads
(``kube.effective_labels``), its pod and its state. A pod's sandbox is the pod's, never a
workload: ``read_containers`` leaves sandboxes out and joins their labels to their pods'
containers by pod uid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuguard import kube

#: a task state (Docker's words) in which the container's processes exist
UP = ("running", "paused")


@dataclass(frozen=True, slots=True)
class ContainerdContainer:
    """One containerd container, its pod's labels joined."""

    id: str
    name: str  # its Kubernetes container name, else its id
    labels: Mapping[str, str]  # as gpuguard reads them (``kube.effective_labels``)
    pod: kube.PodIdentity | None  # None: not made by the CRI
    state: str  # its task's, in Docker's words; ``created`` when it has no task
    pid: int  # its task's init process (host PID) while running or paused, else 0
    image: str
    args: tuple[str, ...]
    env: tuple[str, ...]
    #: the namespace the pod's sandbox records (the CRI made it for the pod the API server
    #: admitted): the one a trust policy's namespace rule may match; None without a sandbox
    sandbox_namespace: str | None = None

    @property
    def running(self) -> bool:
        return self.state in UP

    @property
    def paused(self) -> bool:
        return self.state == "paused"


def read_container(
    doc: Mapping[str, Any], state: str, pid: int, sandbox_labels: Mapping[str, str] | None
) -> ContainerdContainer:
    """One container from its trimmed info document, its task and its pod's sandbox labels."""
    own = doc["Labels"]
    identity = kube.pod_identity(own)
    return ContainerdContainer(
        id=str(doc["ID"]),
        name=identity.container if identity is not None and identity.container else doc["ID"],
        labels=kube.effective_labels(own, sandbox_labels),
        pod=identity,
        state=state,
        pid=pid if state in UP else 0,
        image=str(doc.get("Image") or ""),
        args=tuple(doc.get("Args") or ()),
        env=tuple(doc.get("Env") or ()),
        sandbox_namespace=(sandbox_labels or {}).get(kube.POD_NAMESPACE)
        if identity is not None
        else None,
    )


def read_containers(
    docs: Mapping[str, Mapping[str, Any]],
    states: Mapping[str, str],
    pids: Mapping[str, int] | None = None,
) -> dict[str, ContainerdContainer]:
    """Every container but the pods' sandboxes, each with its pod's labels (by pod uid);
    a container without a task is ``created``."""
    sandboxes: dict[str, Mapping[str, str]] = {}
    for doc in docs.values():
        identity = kube.pod_identity(doc["Labels"])
        if identity is not None and kube.is_sandbox(doc["Labels"]):
            sandboxes[identity.pod_uid] = doc["Labels"]
    out = {}
    for cid, doc in docs.items():
        if kube.is_sandbox(doc["Labels"]):
            continue
        identity = kube.pod_identity(doc["Labels"])
        pod_labels = sandboxes.get(identity.pod_uid) if identity is not None else None
        state = states.get(cid, "created")
        out[cid] = read_container(doc, state, (pids or {}).get(cid, 0), pod_labels)
    return out
