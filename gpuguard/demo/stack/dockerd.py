"""A private Docker engine: own socket, data-root, exec-root and pidfile, no networking."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from gpuguard.demo.stack.process import ManagedProcess, ServiceError, stop_pid


class PrivateDockerd:
    """One dockerd that touches nothing outside ``base_dir`` and never leaves loopback.

    ``--bridge=none --iptables=false`` keeps it off every network: containers get no
    network but loopback, which is all gpuguard's tests and demo need.
    """

    def __init__(self, base_dir: Path, extra_args: list[str] | None = None) -> None:
        self.base_dir = base_dir
        self.socket = base_dir / "docker.sock"
        self.pidfile = base_dir / "docker.pid"
        self.extra_args = extra_args or []
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 60.0) -> PrivateDockerd:
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            raise ServiceError("dockerd not found: install Debian's docker.io (make setup does)")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            dockerd,
            "--host", self.url,
            "--data-root", str(self.base_dir / "data"),
            "--exec-root", str(self.base_dir / "exec"),
            "--pidfile", str(self.pidfile),
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-masq=false",
            *self.extra_args,
        ]  # fmt: skip
        self.process = ManagedProcess("dockerd", argv, self.base_dir / "dockerd.log").start()
        self.process.wait_ready(self._ping, timeout=timeout)
        return self

    def _ping(self) -> bool:
        client = self.client(timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()

    def client(self, timeout: int = 60) -> Any:
        import docker

        return docker.DockerClient(base_url=self.url, timeout=timeout)

    def stop(self) -> None:
        """Remove every container this engine still has, then stop dockerd by its PID."""
        if self.process is None:
            return
        shutdown_engine(self.url, self.process.pid, self.base_dir, alive=self.process.alive())
        self.process.stop(timeout=20)
        self.process = None


def shutdown_engine(url: str, pid: int, base_dir: Path, alive: bool = True) -> None:
    """Stop a private engine, also one started by another process (the demo's ``--stop``)."""
    import docker

    if alive:
        try:
            client = docker.DockerClient(base_url=url, timeout=20)
            for container in client.containers.list(all=True):
                container.remove(force=True)
            client.close()
        except Exception:  # best effort before the engine goes
            pass
    stop_pid(pid, timeout=20)
    # containerd-shims of containers killed above exit on their own; a leftover
    # shim would hold the exec-root, so stop any that dockerd left behind.
    for shim in _shims_under(base_dir):
        stop_pid(shim, timeout=5)
    unmount_below(base_dir)


def unmount_below(directory: Path) -> None:
    """A host-network container makes dockerd bind the host's network namespace under its
    exec root (``exec/netns/default``), and it stays mounted after dockerd stops."""
    prefix = str(directory.resolve()) + "/"
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1]
        if target.startswith(prefix):
            subprocess.run(["umount", target], check=False, capture_output=True, timeout=10)


def _shims_under(base_dir: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "containerd" in cmdline and str(base_dir) in cmdline:
            pids.append(int(proc.name))
    return pids
