"""The test harness itself: a private dockerd runs project code in real containers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpuguard.demo.stack.dockerd import PrivateDockerd

pytestmark = pytest.mark.integration


def test_python_container_runs_project_code(run_python_container: Any) -> None:
    container = run_python_container(["gpuguard.labels"])
    result = container.wait(timeout=60)
    assert result["StatusCode"] == 0, container.logs().decode()


def test_container_pid_is_a_host_pid_under_the_docker_cgroup(run_python_container: Any) -> None:
    sleeper = run_python_container(["timeit", "-n", "1", "import time; time.sleep(30)"])
    sleeper.reload()
    pid = sleeper.attrs["State"]["Pid"]
    assert pid > 0
    cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    assert sleeper.id in cgroup


def test_engine_has_no_network_but_none_and_host(docker_client: Any) -> None:
    names = {net.name for net in docker_client.networks.list()}
    assert "bridge" not in names


def test_stop_removes_containers_and_ends_dockerd(short_tmp: Path, base_image: str) -> None:
    engine = PrivateDockerd(short_tmp / "second-engine").start()
    client = engine.client()
    from gpuguard.demo.stack.images import ensure_base_image

    ensure_base_image(client)
    client.containers.run("gpuguard/base:local", ["sleep", "60"], detach=True, network_mode="none")
    pid = engine.process.pid if engine.process else 0
    client.close()
    engine.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
