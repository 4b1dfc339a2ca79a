"""An engine in memory for the actuator's and the guard's unit tests (the real adapters run
against a real dockerd and containerd in ``tests/integration/``)."""

from __future__ import annotations

import threading
from collections.abc import Collection

from gpuguard.actuator.engine.base import ContainerState


class FakeEngine:
    """Every container it is asked about exists, ``running`` and ``paused`` until unpaused
    here; it lists none. ``delay``: seconds each inspect and unpause takes (a hung or
    overloaded engine, short of its client timeout)."""

    name = "docker"

    def __init__(self, paused: bool = True, running: bool = True, delay: float = 0.0) -> None:
        self.paused = paused
        self.running = running
        self.delay = delay
        self.unpaused: list[str] = []

    def ping(self) -> None:
        pass

    def inspect(self, container_id: str) -> ContainerState:
        threading.Event().wait(self.delay)
        paused = self.paused and container_id not in self.unpaused
        status = "paused" if paused else "running" if self.running else "exited"
        return ContainerState(container_id, "fake", {}, status, self.running, paused)

    def containers(
        self, statuses: Collection[str] | None = None, label: str | None = None
    ) -> list[ContainerState]:
        return []

    def pause(self, container_id: str) -> None:
        raise AssertionError("nothing here pauses")

    def unpause(self, container_id: str) -> None:
        threading.Event().wait(self.delay)
        self.unpaused.append(container_id)
