"""Start a service process, wait until it is ready, stop it by its PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path


class ServiceError(RuntimeError):
    """A service could not be started or did not become ready."""


class ManagedProcess:
    """A child process with a log file, a readiness check and a PID-based stop."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ServiceError(f"{self.name} is not started")
        return self.proc.pid

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise ServiceError(f"cannot start {self.name}: {exc}") from exc
        finally:
            log.close()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, check: Callable[[], bool], timeout: float = 30.0) -> None:
        """Poll ``check`` until it returns True; fail with the log tail if the process dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServiceError(f"{self.name} exited early:\n{self.log_tail()}")
            with contextlib.suppress(Exception):
                if check():
                    return
            time.sleep(0.05)
        raise ServiceError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM by PID, then SIGKILL after ``timeout``; reaps the child."""
        if self.proc is None:
            return
        stop_pid(self.proc.pid, timeout, popen=self.proc)


def stop_pid(pid: int, timeout: float = 15.0, popen: subprocess.Popen[bytes] | None = None) -> None:
    """Stop one process by PID (TERM, then KILL) and wait for it to go."""

    def gone() -> bool:
        if popen is not None:
            return popen.poll() is not None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return _is_zombie(pid)

    if gone():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone():
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if popen is not None:
        popen.wait(timeout=10)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def free_port(preferred: int = 0) -> int:
    """A TCP port on 127.0.0.1 that is free right now: ``preferred`` if it is, else any."""
    import socket

    for port in (preferred, 0) if preferred else (0,):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise ServiceError("no free TCP port on 127.0.0.1")
