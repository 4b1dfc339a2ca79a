"""The node list executed as a Docker Swarm node label (``nodemarks.NodeMarker``).

``SwarmMarker`` sets ``gpuguard.provisionable=false`` on this node while it is not
provisionable and removes it when it is again, so a service with the constraint
``node.labels.gpuguard.provisionable!=false`` is not placed here. It lives beside the
Docker adapter because Swarm is Docker's; the node list itself (``nodemarks/nodelist.py``)
stays pure. On containerd there is no Swarm: the node list alone, or a Kubernetes taint.
"""

from __future__ import annotations

from gpuguard.actuator.engine.docker import DockerEngine
from gpuguard.actuator.errors import EngineRefused
from gpuguard.contract import Result
from gpuguard.labels import PROVISIONABLE

_SEQUENCE_RETRIES = 5


class SwarmMarker:
    """Sets or clears this node's Swarm label through a manager engine."""

    def __init__(self, local: DockerEngine, manager: DockerEngine) -> None:
        self.local = local
        self.manager = manager

    def node_id(self) -> str | None:
        """This engine's Swarm node id, or None when it is not in a swarm."""
        return self.local.swarm_node_id()

    def apply(self, provisionable: bool) -> Result:
        """Make the label match; returns ``ok`` or ``already``. Raises the engine's errors."""
        node_id = self.node_id()
        if node_id is None:
            raise RuntimeError("this engine is not part of a swarm")
        for attempt in range(_SEQUENCE_RETRIES):
            version, spec = self.manager.swarm_node(node_id)
            node_labels = dict(spec.get("Labels") or {})
            if provisionable == (node_labels.get(PROVISIONABLE) != "false"):
                return Result.ALREADY
            if provisionable:
                node_labels.pop(PROVISIONABLE, None)
            else:
                node_labels[PROVISIONABLE] = "false"
            spec["Labels"] = node_labels
            try:
                # The version makes this a compare-and-swap against concurrent updates.
                self.manager.update_swarm_node(node_id, version, spec)
                return Result.OK
            except EngineRefused:
                # Docker reports a lost compare-and-swap as a plain server error; what tells
                # it apart is that the node's version moved on: then try again on the new one.
                if attempt == _SEQUENCE_RETRIES - 1 or not self._moved(node_id, version):
                    raise
        raise RuntimeError("unreachable")  # pragma: no cover

    def _moved(self, node_id: str, version: int) -> bool:
        return self.manager.swarm_node(node_id)[0] != version
