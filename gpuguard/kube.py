"""Kubernetes identity of a container created by the CRI (pure).

The kubelet, through containerd's CRI plugin, labels every container with its pod's name,
namespace and uid and its own container name; the pod's labels (where an operator puts
``gpuguard.deadline`` and the rest) sit only on the pod's sandbox container, labelled
``io.cri-containerd.kind=sandbox``, and join its containers by pod uid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"
KIND = "io.cri-containerd.kind"
KIND_SANDBOX = "sandbox"

#: labels a pod may carry for gpuguard; read from the sandbox
GPUGUARD_PREFIX = "gpuguard."


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """Which pod a container belongs to, and its Kubernetes container name."""

    namespace: str
    pod: str
    pod_uid: str
    container: str  # empty for a sandbox


def is_sandbox(labels: Mapping[str, str]) -> bool:
    return labels.get(KIND) == KIND_SANDBOX


def pod_identity(labels: Mapping[str, str]) -> PodIdentity | None:
    """The pod a container's CRI labels name, or None for a container the CRI did not make."""
    uid = labels.get(POD_UID)
    name = labels.get(POD_NAME)
    if not uid or not name:
        return None
    return PodIdentity(
        namespace=labels.get(POD_NAMESPACE, ""),
        pod=name,
        pod_uid=uid,
        container=labels.get(CONTAINER_NAME, ""),
    )


def effective_labels(
    container_labels: Mapping[str, str], sandbox_labels: Mapping[str, str] | None
) -> dict[str, str]:
    """The container's labels with its pod's ``gpuguard.*`` labels beneath them.

    A pod label applies to every container of the pod; a container's own label (set by
    something other than the kubelet) wins over it.
    """
    merged = {
        key: value
        for key, value in (sandbox_labels or {}).items()
        if key.startswith(GPUGUARD_PREFIX)
    }
    merged.update(container_labels)
    return merged
