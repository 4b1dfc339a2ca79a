"""A container's cgroup, found from ``/proc/<pid>/cgroup``: pure parsing, and the search below
the host's cgroup tree. Only the standard library (the real-GPU truth kit imports it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_ID = re.compile(r"^[0-9a-f]{64}$")


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


def find(proc: ProcCgroup, container_id: str, cgroup_root: Path) -> tuple[int, Path] | None:
    """The container's freezable cgroup under ``cgroup_root`` (version, directory), or None.

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
            return version, path
    return None
