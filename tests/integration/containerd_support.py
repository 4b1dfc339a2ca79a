"""Pods made the way the kubelet makes them, through ``ctr`` on a private containerd.

The CRI plugin is off (no kubelet can run here), so a pod is what the CRI would leave in
containerd's namespace ``k8s.io``: a sandbox container labelled
``io.cri-containerd.kind=sandbox`` with the pod's labels, and containers with the CRI's
``io.kubernetes.*`` labels, each in a cgroup under its pod's, in the form either kubelet
cgroup driver gives it. runc here uses the cgroupfs driver (no systemd), so the systemd
driver's form is given as the path it makes on disk
(``/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice/cri-containerd-<id>.scope``).

A container runs from the shared root filesystem, or from an image imported with
``import_image`` (``ctr images import`` of an OCI archive whose config carries labels): then
containerd's client merges the image config's labels beneath the ones given, as the CRI's
``buildLabels`` does.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import secrets
import sys
import tarfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from exporter_support import ExporterProcess

from gpuguard.demo.stack.containerd import PrivateContainerd
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.images import REPO_ROOT, _rootfs_tar, python_mounts
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
        image: str | None = None,  # else the shared root filesystem
        host_network: bool = False,
    ) -> None:
        args = ["run", "--detach"]
        for key, value in labels.items():
            args += ["--label", f"{key}={value}"]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        for path, mode in mounts:
            args += ["--mount", f"type=bind,src={path},dst={path},options=rbind:{mode}"]
        if host_network:
            args.append("--net-host")
        args += ["--cgroup", cgroup_path(self.driver, self.qos, self.uid, container_id)]
        source = [image] if image is not None else ["--rootfs", str(self.engine.rootfs())]
        args += [*source, container_id, *argv]
        self.engine.check(*args)
        with contextlib.suppress(OSError, LookupError, ValueError):
            self.cgroups += cgroup_dirs(self._pid(container_id))

    def start_sandbox(self) -> Pod:
        labels = {"io.cri-containerd.kind": "sandbox", **self._identity(), **self.labels}
        self._run(self.sandbox_id, labels, ["/bin/sleep", "3600"])
        return self

    def _container_labels(self, container: str) -> dict[str, str]:
        """The kubelet's four labels (``newContainerLabels``) and the CRI's kind."""
        return {
            "io.cri-containerd.kind": "container",
            **self._identity(),
            "io.kubernetes.container.name": container,
        }

    def run_python(
        self,
        container: str,
        module_args: list[str],
        mounts: list[str],
        host_network: bool = False,
        env: dict[str, str] | None = None,
    ) -> str:
        """Start ``python -m <module_args>`` as the pod's container ``container``; ``env`` as
        the kubelet's device plugin adds it (``NVIDIA_VISIBLE_DEVICES``)."""
        container_id = secrets.token_hex(32)
        env = {"PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1",
               "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}  # fmt: skip
        self.containers[container] = container_id
        argv = [sys.executable, "-m", *module_args]
        ro = [(path, "ro") for path in python_mounts()]
        self._run(container_id, self._container_labels(container), argv,
                  [*ro, *((path, "rw") for path in mounts)], env,
                  host_network=host_network)  # fmt: skip
        return container_id

    def run_command(self, container: str, argv: list[str], image: str | None = None) -> str:
        """A container running ``argv`` from the busybox root filesystem, or from ``image``
        (whose config's labels containerd merges beneath the kubelet's)."""
        container_id = secrets.token_hex(32)
        self.containers[container] = container_id
        self._run(container_id, self._container_labels(container), argv, image=image)
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


def import_image(engine: PrivateContainerd, ref: str, labels: dict[str, str]) -> str:
    """Import an image of the shared root filesystem whose config carries ``labels`` (an OCI
    archive through ``ctr images import``: nothing can be pulled here); returns ``ref``."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    layer = blob(_rootfs_tar())
    config = blob(json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Labels": labels, "Cmd": ["/bin/sleep", "3600"]},
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]},
    }).encode())  # fmt: skip
    manifest = blob(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer}],
    }).encode())  # fmt: skip
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest,
        "annotations": {"io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1]},
    }]}  # fmt: skip
    files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
             "index.json": json.dumps(index).encode(),
             **{f"blobs/sha256/{d.split(':')[1]}": data for d, data in blobs.items()}}  # fmt: skip
    archive = engine.base_dir / f"image-{secrets.token_hex(4)}.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    try:
        engine.check("images", "import", str(archive))
    finally:
        archive.unlink()
    return ref


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


@pytest.fixture
def k8s_exporter_flags() -> tuple[str, ...]:
    """More flags for ``k8s_exporter`` (a module's trust policy, say)."""
    return ()


@pytest.fixture
def k8s_exporter(
    containerd: PrivateContainerd,
    sim: GpusimService,
    tmp_path: Path,
    k8s_exporter_flags: tuple[str, ...],
) -> Iterator[ExporterProcess]:
    """The exporter following the private containerd's ``k8s.io`` namespace (no Docker)."""
    process = ExporterProcess(
        tmp_path,
        f"unix://{tmp_path}/no-docker.sock",
        sim.socket,
        "--container.source=containerd",
        f"--containerd.address={containerd.address}",
        "--containerd.namespace=k8s.io",
        *k8s_exporter_flags,
    ).start()
    yield process
    process.stop()
