"""Freeze and thaw a container through its cgroup: about 1 ms, where ``docker pause`` runs runc.

Runtime-agnostic: given a container id and the host PID of its init process (Docker's
``State.Pid``, a containerd task's PID), ``ContainerFreezer.cgroup`` finds the container's
cgroup from ``<procfs>/<pid>/cgroup``, under ``<sysfs>/fs/cgroup``: the v1 freezer
(``freezer.state``: ``FROZEN``, ``FREEZING``, ``THAWED``) where one is mounted, else cgroup v2
(``cgroup.freeze``, done when ``cgroup.events`` says ``frozen 1``). The cgroup must be named
for the container id (``/docker/<id>``, ``docker-<id>.scope``, ``cri-containerd-<id>.scope``
...), so a PID reused by another process, or read through another PID namespace, never
leads to someone else's cgroup.

A runtime's own pause (runc, behind ``docker pause`` and containerd's task pause) refuses a
container whose cgroup is already frozen ("container not running": runc judges a frozen
cgroup paused, and only a running container may be paused). ``handover`` gives the frozen
container to the runtime without letting it run one instruction: every process is sent
SIGSTOP while frozen (it stays queued), the cgroup is thawed (each process takes the queued
stop in the kernel, before it returns to user space), the runtime pauses the stopped
processes, and SIGCONT wakes them into the runtime's freeze. ``ensure_running`` undoes
whatever an interrupted freeze or handover left: a frozen cgroup, a queued or taken stop.

Signals go to the PIDs ``cgroup.procs`` lists for the reader's PID namespace, so a handover
needs the host's (the actuator's ``pid: host``); where the processes are not visible (listed
as 0), it refuses rather than signal the wrong process.

Parsing is pure (``parse_proc_cgroup``, ``container_cgroup``, ``v1_state``, ``v2_state``,
``stop_pending``, ``process_state``); the rest reads and writes files under the injected
roots. Only the standard library: the real-GPU truth kit (``bench/gputruth``) imports this
module on machines with nothing else installed.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FROZEN, FREEZING, THAWED = "frozen", "freezing", "thawed"
#: how long ``wait_frozen`` waits for the kernel by default; a task blocked in a driver
#: call freezes only when the call returns
FREEZE_TIMEOUT_S = 1.0
_SIGSTOP_BIT = 1 << (signal.SIGSTOP - 1)
_ID = re.compile(r"^[0-9a-f]{64}$")


class FreezerError(RuntimeError):
    """No usable freezer for this container, or the kernel refused an operation."""


class CgroupGone(FreezerError):
    """The cgroup no longer exists: its container stopped (or was never started)."""


@dataclass(frozen=True)
class ProcCgroup:
    """The paths that matter in one ``/proc/<pid>/cgroup`` file."""

    #: the v1 freezer hierarchy's directory name (``freezer``; ``freezer,devices`` where
    #: controllers share a mount) and the process's path in it
    v1_controllers: str | None
    v1_path: str | None
    #: the path in the unified (v2) hierarchy, line ``0::<path>``
    unified_path: str | None


def parse_proc_cgroup(text: str) -> ProcCgroup:
    """The freezer and unified paths of a ``/proc/<pid>/cgroup`` file's content (pure)."""
    controllers = v1_path = unified = None
    for line in text.splitlines():
        parts = line.split(":", 2)  # "hierarchy-ID:controller-list:path"; the path may hold ':'
        if len(parts) != 3:
            continue
        hierarchy, names, path = parts
        if hierarchy == "0" and names == "":
            unified = path
        elif "freezer" in names.split(","):
            controllers, v1_path = names, path
    return ProcCgroup(controllers, v1_path, unified)


def container_cgroup(path: str, container_id: str) -> str | None:
    """The container's own cgroup in a process's cgroup path, or None (pure).

    That is the path up to its last component naming the container: ``/docker/<id>``
    (cgroupfs driver), ``/system.slice/docker-<id>.scope`` (systemd driver), a
    ``cri-containerd-<id>.scope`` or ``/kubepods/.../<id>``, ``libpod-<id>.scope``. A process
    in a cgroup below it (``.../docker-<id>.scope/init``) gives the container's, whose
    freeze takes every cgroup below it along. Never a path that leaves its namespace's root
    (``..``), and only for a full 64-hex container id.
    """
    if not _ID.match(container_id):
        return None
    parts = path.split("/")
    if ".." in parts:
        return None
    own = re.compile(rf"(?:[\w.-]+-)?{container_id}(?:\.scope)?")
    for end in range(len(parts), 0, -1):
        if own.fullmatch(parts[end - 1]):
            return "/".join(parts[:end])
    return None


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


def outside_namespace(path: str) -> str | None:
    """The rest of a path that climbs out of the reader's cgroup namespace, or None (pure).

    Read from a process in a cgroup namespace of its own (containerd's CRI gives one to
    every non-privileged container on cgroup v2), another container's path starts with
    ``/..`` steps up to an ancestor the reader cannot name: ``/../../kubepods-besteffort.slice
    /kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope`` gives
    ``kubepods-besteffort.slice/.../cri-containerd-<id>.scope``. None for a path that does
    not climb, or climbs again after going down.
    """
    parts = path.split("/")
    if len(parts) < 2 or parts[0] != "" or parts[1] != "..":
        return None
    rest = parts[1:]
    while rest and rest[0] == "..":
        rest = rest[1:]
    if not rest or ".." in rest or "" in rest:
        return None
    return "/".join(rest)


#: how deep below the cgroup root an ancestor named by ``..`` steps is looked for, and how
#: many directories at most are looked at (once per container: the result is cached)
_ANCESTOR_DEPTH = 6
_ANCESTOR_DIRS = 20_000


def find_below(top: Path, relative: str, marker: str) -> Path | None:
    """The one directory ``<ancestor>/<relative>`` under ``top`` holding ``marker``, or None.

    ``relative`` ends in a component named for a full container id, which names one cgroup
    on a host: more than one match (or none) is None, and so is a search past its bounds.
    """
    found: list[Path] = []
    level, seen = [top], 0
    for _ in range(_ANCESTOR_DEPTH + 1):
        for base in level:
            if (base / relative / marker).is_file():
                found.append(base / relative)
        if found:
            return found[0] if len(found) == 1 else None
        below: list[Path] = []
        for base in level:
            try:
                entries = [e for e in base.iterdir() if e.is_dir() and not e.is_symlink()]
            except OSError:
                continue
            seen += len(entries)
            if seen > _ANCESTOR_DIRS:
                return None
            below.extend(entries)
        level = below
    return None


def _own(path: str | None, container_id: str) -> tuple[str, bool] | None:
    """The container's cgroup in ``path``, and whether it is relative to an unknown
    ancestor (the path climbed out of the reader's cgroup namespace)."""
    if path is None:
        return None
    rest = outside_namespace(path)
    if rest is not None:
        own = container_cgroup("/" + rest, container_id)
        return None if own is None else (own.lstrip("/"), True)
    own = container_cgroup(path, container_id)
    return None if own is None else (own.lstrip("/"), False)


def locate(proc: ProcCgroup, container_id: str, cgroup_root: Path) -> Cgroup | None:
    """The container's freezable cgroup under ``cgroup_root``, or None.

    The v1 freezer first: on a hybrid host (v1 controllers plus a v2 tree for systemd)
    runtimes freeze through it. cgroup v2 where the unified tree is mounted at the root.
    A path read from inside a cgroup namespace of the reader's own (``/../..``) is found by
    its container-named end below the host's tree (``find_below``).
    """
    candidates: list[tuple[int, Path, tuple[str, bool] | None, str]] = []
    if proc.v1_controllers is not None:
        own = _own(proc.v1_path, container_id)
        candidates.append((1, cgroup_root / proc.v1_controllers, own, "freezer.state"))
    candidates.append((2, cgroup_root, _own(proc.unified_path, container_id), "cgroup.freeze"))
    for version, top, own, marker in candidates:
        if own is None:
            continue
        relative, climbed = own
        path = find_below(top, relative, marker) if climbed else top / relative
        if path is not None and (path / marker).is_file():
            return Cgroup(version, path)
    return None


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
