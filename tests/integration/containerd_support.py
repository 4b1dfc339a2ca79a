"""Pods made the way the kubelet makes them, through ``ctr`` on a private containerd.

The CRI plugin is off (no kubelet can run here), so a pod is what the CRI would leave in
containerd's namespace ``k8s.io``: a sandbox container labelled
``io.cri-containerd.kind=sandbox`` with the pod's labels, and containers with the CRI's
``io.kubernetes.*`` labels, each in a cgroup under its pod's, in the form either kubelet
cgroup driver gives it. runc here uses the cgroupfs driver (no systemd), so the systemd
driver's form is given as the path it makes on disk
(``/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice/cri-containerd-<id>.scope``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuguard.demo.stack.containerd import PrivateContainerd
from gpuguard.demo.stack.images import REPO_ROOT, python_mounts
from gpuguard.demo.stack.process import ServiceError
from tests.prereq import require_binary, unavailable

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: names of the cgroups above a container that the kubelet's drivers make (pod, QoS, top)
_KUBELET_CGROUPS = ("pod", "kubepods", "burstable", "besteffort", "cri-containerd-")


def cgroup_path(driver: str, qos: str, pod_uid: str, container_id: str) -> str:
    """The cgroup the kubelet's driver gives a container (cgroupfs or systemd), as a path."""
    if driver == "cgroupfs":
        return f"/kubepods/{qos}/pod{pod_uid}/{container_id}"
    slice_uid = pod_uid.replace("-", "_")
    return (
        f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slice_uid}.slice/"
        f"cri-containerd-{container_id}.scope"
    )


@dataclass
class Pod:
    """One pod: a sandbox and its containers, all removed by ``remove``."""

    engine: PrivateContainerd
    name: str
    namespace: str
    driver: str
    labels: dict[str, str] = field(default_factory=dict)
    qos: str = "burstable"
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    sandbox_id: str = field(default_factory=lambda: secrets.token_hex(32))
    containers: dict[str, str] = field(default_factory=dict)  # name -> id
    cgroups: list[Path] = field(default_factory=list)  # to remove with the pod

    def _identity(self) -> dict[str, str]:
        return {
            "io.kubernetes.pod.name": self.name,
            "io.kubernetes.pod.namespace": self.namespace,
            "io.kubernetes.pod.uid": self.uid,
        }

    def _run(
        self,
        container_id: str,
        labels: dict[str, str],
        argv: list[str],
        mounts: Sequence[tuple[str, str]] = (),  # (path, "ro" or "rw"), at the same path
        env: dict[str, str] | None = None,
    ) -> None:
        args = ["run", "--detach"]
        for key, value in labels.items():
            args += ["--label", f"{key}={value}"]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        for path, mode in mounts:
            args += ["--mount", f"type=bind,src={path},dst={path},options=rbind:{mode}"]
        args += ["--cgroup", cgroup_path(self.driver, self.qos, self.uid, container_id)]
        args += ["--rootfs", str(self.engine.rootfs()), container_id, *argv]
        self.engine.check(*args)
        with contextlib.suppress(OSError, LookupError, ValueError):
            self.cgroups += cgroup_dirs(self._pid(container_id))

    def start_sandbox(self) -> Pod:
        labels = {"io.cri-containerd.kind": "sandbox", **self._identity(), **self.labels}
        self._run(self.sandbox_id, labels, ["/bin/sleep", "3600"])
        return self

    def run_python(
        self,
        container: str,
        module_args: list[str],
        mounts: list[str],
        env: dict[str, str] | None = None,
    ) -> str:
        """Start ``python -m <module_args>`` as the pod's container ``container``; ``env`` as
        the kubelet's device plugin adds it (``NVIDIA_VISIBLE_DEVICES``)."""
        container_id = secrets.token_hex(32)
        labels = {
            "io.cri-containerd.kind": "container",
            **self._identity(),
            "io.kubernetes.container.name": container,
        }
        env = {"PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1",
               "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}  # fmt: skip
        self.containers[container] = container_id
        argv = [sys.executable, "-m", *module_args]
        ro = [(path, "ro") for path in python_mounts()]
        self._run(container_id, labels, argv, [*ro, *((path, "rw") for path in mounts)], env)
        return container_id

    def run_command(self, container: str, argv: list[str]) -> str:
        """A container running ``argv`` from the busybox root filesystem."""
        container_id = secrets.token_hex(32)
        labels = {
            "io.cri-containerd.kind": "container",
            **self._identity(),
            "io.kubernetes.container.name": container,
        }
        self.containers[container] = container_id
        self._run(container_id, labels, argv)
        return container_id

    def run_sleeper(self, container: str) -> str:
        """A container that only sleeps (to pause, resume and remove)."""
        return self.run_command(container, ["/bin/sleep", "3600"])

    def _pid(self, container_id: str) -> int:
        for line in self.engine.check("tasks", "list").splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == container_id:
                return int(fields[1])
        raise LookupError(container_id)

    def task_pid(self, container: str) -> int:
        return self._pid(self.containers[container])

    def remove(self) -> None:
        for container_id in [*self.containers.values(), self.sandbox_id]:
            self.engine.remove(container_id)
        remove_cgroups(self.cgroups)


def exited(containerd: PrivateContainerd, container_id: str) -> bool:
    """Whether the container's task has stopped (or is gone), per ``ctr tasks list``."""
    for line in containerd.check("tasks", "list").splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == container_id:
            return fields[2] == "STOPPED"
    return True


def cgroup_dirs(pid: int) -> list[Path]:
    """The directories of a process's cgroups, one per hierarchy (v1 controllers and v2)."""
    dirs = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        mount = "unified" if not names else names.removeprefix("name=")
        for base in (CGROUP_ROOT / mount, CGROUP_ROOT):
            if (base / path.lstrip("/")).is_dir():
                dirs.append(base / path.lstrip("/"))
                break
    return dirs


def remove_cgroups(dirs: Sequence[Path]) -> None:
    """rmdir each container cgroup runc left, then its pod, QoS and kubepods parents once
    empty (runc removes only what it made for the container itself)."""
    for directory in dirs:
        current = directory
        while current == directory or current.name.startswith(_KUBELET_CGROUPS):
            with contextlib.suppress(OSError):
                current.rmdir()
            current = current.parent


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateContainerd]:
    require_binary("containerd")
    require_binary("ctr")
    if os.geteuid() != 0:
        unavailable("a private containerd needs root")
    engine = PrivateContainerd(Path(tmp_path_factory.mktemp("ctrd", numbered=True)))
    try:
        engine.start()
    except ServiceError as exc:
        engine.stop()
        unavailable(f"private containerd did not start: {exc}")
    yield engine
    engine.stop()


@pytest.fixture
def pods(containerd: PrivateContainerd) -> Iterator[Callable[..., Pod]]:
    made: list[Pod] = []

    def make(name: str, driver: str, labels: dict[str, str]) -> Pod:
        pod = Pod(containerd, name, "team-a", driver, labels)
        made.append(pod)
        return pod.start_sandbox()

    yield make
    for pod in made:
        pod.remove()
