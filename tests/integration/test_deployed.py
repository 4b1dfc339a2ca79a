"""The actuator as deployed: ``kill -9`` of its container, and its guard, in a container of
its own sharing the state volume, resumes the tenants.

The image is ``gpuguard/gpuguard:local`` (``gpuguard.demo.stack.appimage``): deploy/Dockerfile
needs ``python:3.11-slim`` and the package index, which cannot be reached here, so the image
is imported from a rootfs holding the host's Python and gpuguard installed from its wheel,
with the Dockerfile's entrypoint, user and state directory. Both containers run as compose
runs them: uid 10001 with the Docker socket's group, read-only root, no capabilities,
no-new-privileges; both on the host network, listening on loopback (the guard for its
/metrics only).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from exporter_support import ExporterProcess, sim_mounts, workload_args

from gpuguard.demo.stack.appimage import ensure_app_image
from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.process import free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

STATE = "/var/lib/gpuguard/actuator"
TOKEN = "deployed-token"


@pytest.fixture
def sim_time_scale() -> float:
    return 0.1  # a 40 device-second task lasts 4 s: long enough to be killed mid-queue


@pytest.fixture
def exporter_flags() -> tuple[str, ...]:
    return ("--poll.interval=20ms",)


@pytest.fixture(scope="session")
def app_image(docker_client: Any) -> str:
    return ensure_app_image(docker_client)


@pytest.fixture
def deployment(
    docker_client: Any, dockerd: PrivateDockerd, app_image: str, tmp_path: Path
) -> Iterator[Callable[..., Any]]:
    """Run gpuguard containers as compose does, on one state volume; removes them all."""
    volume = docker_client.volumes.create(name=f"gpuguard-state-{os.getpid()}")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "token").write_text(TOKEN)
    for path, mode in ((secrets, 0o750), (secrets / "token", 0o640)):
        os.chown(path, 0, 10001)
        path.chmod(mode)
    made: list[Any] = []

    def run(role: str, command: list[str], network_mode: str) -> Any:
        container = docker_client.containers.run(
            app_image,
            command,
            name=f"gpuguard-{role}-{os.getpid()}",
            labels={"gpuguard.role": role},
            user="10001:10001",
            group_add=[str(dockerd.socket.stat().st_gid)],
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            network_mode=network_mode,
            volumes={
                str(dockerd.socket): {"bind": "/var/run/docker.sock", "mode": "ro"},
                volume.name: {"bind": STATE, "mode": "rw"},
                str(secrets): {"bind": "/etc/gpuguard/token", "mode": "ro"},
            },
            detach=True,
        )
        made.append(container)
        return container

    yield run
    for container in made:
        container.remove(force=True)
    volume.remove(force=True)


def paused(client: Any, container: Any) -> bool:
    return bool(client.api.inspect_container(container.id)["State"]["Paused"])


def test_kill_9_of_the_actuator_container_and_the_guard_container_resumes(
    sim: GpusimService,
    exporter: ExporterProcess,
    docker_client: Any,
    run_python_container: Callable[..., Any],
    deployment: Callable[..., Any],
) -> None:
    docker = "--docker.host=unix:///var/run/docker.sock"
    guard_port = free_port()
    guard_argv = [
        "guard", f"--state.dir={STATE}", docker, f"--web.listen-address=127.0.0.1:{guard_port}"
    ]  # fmt: skip
    guard = deployment("guard", guard_argv, "host")
    port = free_port()
    actuator_argv = [
        "actuator", f"--web.listen-address=127.0.0.1:{port}",
        "--web.token-file=/etc/gpuguard/token/token", f"--exporter.url={exporter.url}",
        docker, "--node.name=itest", "--mode=fast", f"--state.dir={STATE}",
    ]  # fmt: skip
    actuator = deployment("actuator", actuator_argv, "host")
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return requests.get(url + "/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    wait_for(healthy, 60, "the actuator container to answer /healthz", interval=0.2)

    start_at = time.time() + 2.5
    workers = [
        run_python_container(
            workload_args(sim, f"dep-{i}.log", "--work-seconds", "40", "--memory-bytes", "1GiB",
                          "--start-at", f"{start_at + 0.1 * i:.3f}"),
            labels={"gpuguard.managed": "true"},
            extra_mounts=sim_mounts(sim),
            name=f"dep-{i}",
        )
        for i in range(3)
    ]  # fmt: skip
    wait_for(
        lambda: sum(paused(docker_client, c) for c in workers) >= 2,
        timeout=30,
        what="the actuator container paused two tenants",
        interval=0.05,
    )
    docker_client.api.kill(actuator.id, signal="SIGKILL")  # PID 1 of the container
    killed_at = time.monotonic()
    wait_for(
        lambda: not any(paused(docker_client, c) for c in workers),
        timeout=10,
        what="the guard container resumed every tenant",
        interval=0.05,
    )
    print(f"\ntenants resumed {time.monotonic() - killed_at:.2f} s after kill -9")
    actuator.reload()
    guard.reload()
    assert actuator.status == "exited" and guard.status == "running"
    # the guard says so once its check is over (the tenants resume inside it)
    said = ("no actuator holds the journal", "guard resumed dep-")
    wait_for(lambda: all(s in guard.logs().decode() for s in said), 10, "the guard's log lines")

    def gone() -> bool:  # what Prometheus scrapes
        metrics = requests.get(f"http://127.0.0.1:{guard_port}/metrics", timeout=5).text
        return 'gpuguard_guard_actuator{state="gone"} 1.0' in metrics

    wait_for(gone, 10, "the guard's metric to say the actuator is gone", interval=0.1)

    # A new actuator container on the same volume takes the journal back and serves.
    actuator.start()
    wait_for(healthy, 60, "the restarted actuator", interval=0.2)
    assert all(c.wait(timeout=60)["StatusCode"] == 0 for c in workers)
