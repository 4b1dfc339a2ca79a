"""Freeze one process in a cgroup of its own, the way ``docker pause`` freezes a container.

The GPU machines this kit runs on have no Docker, so the kit does what runc does for
``docker pause``: move the process into a cgroup and freeze it — cgroup v2
(``cgroup.freeze``, confirmed by ``frozen 1`` in ``cgroup.events``) where a v2 hierarchy is
mounted, else the v1 freezer (``freezer.state``). Needs root. Freezing and thawing are the
actuator's own (``gpuguard.actuator.engine.freezer``, standard library only), so the kit measures
the code that freezes containers; making the cgroup is the kit's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuguard.actuator.engine.freezer import FROZEN, Cgroup, FreezerError

__all__ = ["CgroupFreezer", "FreezerError"]


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, super options) from /proc/self/mountinfo."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3:
            out.append((fields[4], tail[0], tail[2]))
    return out


class CgroupFreezer:
    """One cgroup holding the processes to freeze; ``close()`` thaws and removes it."""

    def __init__(self, name: str) -> None:
        self.version, self.path = self._create(name)
        self.cgroup = Cgroup(self.version, self.path)

    @staticmethod
    def _create(name: str) -> tuple[int, Path]:
        mounts = _mounts()
        for point, fstype, _ in mounts:
            if fstype == "cgroup2":
                path = Path(point) / name
                try:
                    path.mkdir()
                except OSError:
                    continue
                if (path / "cgroup.freeze").exists():
                    return 2, path
                path.rmdir()
        for point, fstype, options in mounts:
            if fstype == "cgroup" and "freezer" in options.split(","):
                path = Path(point) / name
                try:
                    path.mkdir()
                except OSError as exc:
                    raise FreezerError(f"cannot create {path}: {exc}") from exc
                return 1, path
        raise FreezerError("no cgroup v2 hierarchy with cgroup.freeze and no v1 freezer mounted")

    def add(self, pid: int) -> None:
        """Move ``pid`` (and, for v2, its whole thread group) into the cgroup."""
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def freeze(self, timeout_s: float = 5.0) -> float:
        """Freeze; returns the seconds until the kernel said every task is frozen."""
        started = time.monotonic()
        self.cgroup.freeze()
        self.cgroup.wait_frozen(timeout_s)
        return time.monotonic() - started

    def thaw(self) -> None:
        self.cgroup.thaw()

    def frozen(self) -> bool:
        return self.cgroup.state() == FROZEN

    def close(self) -> None:
        """Thaw, move any process left back to the root of the hierarchy, remove the cgroup."""
        if not self.path.exists():
            return
        self.thaw()
        root = self.path.parent
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (root / "cgroup.procs").write_text(f"{pid}\n")
            except OSError:
                pass  # it exited meanwhile
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.02)
        raise FreezerError(f"cannot remove {self.path}")

    def __enter__(self) -> CgroupFreezer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
