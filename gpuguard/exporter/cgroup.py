"""PID -> container, from ``<procfs>/<pid>/cgroup``, and process start time from ``stat``.

Parsing is pure (``container_id_from_cgroup``, ``start_ticks_from_stat``); ``ProcReader``
does the file reads under an injectable procfs root (``--path.procfs``) and caches each
answer keyed by (pid, start ticks), so a reused PID is looked up afresh.

Path forms recognised (the id is always 64 hex digits, the last one in the path wins, so
nested Docker-in-Docker resolves to the innermost container):
- cgroup v1, Docker cgroupfs driver: ``/docker/<id>``
- cgroup v2 / systemd driver: ``/system.slice/docker-<id>.scope``
- Kubernetes cgroupfs: ``/kubepods/burstable/pod<uid>/<id>``
- Kubernetes systemd + containerd / CRI-O: ``.../cri-containerd-<id>.scope``, ``crio-<id>.scope``
- podman: ``/machine.slice/libpod-<id>.scope`` (``libpod-conmon-<id>`` is the monitor, not
  the container, and is ignored)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpuguard.exporter.errors import ProcfsError
from gpuguard.exporter.model import ProcessOwner

_COMPONENT = re.compile(
    r"^(?:(?:docker|libpod|cri-containerd|crio|containerd)-)?([0-9a-f]{64})(?:\.scope)?$"
)

# /proc/<pid>/stat: fields after the ")" closing comm start at field 3, so field 22 is [19].
_STARTTIME_AFTER_COMM = 22 - 3


def container_id_from_cgroup(text: str) -> str | None:
    """The container id in the content of a ``/proc/<pid>/cgroup`` file, or None."""
    for line in text.splitlines():
        # "hierarchy-ID:controller-list:path"; the path itself may contain ':'
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for component in reversed(parts[2].split("/")):
            match = _COMPONENT.match(component)
            if match:
                return match.group(1)
    return None


def start_ticks_from_stat(text: str) -> int:
    """Field 22 (starttime, clock ticks after boot) of a ``/proc/<pid>/stat`` line.

    comm (field 2) is in parentheses and may itself hold spaces and ')', so split after
    the last ')'.
    """
    close = text.rfind(")")
    if close < 0:
        raise ValueError("no ')' closing comm in stat line")
    fields = text[close + 1 :].split()
    return int(fields[_STARTTIME_AFTER_COMM])


class ProcReader:
    """Looks up the owner (container, start ticks) of host PIDs under ``procfs``."""

    def __init__(self, procfs: Path = Path("/proc")) -> None:
        self.procfs = procfs
        self._root = os.fsencode(procfs)
        self._cache: dict[int, ProcessOwner] = {}

    def check(self) -> None:
        """Raise ``ProcfsError`` when the procfs root cannot be read at all."""
        if not os.access(self._root, os.R_OK | os.X_OK):
            raise ProcfsError(f"procfs {self.procfs} is not readable")

    def _read(self, pid: int, name: bytes) -> str:
        fd = os.open(self._root + b"/%d/" % pid + name, os.O_RDONLY)
        try:
            return os.read(fd, 65536).decode(errors="replace")
        finally:
            os.close(fd)

    def owner(self, pid: int) -> ProcessOwner | None:
        """The process's owner, or None when it is gone (or not visible in this procfs)."""
        try:
            ticks = start_ticks_from_stat(self._read(pid, b"stat"))
        except (OSError, ValueError, IndexError):
            self._cache.pop(pid, None)
            return None
        cached = self._cache.get(pid)
        if cached is not None and cached.start_ticks == ticks:
            return cached
        try:
            container_id = container_id_from_cgroup(self._read(pid, b"cgroup"))
        except OSError:
            return None
        owner = ProcessOwner(container_id=container_id, start_ticks=ticks)
        self._cache[pid] = owner
        return owner

    def retain(self, pids: set[int]) -> None:
        """Forget PIDs no longer on any GPU, so the cache stays O(GPU processes)."""
        for pid in [p for p in self._cache if p not in pids]:
            del self._cache[pid]
