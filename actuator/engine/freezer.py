"""Freeze and thaw a container through its cgroup: about 1 ms, where ``docker pause`` runs runc.

``ContainerFreezer.cgroup`` finds a container's cgroup (v1 freezer or v2) from its init
process's host PID, only one named for the container id; ``handover`` gives a frozen
container to the runtime's own pause without letting it run; ``ensure_running`` undoes what
an interrupted freeze or hand-over left. Raises ``FreezerError`` (``CgroupGone``). Only the
standard library. Why: docs/design-notes.md, "The cgroup freezer".
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuguard.actuator.engine.cgroupfs import ProcCgroup, find, parse_proc_cgroup

FROZEN, FREEZING, THAWED = "frozen", "freezing", "thawed"
#: how long ``wait_frozen`` waits for the kernel by default; a task blocked in a driver
#: call freezes only when the call returns
FREEZE_TIMEOUT_S = 1.0
_SIGSTOP_BIT = 1 << (signal.SIGSTOP - 1)


class FreezerError(RuntimeError):
    """No usable freezer for this container, or the kernel refused an operation."""


class CgroupGone(FreezerError):
    """The cgroup no longer exists: its container stopped (or was never started)."""


def v1_state(text: str) -> str:
    """``freezer.state``'s content as FROZEN, FREEZING or THAWED (pure)."""
    value = text.strip()
    states = {"FROZEN": FROZEN, "FREEZING": FREEZING, "THAWED": THAWED}
    if value not in states:
        raise FreezerError(f"unknown freezer.state {value!r}")
    return states[value]


def v2_state(freeze_text: str, events_text: str) -> str:
    """A v2 cgroup's state from ``cgroup.freeze`` (asked) and ``cgroup.events`` (done) (pure).

    Frozen by an ancestor counts as frozen: its processes do not run either way.
    """
    frozen = any(line.split() == ["frozen", "1"] for line in events_text.splitlines())
    if frozen:
        return FROZEN
    return FREEZING if freeze_text.strip() == "1" else THAWED


def stop_pending(status_text: str) -> bool:
    """True when a ``/proc/<pid>/status`` shows a SIGSTOP queued, not yet taken (pure)."""
    for line in status_text.splitlines():
        key, _, value = line.partition(":")
        if key in ("SigPnd", "ShdPnd") and int(value.strip() or "0", 16) & _SIGSTOP_BIT:
            return True
    return False


def process_state(stat_text: str) -> str:
    """Field 3 of a ``/proc/<pid>/stat`` line (``R``, ``S``, ``D``, ``T``...) (pure)."""
    close = stat_text.rfind(")")  # comm may itself hold spaces and ')'
    if close < 0:
        raise ValueError("no ')' closing comm in stat line")
    return stat_text[close + 2 : close + 3]


@dataclass(frozen=True)
class Cgroup:
    """One cgroup that can be frozen: its hierarchy version and directory."""

    version: int
    path: Path

    def freeze(self) -> None:
        """Ask the kernel to freeze every process in the cgroup (``wait_frozen`` confirms)."""
        if self.version == 2:
            self._write("cgroup.freeze", b"1")
        else:
            self._write("freezer.state", b"FROZEN")

    def thaw(self) -> None:
        if self.version == 2:
            self._write("cgroup.freeze", b"0")
        else:
            self._write("freezer.state", b"THAWED")

    def state(self) -> str:
        """FROZEN, FREEZING or THAWED, as the kernel says now."""
        if self.version == 2:
            return v2_state(self._read("cgroup.freeze"), self._read("cgroup.events"))
        return v1_state(self._read("freezer.state"))

    def wait_frozen(self, timeout_s: float = FREEZE_TIMEOUT_S) -> float:
        """Wait until every process is frozen; returns the seconds waited."""
        started = time.monotonic()
        pause = 0.0  # yield first: most freezes complete within a few hundred microseconds
        while self.state() != FROZEN:
            waited = time.monotonic() - started
            if waited > timeout_s:
                raise FreezerError(f"{self.path}: not frozen after {timeout_s:g}s")
            time.sleep(pause)
            pause = 0.0002 if waited < 0.005 else 0.002
        return time.monotonic() - started

    def pids(self) -> list[int]:
        """Every process in the cgroup and the cgroups below it, as this PID namespace sees
        them (0 for one it cannot see)."""
        found: list[int] = []
        if not self.path.is_dir():
            raise CgroupGone(f"{self.path}: gone")
        try:
            for directory, _, _ in os.walk(self.path):
                with open(os.path.join(directory, "cgroup.procs"), "rb") as handle:
                    found += [int(word) for word in handle.read().split()]
        except FileNotFoundError as exc:
            raise CgroupGone(f"{self.path}: gone") from exc
        except OSError as exc:
            raise FreezerError(f"{self.path}: cannot list processes: {exc}") from exc
        return found

    def exists(self) -> bool:
        return self.path.is_dir()

    def _read(self, name: str) -> str:
        try:
            with open(self.path / name, "rb") as handle:
                return handle.read().decode()
        except FileNotFoundError as exc:
            raise CgroupGone(f"{self.path}: gone") from exc
        except OSError as exc:
            raise FreezerError(f"{self.path / name}: {exc.strerror}") from exc

    def _write(self, name: str, data: bytes) -> None:
        try:
            fd = os.open(self.path / name, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise CgroupGone(f"{self.path}: gone") from exc
        except OSError as exc:  # EACCES, EROFS: not ours to freeze from here
            raise FreezerError(f"{self.path / name}: {exc.strerror}") from exc
        try:
            os.write(fd, data)
        except OSError as exc:
            if exc.errno == errno.ENODEV:  # the cgroup was removed under the open file
                raise CgroupGone(f"{self.path}: gone") from exc
            raise FreezerError(f"{self.path / name}: {exc.strerror}") from exc
        finally:
            os.close(fd)


def locate(proc: ProcCgroup, container_id: str, cgroup_root: Path) -> Cgroup | None:
    """The container's freezable cgroup under ``cgroup_root``, or None (``cgroupfs.find``)."""
    found = find(proc, container_id, cgroup_root)
    return None if found is None else Cgroup(*found)


class ContainerFreezer:
    """Finds containers' cgroups under injectable procfs and sysfs roots, freezes, thaws."""

    def __init__(self, procfs: Path = Path("/proc"), sysfs: Path = Path("/sys")) -> None:
        self.procfs = procfs
        self.cgroup_root = sysfs / "fs" / "cgroup"

    def cgroup(self, container_id: str, pid: int) -> Cgroup:
        """The cgroup of the container whose init process is ``pid`` (host PID)."""
        if pid <= 0:
            raise FreezerError(f"container {container_id[:12]} has no process (pid {pid})")
        try:
            text = (self.procfs / str(pid) / "cgroup").read_text()
        except OSError as exc:
            raise CgroupGone(f"process {pid} of {container_id[:12]} is gone: {exc}") from exc
        found = locate(parse_proc_cgroup(text), container_id, self.cgroup_root)
        if found is None:
            raise FreezerError(
                f"no freezable cgroup for container {container_id[:12]} under "
                f"{self.cgroup_root} (process {pid}: {text.strip().splitlines()[-1:]})"
            )
        return found

    def handover(self, cgroup: Cgroup, runtime_pause: Callable[[], None]) -> None:
        """Let the runtime freeze a cgroup frozen here, without it running in between.

        The processes are stopped while frozen, thawed (they stop in the kernel), paused by
        ``runtime_pause`` and continued (they stay frozen: the runtime's freeze holds them).
        When ``runtime_pause`` raises, the cgroup is frozen again before the processes are
        continued, and the error goes on. ``FreezerError`` (nothing changed) when the
        processes cannot be seen or signalled from here.
        """
        pids = cgroup.pids()
        if not pids or 0 in pids:
            raise FreezerError(f"{cgroup.path}: processes not visible from this PID namespace")
        stopped: list[int] = []
        try:
            for pid in pids:
                _signal(pid, signal.SIGSTOP)
                stopped.append(pid)
        except PermissionError as exc:
            _continue(stopped)  # still frozen: the queued stops are dropped, nothing ran
            raise FreezerError(f"{cgroup.path}: cannot stop process: {exc}") from exc
        try:
            cgroup.thaw()
            runtime_pause()
        except BaseException:
            try:
                cgroup.freeze()
                cgroup.wait_frozen()
            finally:
                _continue(stopped)
            raise
        _continue(stopped)

    def ensure_running(self, cgroup: Cgroup) -> bool:
        """Thaw the cgroup if frozen and continue processes a freeze left stopped.

        True when anything was changed. Run after the runtime's own unpause, so it undoes
        what an interrupted ``handover`` (or a crash between freeze and runtime pause) left.
        """
        changed = False
        if cgroup.state() != THAWED:
            # A stop queued while frozen would be taken on the thaw: drop it first.
            queued = [pid for pid in cgroup.pids() if pid > 0 and self._stop_queued(pid)]
            _continue(queued)
            cgroup.thaw()
            changed = True
        stopped = [pid for pid in cgroup.pids() if pid > 0 and self._stopped(pid)]
        _continue(stopped)
        return changed or bool(stopped)

    def held(self, cgroup: Cgroup) -> bool:
        """True while the cgroup is frozen or a freeze left one of its processes stopped
        (or about to stop: a stop queued while frozen is taken right after the thaw)."""
        if cgroup.state() != THAWED:
            return True
        return any(
            pid > 0 and (self._stopped(pid) or self._stop_queued(pid)) for pid in cgroup.pids()
        )

    def _stopped(self, pid: int) -> bool:
        try:
            return process_state((self.procfs / str(pid) / "stat").read_text()) == "T"
        except (OSError, ValueError):
            return False

    def _stop_queued(self, pid: int) -> bool:
        try:
            return stop_pending((self.procfs / str(pid) / "status").read_text())
        except (OSError, ValueError):
            return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # exited meanwhile
        pass


def _continue(pids: list[int]) -> None:
    for pid in pids:
        try:
            _signal(pid, signal.SIGCONT)
        except PermissionError:
            pass
