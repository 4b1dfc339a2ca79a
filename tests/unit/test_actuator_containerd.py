"""The actuator's containerd engine: containerd's view as the engine interface's containers
and errors, and the flags that choose it (the real engine is tested against a real
containerd in ``tests/integration/test_containerd_admission.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuguard.actuator.configfiles import containerd_address
from gpuguard.actuator.engine import open_engine
from gpuguard.actuator.engine.containerd import ContainerdEngine, container_state
from gpuguard.actuator.engine.docker import DockerEngine
from gpuguard.actuator.errors import ConfigError, ContainerGone, EngineConflict, EngineDown
from gpuguard.actuator.execution.vetting import refuse_pause
from gpuguard.actuator.guard.program import validate
from gpuguard.containerd import read_container
from gpuguard.ctr import Ctr, CtrError, trim_info

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "containerd"


def doc(name: str) -> dict[str, object]:
    return trim_info(json.loads((FIXTURES / name).read_text()))


def test_a_pod_container_is_managed_by_its_pod_label() -> None:
    sandbox = doc("info_sandbox.json")
    container = read_container(doc("info_container.json"), "running", 4242, sandbox["Labels"])  # type: ignore[arg-type]
    info = container_state(container)
    assert info.name == "infer" and info.pid == 4242
    assert info.running and not info.paused
    assert refuse_pause(info) is None
    alone = container_state(read_container(doc("info_container.json"), "running", 4242, None))
    assert refuse_pause(alone) is not None  # no pod label: unmanaged


@pytest.mark.parametrize(
    ("state", "running", "paused", "pid"),
    [("paused", True, True, 7), ("exited", False, False, 0), ("created", False, False, 0)],
)
def test_task_states_read_as_docker_states(
    state: str, running: bool, paused: bool, pid: int
) -> None:
    info = container_state(read_container(doc("info_container.json"), state, 7, None))
    assert (info.status, info.running, info.paused, info.pid) == (state, running, paused, pid)


class DownCtr(Ctr):
    def run(self, *args: str) -> str:
        raise CtrError("connection refused")


class GoneCtr(Ctr):
    """containerd answers, and the container is not there."""

    def run(self, *args: str) -> str:
        if args[0] == "version":
            return "ok"
        if args[:2] == ("containers", "list"):
            return ""
        if args[:2] == ("tasks", "list"):
            return "TASK PID STATUS\n"
        raise CtrError("not found")


class PausedCtr(GoneCtr):
    """containerd answers; the container's task is paused and refuses another pause."""

    def run(self, *args: str) -> str:
        if args[:2] == ("containers", "list"):
            return "a" * 64 + "\n"
        if args[:2] == ("tasks", "list"):
            return "TASK PID STATUS\n" + "a" * 64 + " 42 PAUSED\n"
        return super().run(*args)


def test_errors_translate_to_gpuguards_engine_errors() -> None:
    down = ContainerdEngine(DownCtr("/x.sock", "k8s.io"))
    with pytest.raises(EngineDown, match="containerd unreachable"):
        down.ping()
    with pytest.raises(EngineDown):
        down.inspect("a" * 64)
    with pytest.raises(EngineDown):
        down.pause("a" * 64)
    gone = ContainerdEngine(GoneCtr("/x.sock", "k8s.io"))
    with pytest.raises(ContainerGone):
        gone.inspect("a" * 64)
    with pytest.raises(ContainerGone):
        gone.pause("a" * 64)
    assert gone.containers() == []
    paused = ContainerdEngine(PausedCtr("/x.sock", "k8s.io"))
    with pytest.raises(EngineConflict, match="is paused"):  # decided from the task's state
        paused.pause("a" * 64)


def test_containerd_address_chooses_the_engine() -> None:
    assert containerd_address({"containerd.address": None}) is None
    assert containerd_address({"containerd.address": "unix:///run/c.sock"}) == "unix:///run/c.sock"
    with pytest.raises(ConfigError, match="containerd"):
        containerd_address({"containerd.address": "tcp://x:1"})
    chosen = open_engine(None, "/run/c.sock", "k8s.io")
    assert isinstance(chosen, ContainerdEngine) and chosen.name == "containerd"
    chosen = open_engine("unix:///x.sock", None, "k8s.io")
    assert isinstance(chosen, DockerEngine) and chosen.name == "docker"


def test_the_guard_takes_the_containerd_flags(tmp_path: Path) -> None:
    from gpuguard.actuator.guard.program import FLAGS

    values = {f.name: f.default for f in FLAGS}
    values.update({"state.dir": str(tmp_path), "containerd.address": "/run/c.sock"})
    config = validate(values)
    assert (config.containerd_address, config.containerd_namespace) == ("/run/c.sock", "k8s.io")
