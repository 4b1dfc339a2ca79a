"""A staggered upgrade keeps every pause: this release's actuator beside an earlier release's
guard, and the reverse, as restarting their systemd units one at a time runs them.

The earlier releases are taken from this repository's history (``git archive``) and run from
their own tree; each side holds a real pause (a managed task waiting behind another on
gpusim) and the other release's guard must leave it alone: no ``guard_resume`` in the audit,
the container still paused, beyond several of the guard's checks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from exporter_support import ExporterProcess, sim_mounts, workload_args
from test_actuator_live import MANAGED, TOKEN, ActuatorProcess, GuardProcess, paused

from gpuguard.actuator.audit import read_audit
from gpuguard.actuator.safety.lease import GUARD_LEASE
from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.process import ManagedProcess, free_port
from tests.prereq import unavailable
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: earlier releases whose actuator and guard must work with this one's
RELEASES = {
    # the actuator's lease was ``actuator.lease``
    "before-rooms": "c48fd55",
    # it was ``actuator.safety.lease``
    "rooms": "8cc867d",
}
#: the guard checks every 0.5 s: this is several checks past a lease it could not read
CHECKS_S = 3.0


@pytest.fixture
def sim_time_scale() -> float:
    return 1.0  # a 19,456 matmul holds the GPU ~34 s: time to swap the other side


@pytest.fixture
def exporter_flags() -> tuple[str, ...]:
    return ("--poll.interval=50ms", "--trust.all")


@pytest.fixture(scope="module")
def release_trees(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The source tree of an earlier release, from git (a skip where history is absent)."""
    made: dict[str, Path] = {}

    def tree(release: str) -> Path:
        if release in made:
            return made[release]
        commit = RELEASES[release]
        found = subprocess.run(
            ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True, timeout=30,
        )  # fmt: skip
        if found.returncode != 0:
            unavailable(f"release {release} ({commit}) is not in this clone's history")
        dest = tmp_path_factory.mktemp(f"release-{release}")
        archive = dest / "tree.tar"
        with archive.open("wb") as out:
            subprocess.run(["git", "-C", str(REPO), "archive", commit], stdout=out,
                           check=True, timeout=60)  # fmt: skip
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="tar")
        archive.unlink()
        made[release] = dest
        return dest

    return tree


def from_release(tree: Path, name: str, argv: list[str], log: Path) -> ManagedProcess:
    """``argv`` (a ``python -m gpuguard.cli`` line) run on the release's own code."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # -m puts the working directory first on sys.path: the release's tree, not this one
    return ManagedProcess(name, argv, log, env=env, cwd=tree).start()


def guard_argv(state_dir: Path, docker_url: str) -> list[str]:
    return [sys.executable, "-m", "gpuguard.cli", "guard", f"--state.dir={state_dir}",
            f"--docker.host={docker_url}"]  # fmt: skip


def actuator_argv(tree: Path, state_dir: Path, exporter_url: str, docker_url: str) -> list[str]:
    (state_dir / "token").write_text(TOKEN)
    return [
        sys.executable, "-m", "gpuguard.cli", "actuator",
        f"--web.listen-address=127.0.0.1:{free_port()}",
        f"--web.token-file={state_dir / 'token'}", f"--exporter.url={exporter_url}",
        f"--docker.host={docker_url}", f"--state.dir={state_dir}", "--node.name=itest",
        f"--rules.actions={tree / 'rules' / 'actions.yml'}",
        f"--rules.files={tree / 'rules' / '*.rules.yml'}", "--mode=fast",
    ]  # fmt: skip


@pytest.fixture
def holder_and_waiter(
    sim: GpusimService, run_python_container: Callable[..., Any]
) -> Callable[[], tuple[Any, Any]]:
    """Two managed one-shots: the first holds the GPU, the second arrives behind it."""

    def start() -> tuple[Any, Any]:
        start_at = time.time() + 2.0
        made = []
        for i, name in enumerate(("holder", "waiter")):
            args = workload_args(sim, f"{name}.log", "--size", "19456",
                                 "--start-at", f"{start_at + 1.5 * i:.3f}")  # fmt: skip
            made.append(run_python_container(args, labels=MANAGED, extra_mounts=sim_mounts(sim),
                                             name=name))  # fmt: skip
        return made[0], made[1]

    return start


@pytest.fixture
def processes() -> Iterator[list[ManagedProcess | ActuatorProcess | GuardProcess]]:
    """Stopped in order, actuators first (they resume what they paused), by PID."""
    started: list[ManagedProcess | ActuatorProcess | GuardProcess] = []
    yield started
    for proc in started:
        proc.stop()


def guard_resumes(state_dir: Path, since: float) -> list[dict[str, Any]]:
    return [r for r in read_audit(state_dir / "audit.jsonl")
            if r.get("event") == "guard_resume" and r.get("ts", 0) >= since]  # fmt: skip


def assert_a_pause_holds(
    client: Any, holder_and_waiter: Callable[[], tuple[Any, Any]], state_dir: Path
) -> None:
    """A task that waits behind another is paused, and stays so past several guard checks."""
    _, waiter = holder_and_waiter()
    wait_for(lambda: paused(client, waiter), 60, "the waiting task to be paused")
    since = time.time()
    time.sleep(CHECKS_S)
    assert paused(client, waiter), "the other release's guard resumed the waiting task"
    assert guard_resumes(state_dir, since) == []


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_this_actuator_beside_an_earlier_guard_keeps_its_pauses(
    release: str,
    release_trees: Callable[[str], Path],
    dockerd: PrivateDockerd,
    docker_client: Any,
    exporter: ExporterProcess,
    holder_and_waiter: Callable[[], tuple[Any, Any]],
    processes: list[Any],
    tmp_path: Path,
) -> None:
    tree = release_trees(release)
    state_dir = tmp_path / "actuator"
    state_dir.mkdir()
    actuator = ActuatorProcess(state_dir, exporter.url, dockerd.url, "--mode=fast")
    guard = from_release(tree, "guard", guard_argv(state_dir, dockerd.url), tmp_path / "g.log")
    processes.extend([actuator, guard])
    guard.wait_ready((state_dir / GUARD_LEASE).exists, 30)
    actuator.start()
    assert_a_pause_holds(docker_client, holder_and_waiter, state_dir)
    assert "resuming" not in guard.log_path.read_text()


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_an_earlier_actuator_beside_this_guard_keeps_its_pauses(
    release: str,
    release_trees: Callable[[str], Path],
    dockerd: PrivateDockerd,
    docker_client: Any,
    exporter: ExporterProcess,
    holder_and_waiter: Callable[[], tuple[Any, Any]],
    processes: list[Any],
    tmp_path: Path,
) -> None:
    tree = release_trees(release)
    state_dir = tmp_path / "actuator"
    state_dir.mkdir()
    argv = actuator_argv(tree, state_dir, exporter.url, dockerd.url)
    url = "http://127.0.0.1:" + argv[4].rsplit(":", 1)[1]
    guard = GuardProcess(state_dir, dockerd.url)
    actuator = from_release(tree, "actuator", argv, tmp_path / "a.log")
    processes.extend([actuator, guard])
    actuator.wait_ready(lambda: requests.get(url + "/healthz", timeout=1).ok, 30)
    assert_a_pause_holds(docker_client, holder_and_waiter, state_dir)
    assert "resuming" not in (state_dir / "guard.log").read_text()
