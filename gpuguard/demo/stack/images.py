"""Test and demo images made with ``docker import`` (nothing can be pulled here).

The base image holds busybox and mount points. Python code runs in it from the host's
interpreter, bind-mounted read-only, so containers run the project's own code without a
registry or a build step.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
from typing import Any

from gpuguard import resources

BASE_IMAGE = "gpuguard/base:local"
REPO_ROOT = resources.IMPORT_ROOT


def _rootfs_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add_base_layout(tar)
    return buf.getvalue()


def add_base_layout(tar: tarfile.TarFile, passwd: str = "") -> None:
    """Top-level directories, busybox and its applets, ``/etc/passwd`` (plus ``passwd``)."""

    def add_dir(name: str) -> None:
        info = tarfile.TarInfo(name)
        info.type = tarfile.DIRTYPE
        info.mode = 0o1777 if name == "tmp" else 0o755
        tar.addfile(info)

    def add_link(name: str, target: str) -> None:
        info = tarfile.TarInfo(name)
        info.type = tarfile.SYMTYPE
        info.linkname = target
        tar.addfile(info)

    for name in ("bin", "dev", "etc", "proc", "sys", "tmp", "usr", "root", "run", "var"):
        add_dir(name)
    add_link("lib", "usr/lib")
    add_link("lib64", "usr/lib64")
    busybox = shutil.which("busybox") or "/bin/busybox"
    if os.path.exists(busybox):
        tar.add(busybox, arcname="bin/busybox")
        for applet in ("sh", "sleep", "cat", "ls", "true"):
            add_link(f"bin/{applet}", "busybox")
    for name, text in (
        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n" + passwd),
        ("etc/group", "root:x:0:\n"),
    ):
        data = text.encode()
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def ensure_base_image(client: Any) -> str:
    """Import the base image into the engine behind ``client`` unless it is there."""
    import docker.errors

    try:
        client.images.get(BASE_IMAGE)
        return BASE_IMAGE
    except docker.errors.ImageNotFound:
        pass
    repo, tag = BASE_IMAGE.rsplit(":", 1)
    client.api.import_image_from_data(_rootfs_tar(), repository=repo, tag=tag)
    return BASE_IMAGE


def python_mounts() -> dict[str, dict[str, str]]:
    """Read-only bind mounts that let the host's Python and this repo run in a container."""
    paths = {"/usr", sys.base_prefix, sys.prefix, str(REPO_ROOT)}
    mounts: dict[str, dict[str, str]] = {}
    for path in sorted(paths):
        if any(path != p and path.startswith(p + "/") for p in paths):
            continue  # already inside another mount
        mounts[path] = {"bind": path, "mode": "ro"}
    return mounts


def python_container_kwargs(
    module_args: list[str],
    *,
    labels: dict[str, str] | None = None,
    extra_mounts: dict[str, dict[str, str]] | None = None,
    environment: dict[str, str] | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Arguments for ``client.containers.run`` that run ``python -m <module_args>``."""
    env = {"PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.update(environment or {})
    volumes = python_mounts()
    volumes.update(extra_mounts or {})
    return {
        "image": BASE_IMAGE,
        "command": [sys.executable, "-m", *module_args],
        "labels": labels or {},
        "volumes": volumes,
        "environment": env,
        "network_mode": "none",
        "working_dir": "/tmp",
        "detach": True,
        "name": name,
    }
