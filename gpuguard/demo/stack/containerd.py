"""A private containerd: own socket, root and state, the CRI plugin off; driven through ``ctr``.

Nothing can be pulled here, so containers run from a root filesystem directory
(``ctr run --rootfs``) holding busybox and mount points (the Docker tests' base layout);
Python comes from the host, bind-mounted read-only, as for the Docker tests.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

from gpuguard.demo.stack.dockerd import _shims_under
from gpuguard.demo.stack.images import _rootfs_tar
from gpuguard.demo.stack.process import ManagedProcess, ServiceError, stop_pid

_CONFIG = """version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""
"""


class PrivateContainerd:
    """One containerd that touches nothing outside ``base_dir`` (and the cgroups it makes)."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.socket = base_dir / "containerd.sock"
        self.process: ManagedProcess | None = None

    @property
    def address(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 30.0) -> PrivateContainerd:
        binary = shutil.which("containerd")
        if binary is None or shutil.which("ctr") is None:
            raise ServiceError("containerd/ctr not found: install Debian's containerd")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        config = self.base_dir / "config.toml"
        config.write_text(
            _CONFIG.format(
                root=self.base_dir / "root", state=self.base_dir / "state", socket=self.socket
            )
        )
        argv = [binary, "--config", str(config)]
        self.process = ManagedProcess("containerd", argv, self.base_dir / "containerd.log")
        self.process.start()
        self.process.wait_ready(lambda: self.ctr("version").returncode == 0, timeout=timeout)
        return self

    def restart_daemon(self) -> None:
        """Stop and start only the containerd process: running tasks keep running in their
        shims and are found again (``stop`` would remove every container)."""
        assert self.process is not None
        self.process.stop(timeout=20)
        self.process = None
        self.start()

    def ctr(
        self, *args: str, namespace: str = "k8s.io", timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        argv = ["ctr", "--address", str(self.socket), "--namespace", namespace, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def check(self, *args: str, namespace: str = "k8s.io") -> str:
        done = self.ctr(*args, namespace=namespace)
        if done.returncode != 0:
            raise ServiceError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def rootfs(self) -> Path:
        """The shared root filesystem directory (busybox and mount points), made once."""
        path = self.base_dir / "rootfs"
        if not path.exists():
            with tarfile.open(fileobj=io.BytesIO(_rootfs_tar())) as tar:
                tar.extractall(path, filter="tar")
        return path

    def remove(self, container_id: str, namespace: str = "k8s.io") -> None:
        """Kill a container's task and remove the container (gone already is fine)."""
        self.ctr("tasks", "kill", "--signal", "SIGKILL", container_id, namespace=namespace)
        self.ctr("tasks", "delete", "--force", container_id, namespace=namespace)
        self.ctr("containers", "delete", container_id, namespace=namespace)

    def stop(self) -> None:
        """Remove every container in every namespace, then stop containerd by its PID."""
        if self.process is None:
            return
        if self.process.alive():
            for namespace in self.ctr("namespaces", "list", "--quiet").stdout.split():
                ids = self.ctr("containers", "list", "--quiet", namespace=namespace).stdout
                for container_id in ids.split():
                    self.remove(container_id, namespace)
        self.process.stop(timeout=20)
        for shim in _shims_under(self.base_dir):
            stop_pid(shim, timeout=5)
        self.process = None
