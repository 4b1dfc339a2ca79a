"""A small stdlib client for the gpusim daemon (docs/interfaces.md section 1).

One client is one connection, and so at most one context: a workload process holds one
client per device it uses; the exporter holds one for ``sample()``.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from gpuguard.gpusim import DEFAULT_SOCKET, SOCKET_ENV
from gpuguard.gpusim.errors import DaemonUnavailable, error_for


def default_socket_path() -> Path:
    """``$GPUSIM_SOCKET``, else ``/run/gpusim/gpusim.sock``."""
    return Path(os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)


class GpusimClient:
    """Blocking request/reply over one Unix-socket connection.

    Raises ``GpusimError`` (``OutOfMemory`` for ``out_of_memory``) on an ``ok: false`` reply
    and ``DaemonUnavailable`` when the daemon cannot be reached or goes away.
    """

    def __init__(self, socket_path: str | Path | None = None, timeout: float | None = None):
        self.socket_path = Path(socket_path) if socket_path else default_socket_path()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Blocking ops last as long as the simulated job, so no timeout unless asked.
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(str(self.socket_path))
        except OSError as exc:
            self._sock.close()
            raise DaemonUnavailable(f"cannot connect to {self.socket_path}: {exc}") from exc
        self._file = self._sock.makefile("rb")

    def close(self) -> None:
        """Close the connection (the daemon then frees this connection's context)."""
        self._file.close()
        self._sock.close()

    def __enter__(self) -> GpusimClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def request(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one request and return its ``ok: true`` reply."""
        self.send(op, **args)
        return self.receive()

    def send(self, op: str, **args: Any) -> None:
        """Send a request without waiting (pipelining); ``receive`` gets replies in order."""
        line = json.dumps({"op": op, **args}, separators=(",", ":")).encode() + b"\n"
        try:
            self._sock.sendall(line)
        except OSError as exc:
            raise DaemonUnavailable(f"connection to {self.socket_path} failed: {exc}") from exc

    def receive(self) -> dict[str, Any]:
        """The next reply; raises ``GpusimError`` for ``ok: false``."""
        try:
            reply_line = self._file.readline()
        except OSError as exc:
            raise DaemonUnavailable(f"connection to {self.socket_path} failed: {exc}") from exc
        if not reply_line:
            raise DaemonUnavailable(f"gpusim daemon at {self.socket_path} closed the connection")
        reply: dict[str, Any] = json.loads(reply_line)
        if not reply.get("ok"):
            raise error_for(str(reply.get("error")), str(reply.get("message", "")))
        return reply

    def context_create(self, device: int | str = 0) -> dict[str, Any]:
        """Create this connection's context on ``device`` (``0``, ``"0:1"`` for MIG, a UUID)."""
        return self.request("context_create", device=device)

    def alloc(self, size: int) -> int:
        """Allocate ``size`` bytes of device memory; returns the handle."""
        return int(self.request("alloc", bytes=size)["handle"])

    def free(self, handle: int) -> None:
        """Free one allocation."""
        self.request("free", handle=handle)

    def copy_in(self, size: int) -> float:
        """Copy ``size`` bytes host to device; returns the simulated seconds it took."""
        return float(self.request("copy_in", bytes=size)["seconds"])

    def copy_out(self, size: int) -> float:
        """Copy ``size`` bytes device to host; returns the simulated seconds it took."""
        return float(self.request("copy_out", bytes=size)["seconds"])

    def kernel(self, work: float | None = None, flops: float | None = None) -> tuple[float, float]:
        """Run a kernel to completion (``work`` device-seconds, or ``flops``).

        Returns its (started, ended) wall times; waits for kernels launched before it.
        """
        reply = self.request("kernel", **_kernel_size(work, flops))
        return float(reply["started"]), float(reply["ended"])

    def launch(self, work: float | None = None, flops: float | None = None) -> int:
        """Launch a kernel asynchronously; returns how many ops are queued on the context.

        Blocks only while the context's launch queue is full, as cudaLaunchKernel does.
        """
        return int(self.request("launch", **_kernel_size(work, flops))["queued"])

    def event_record(self) -> int:
        """Record an event in the stream (like cudaEventRecord); returns its id."""
        return int(self.request("event_record")["event"])

    def synchronize(self) -> dict[int, float]:
        """Wait until every launched op is done; returns each event reached since the
        last synchronize, by id, with the wall time the device reached it."""
        reply = self.request("synchronize")
        return {int(e["id"]): float(e["t"]) for e in reply["events"]}

    def context_destroy(self) -> None:
        """Destroy the context: all its memory is freed."""
        self.request("context_destroy")

    def sample(self, since_us: int = 0) -> dict[str, Any]:
        """Devices, memory, utilization, compute processes and process samples."""
        return self.request("sample", since_us=since_us)

    def status(self) -> dict[str, Any]:
        """``sample`` plus scales and each process's phase."""
        return self.request("status")


def _kernel_size(work: float | None, flops: float | None) -> dict[str, float]:
    if (work is None) == (flops is None):
        raise ValueError("give exactly one of work (seconds) or flops")
    return {"work": work} if work is not None else {"flops": float(flops or 0.0)}
