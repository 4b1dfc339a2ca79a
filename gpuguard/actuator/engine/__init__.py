"""The container engine room: one narrow interface (``base.py``) and an adapter per engine
(``docker.py``, ``containerd.py``), chosen once at start-up by ``open_engine``; the Swarm
node label (``swarm.py``) sits beside the Docker adapter, whose calls it makes.
"""

from __future__ import annotations

from gpuguard.actuator.engine.base import ContainerEngine


def open_engine(
    docker_host: str | None, containerd_address: str | None, containerd_namespace: str
) -> ContainerEngine:
    """The engine the actuator and the guard act through: containerd where its address is
    given (``--containerd.address``), else Docker (``--docker.host``, else DOCKER_HOST or
    the local socket). Never contacts the engine."""
    if containerd_address:
        from gpuguard.actuator.engine.containerd import ContainerdEngine
        from gpuguard.ctr import Ctr

        return ContainerdEngine(Ctr(containerd_address, containerd_namespace))
    # Imported on use: each adapter loads its own client library, and only it.
    from gpuguard.actuator.engine.docker import DockerEngine

    return DockerEngine(docker_host)
