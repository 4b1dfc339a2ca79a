"""Kubernetes identity of a container created by the CRI, and the gpuguard labels it is
given (pure).

The kubelet, through containerd's CRI plugin, labels every container with its pod's name,
namespace and uid and its own container name; the pod's labels (where an operator puts
``gpuguard.deadline`` and the rest) sit only on the pod's sandbox container, labelled
``io.cri-containerd.kind=sandbox``, and join its containers by pod uid.

What else a CRI container's labels hold comes from its image: containerd's CRI merges the
image config's ``Labels`` into the container's labels beneath the kubelet's
(``buildLabels`` in ``pkg/cri/server/helpers.go``, called by ``CreateContainer``), and the
kubelet's are the four ``io.kubernetes.*`` names only (``newContainerLabels``). A
``gpuguard.*`` label on a CRI container was therefore put there by whoever built its image,
never by the pod spec: gpuguard reads such a container's claims from its pod alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# pod_identity's parameter is called labels: import the one name, not the module
from gpuguard.labels import CONTAINER as GPUGUARD_CONTAINER

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
    """The labels gpuguard reads for a container: on a container the CRI made, its own
    labels without any ``gpuguard.*`` (they came from its image) and its pod's ``gpuguard.*``
    labels instead, when the pod's ``gpuguard.container`` names it or is absent; on any
    other container, its own labels.

    ``gpuguard.container`` keeps a pod's claims (class, deadline, SLO, ...) on the one
    container it names, so a sidecar never inherits them; it is not passed on itself.
    """
    identity = pod_identity(container_labels)
    if identity is None:
        return dict(container_labels)  # made by hand (ctr run), not by a pod spec
    merged = {
        key: value for key, value in container_labels.items() if not key.startswith(GPUGUARD_PREFIX)
    }
    pod = {
        key: value
        for key, value in (sandbox_labels or {}).items()
        if key.startswith(GPUGUARD_PREFIX)
    }
    scope = pod.pop(GPUGUARD_CONTAINER, None)
    if scope is None or scope == identity.container:
        merged.update(pod)
    return merged
