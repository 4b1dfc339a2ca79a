"""Run the gpusim daemon as a service of the local stack."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

from gpuguard.demo.stack.process import ManagedProcess


def gpusim_query(sock_path: Path, op: str = "status", timeout: float = 2.0) -> dict[str, Any]:
    """One request on a fresh connection; used as the daemon's readiness check."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(sock_path))
        sock.sendall(json.dumps({"op": op}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    reply: dict[str, Any] = json.loads(data)
    return reply


class GpusimService:
    """``gpusim serve`` in its own directory (bind-mount ``dir`` into workload containers)."""

    def __init__(self, directory: Path, options: dict[str, object] | None = None) -> None:
        self.dir = directory
        self.socket = directory / "gpusim.sock"
        self.options = options or {}
        self.process: ManagedProcess | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "gpuguard.gpusim", "serve", "--socket", str(self.socket)]
        for key, value in self.options.items():
            flag = "--" + key.replace("_", "-")
            for item in value if isinstance(value, list | tuple) else [value]:
                argv += [flag, str(item)]
        return argv

    def start(self, timeout: float = 20.0) -> GpusimService:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)
        self.process = ManagedProcess("gpusim", self.argv(), self.dir / "gpusim.log").start()
        self.process.wait_ready(lambda: gpusim_query(self.socket)["ok"] is True, timeout)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
