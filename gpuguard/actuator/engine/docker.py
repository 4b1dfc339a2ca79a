"""Docker behind the engine interface: the one module of the actuator that imports docker-py.

docker-py's and requests' errors become gpuguard's here, decided by type and status code,
never by message: ``NotFound`` is ``ContainerGone``, a 409 ``EngineConflict``, any other API
error ``EngineRefused``, a connection that fails or times out ``EngineDown`` (``hung`` for a
read timeout: the engine took the request and did not answer). The Swarm calls the node
label needs (``swarm.py``) are here too, for the same reason.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from http import HTTPStatus
from typing import Any

import docker
import docker.errors
import requests

from gpuguard.actuator.engine.base import ContainerState
from gpuguard.actuator.errors import ContainerGone, EngineConflict, EngineDown, EngineRefused

DOCKER_TIMEOUT_S = 5
# A fixed API version: docker-py would otherwise ask the engine for its version when the
# client is made, and fail the actuator's (or guard's) start while Docker is down. 1.41 is
# Docker 20.10; newer engines answer it too.
DOCKER_API_VERSION = "1.41"
#: a container that is up, in the status word of Docker's container list
_UP = ("running", "paused", "restarting")


class DockerEngine:
    """One Docker engine, at ``url`` or DOCKER_HOST / the local socket.

    Making it never contacts the engine: the actuator and the guard start while Docker is
    down and act once it answers.
    """

    name = "docker"

    def __init__(self, url: str | None = None, timeout_s: int = DOCKER_TIMEOUT_S) -> None:
        if url:
            self._api = docker.APIClient(
                base_url=url, version=DOCKER_API_VERSION, timeout=timeout_s
            )
        else:
            self._api = docker.from_env(version=DOCKER_API_VERSION, timeout=timeout_s).api

    def ping(self) -> None:
        with _translated():
            self._api.ping()

    def inspect(self, container_id: str) -> ContainerState:
        with _translated(container_id):
            doc = self._api.inspect_container(container_id)
        return state_from_inspect(doc)

    def containers(
        self, statuses: Collection[str] | None = None, label: str | None = None
    ) -> list[ContainerState]:
        filters: dict[str, Any] = {}
        if statuses is not None:
            filters["status"] = list(statuses)  # a status filter lists stopped ones too
        if label is not None:
            filters["label"] = label
        with _translated():
            listed = self._api.containers(all=statuses is None, filters=filters or None)
        return [state_from_summary(summary) for summary in listed]

    def pause(self, container_id: str) -> None:
        with _translated(container_id):
            self._api.pause(container_id)

    def unpause(self, container_id: str) -> None:
        with _translated(container_id):
            self._api.unpause(container_id)

    # --- Swarm: the node label (``swarm.py``) ---------------------------------------

    def swarm_node_id(self) -> str | None:
        """This engine's Swarm node id, or None when it is not in a swarm."""
        with _translated():
            swarm = self._api.info().get("Swarm") or {}
        if swarm.get("LocalNodeState") != "active" or not swarm.get("NodeID"):
            return None
        return str(swarm["NodeID"])

    def swarm_node(self, node_id: str) -> tuple[int, dict[str, Any]]:
        """A Swarm node's version (for a compare-and-swap update) and its spec."""
        with _translated():
            node = self._api.inspect_node(node_id)
        return int(node["Version"]["Index"]), dict(node["Spec"])

    def update_swarm_node(self, node_id: str, version: int, spec: Mapping[str, Any]) -> None:
        """Write a node's spec if it is still at ``version`` (``EngineRefused`` if not)."""
        with _translated():
            self._api.update_node(node_id, version, dict(spec))


def state_from_inspect(doc: Mapping[str, Any]) -> ContainerState:
    """A container from Docker's inspect document (pure)."""
    state = doc.get("State") or {}
    return ContainerState(
        id=str(doc["Id"]),
        name=str(doc.get("Name") or "").lstrip("/"),
        labels=dict((doc.get("Config") or {}).get("Labels") or {}),
        status=str(state.get("Status") or ""),
        running=bool(state.get("Running")),
        paused=bool(state.get("Paused")),
        pid=int(state.get("Pid") or 0),
    )


def state_from_summary(summary: Mapping[str, Any]) -> ContainerState:
    """A container from one entry of Docker's container list (pure; no PID there)."""
    status = str(summary.get("State") or "")
    names = summary.get("Names") or [""]
    return ContainerState(
        id=str(summary["Id"]),
        name=str(names[0]).lstrip("/"),
        labels=dict(summary.get("Labels") or {}),
        status=status,
        running=status in _UP,
        paused=status == "paused",
    )


@contextmanager
def _translated(container_id: str | None = None) -> Iterator[None]:
    """docker-py's and requests' errors as gpuguard's (``container_id``: the call is about
    that container, so a 404 means it is gone)."""
    try:
        yield
    except docker.errors.APIError as exc:
        explanation = str(getattr(exc, "explanation", None) or exc)
        if container_id is not None and isinstance(exc, docker.errors.NotFound):
            raise ContainerGone(explanation) from exc
        if exc.status_code == HTTPStatus.CONFLICT:
            raise EngineConflict(explanation) from exc
        raise EngineRefused(explanation) from exc
    except requests.ReadTimeout as exc:
        raise EngineDown(f"docker engine unreachable: {exc}", hung=True) from exc
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise EngineDown(f"docker engine unreachable: {exc}") from exc
