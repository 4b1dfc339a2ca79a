"""The actuator's containerd engine: containerd's view in the shape the executor reads, and
the flags that choose it (the real engine is tested against a real containerd in
``tests/integration/test_containerd_admission.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import docker.errors
import pytest
import requests

from gpuguard.actuator.admission.executor import _refuse_pause
from gpuguard.actuator.config import containerd_address
from gpuguard.actuator.containerd_engine import ContainerdEngine, _inspect_doc, engine_api
from gpuguard.actuator.errors import ConfigError
from gpuguard.actuator.guard.program import validate
from gpuguard.ctr import Ctr, CtrError, trim_info

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "containerd"


def doc(name: str) -> dict[str, object]:
    return trim_info(json.loads((FIXTURES / name).read_text()))


def test_a_pod_container_is_managed_by_its_pod_label() -> None:
    sandbox = doc("info_sandbox.json")
    info = _inspect_doc(doc("info_container.json"), "running", 4242, sandbox["Labels"])  # type: ignore[arg-type]
    assert info["Name"] == "/infer" and info["State"]["Pid"] == 4242
    assert info["State"]["Running"] and not info["State"]["Paused"]
    assert _refuse_pause(info) is None
    alone = _inspect_doc(doc("info_container.json"), "running", 4242, None)
    assert _refuse_pause(alone) is not None  # no pod label: unmanaged


@pytest.mark.parametrize(
    ("state", "running", "paused", "pid"),
    [("paused", True, True, 7), ("exited", False, False, 0), ("created", False, False, 0)],
)
def test_task_states_read_as_docker_states(
    state: str, running: bool, paused: bool, pid: int
) -> None:
    info = _inspect_doc(doc("info_container.json"), state, 7, None)
    assert (info["State"]["Running"], info["State"]["Paused"], info["State"]["Pid"]) == (
        running,
        paused,
        pid,
    )


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


def test_errors_translate_to_the_engine_errors_the_executor_decides_by() -> None:
    down = ContainerdEngine(DownCtr("/x.sock", "k8s.io"))
    with pytest.raises(requests.ConnectionError):
        down.ping()
    with pytest.raises(requests.ConnectionError):
        down.inspect_container("a" * 64)
    gone = ContainerdEngine(GoneCtr("/x.sock", "k8s.io"))
    with pytest.raises(docker.errors.NotFound):
        gone.inspect_container("a" * 64)
    with pytest.raises(docker.errors.NotFound):
        gone.pause("a" * 64)
    assert gone.info() == {} and gone.containers(all=True) == []


def test_containerd_address_chooses_the_engine() -> None:
    assert containerd_address({"containerd.address": None}) is None
    assert containerd_address({"containerd.address": "unix:///run/c.sock"}) == "unix:///run/c.sock"
    with pytest.raises(ConfigError, match="containerd"):
        containerd_address({"containerd.address": "tcp://x:1"})
    assert isinstance(engine_api(None, "/run/c.sock", "k8s.io"), ContainerdEngine)
    assert not isinstance(engine_api("unix:///x.sock", None, "k8s.io"), ContainerdEngine)


def test_the_guard_takes_the_containerd_flags(tmp_path: Path) -> None:
    from gpuguard.actuator.guard.program import FLAGS

    values = {f.name: f.default for f in FLAGS}
    values.update({"state.dir": str(tmp_path), "containerd.address": "/run/c.sock"})
    config = validate(values)
    assert (config.containerd_address, config.containerd_namespace) == ("/run/c.sock", "k8s.io")
