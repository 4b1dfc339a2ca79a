"""The node mark on Kubernetes: a taint plus a node label, through the official client.

Why: docs/design-notes.md, "Kubernetes taints".
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from gpuguard.contract import Result

TAINT_KEY = "gpuguard.io/deadline-risk"
TAINT_EFFECT = "NoSchedule"
LABEL_KEY = "gpuguard.io/deadline-risk"
MARK_VALUE = "true"
_CONFLICT_RETRIES = 3


def is_marked(node: dict[str, Any]) -> tuple[bool, bool]:
    """Whether the node (the API's JSON) carries gpuguard's taint and its label (pure)."""
    taints = (node.get("spec") or {}).get("taints") or []
    tainted = any(t.get("key") == TAINT_KEY and t.get("effect") == TAINT_EFFECT for t in taints)
    labelled = ((node.get("metadata") or {}).get("labels") or {}).get(LABEL_KEY) == MARK_VALUE
    return tainted, labelled


def with_mark(node: dict[str, Any], mark: bool) -> dict[str, Any] | None:
    """The node with gpuguard's taint and label added (``mark``) or removed, or None when
    it is so already (pure). Nobody else's taint or label is changed."""
    if is_marked(node) == (mark, mark):
        return None
    out = copy.deepcopy(node)
    spec = out.setdefault("spec", {})
    metadata = out.setdefault("metadata", {})
    others = [t for t in spec.get("taints") or [] if t.get("key") != TAINT_KEY]
    labels = {k: v for k, v in (metadata.get("labels") or {}).items() if k != LABEL_KEY}
    if mark:
        others.append({"key": TAINT_KEY, "value": MARK_VALUE, "effect": TAINT_EFFECT})
        labels[LABEL_KEY] = MARK_VALUE
    if others:
        spec["taints"] = others
    else:
        spec.pop("taints", None)
    metadata["labels"] = labels
    return out


def kubernetes_api(server: str | None) -> Any:
    """A CoreV1Api: in-cluster (the pod's service account) or at ``server`` (tests)."""
    from kubernetes import client, config

    if server is None:
        config.load_incluster_config()
        return client.CoreV1Api()
    configuration = client.Configuration(host=server)
    return client.CoreV1Api(client.ApiClient(configuration))


class TaintMarker:
    """Sets or clears this node's taint and label through the Kubernetes API."""

    def __init__(self, node_name: str, api_factory: Callable[[], Any]) -> None:
        self.node_name = node_name
        self._api_factory = api_factory
        self._api: Any = None

    def _client(self) -> Any:
        if self._api is None:
            self._api = self._api_factory()
        return self._api

    def node_id(self) -> str | None:
        """The Kubernetes node this actuator marks (``--node.name``)."""
        return self.node_name

    def apply(self, provisionable: bool) -> Result:
        """Make the mark match; ``ok`` or ``already``. Raises the client's errors."""
        from kubernetes.client import V1Node
        from kubernetes.client.exceptions import ApiException

        api = self._client()
        for attempt in range(_CONFLICT_RETRIES):
            node = api.api_client.sanitize_for_serialization(api.read_node(self.node_name))
            wanted = with_mark(node, mark=not provisionable)
            if wanted is None:
                return Result.ALREADY
            try:
                # The client (v37) sends no Content-Type on a replace unless told (its
                # _content_type is ignored there), and the API server refuses a body of
                # unknown type with 415: the stand-in caught it.
                api.replace_node(
                    self.node_name,
                    V1Node.from_dict(wanted),
                    _headers={"Content-Type": "application/json"},
                )
                return Result.OK
            except ApiException as exc:  # 409: the node changed since the read; read again
                if exc.status != HTTPStatus.CONFLICT or attempt == _CONFLICT_RETRIES - 1:
                    raise
        raise RuntimeError("unreachable")  # pragma: no cover
