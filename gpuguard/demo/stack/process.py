"""Start a service process, wait until it is ready, stop it by its PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar


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


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """True when ``GET url`` answers 200: the readiness check of HTTP services."""
    import requests

    return requests.get(url, timeout=timeout).status_code == 200


_Service = TypeVar("_Service", bound="ConfiguredHttpService")


class ConfiguredHttpService:
    """A server with one config file in its own directory, on 127.0.0.1 only; stopped by PID.

    Subclasses name themselves and their config file and give ``argv()``; readiness is
    ``GET <url><ready_path>`` answering 200.
    """

    name = "service"
    config_name = "config.yml"
    ready_path = "/-/ready"
    listen_host = "127.0.0.1"

    def __init__(self, directory: Path, config_text: str, port: int | None) -> None:
        self.dir = directory
        self.port = port if port is not None else free_port()
        self.config_text = config_text
        self.config_path = directory / self.config_name
        self.process: ManagedProcess | None = None

    @property
    def address(self) -> str:
        """``host:port``, as Prometheus' targets want it."""
        return f"{self.listen_host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ServiceError(f"{self.name} is not started")
        return self.process.pid

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self: _Service, timeout: float = 30.0) -> _Service:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text)
        log = self.dir / f"{self.name}.log"
        self.process = ManagedProcess(self.name, self.argv(), log).start()
        self.process.wait_ready(lambda: http_ok(f"{self.url}{self.ready_path}"), timeout)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


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


def exit_on_sigterm() -> None:
    """Make SIGTERM (a timeout, ``kill``, CI's stop) unwind the program as Ctrl-C does, so
    its ``finally`` blocks stop every process it started and remove its containers; a
    second SIGTERM during that cleanup is ignored."""

    def unwind(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)
