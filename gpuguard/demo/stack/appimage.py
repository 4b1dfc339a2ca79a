"""``gpuguard/gpuguard:local``: gpuguard installed in an image, made with ``docker import``.

``deploy/Dockerfile`` needs ``python:3.11-slim`` and the package index, and neither can be
reached here. This builds the closest image that can: a rootfs holding the host's Python
interpreter (stdlib, ``lib-dynload`` and the shared libraries they link), gpuguard installed
from its wheel by pip, and gpuguard's runtime dependencies copied from this environment;
``ENTRYPOINT ["gpuguard"]``, user 10001, ``/var/lib/gpuguard/actuator`` owned by it (mode
0700), and the host's ``ctr`` (Debian's containerd package, as the Dockerfile copies it) at
``/usr/local/bin/ctr`` for the containerd source, as in the Dockerfile. The image is rebuilt
when gpuguard's sources change.

``gpuguard/workload:local`` is the same image with ``python3 -m gpuguard.gpusim.workload`` as
its entrypoint: the image a new user runs with ``gpuguard run`` against the demo's gpusim.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuguard import resources
from gpuguard.demo.stack.images import add_base_layout

APP_IMAGE = "gpuguard/gpuguard:local"
WORKLOAD_IMAGE = "gpuguard/workload:local"
SITE = "opt/gpuguard/site"
UID = 10001
HASH_LABEL = "gpuguard.source-hash"
# Extension modules gpuguard never loads whose libraries would weigh most (Tk pulls in X11).
_UNNEEDED = re.compile(r"^(_tkinter|_test|_ctypes_test|_xxtestfuzz|xxlimited|_curses).*\.so$")
_SKIP_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
                "site-packages", "__pycache__", "pydoc_data"}  # fmt: skip


def source_hash() -> str:
    """A digest of gpuguard's sources and package data: the image's freshness."""
    digest = hashlib.sha256(sys.version.encode())
    for path in sorted(_package_files()):
        digest.update(str(path.relative_to(resources.IMPORT_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _package_files() -> Iterator[Path]:
    for path in resources.PACKAGE_DIR.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path


def ensure_app_image(client: Any) -> str:
    """Import (or re-import, when the sources changed) the gpuguard image; its name."""
    import docker.errors

    wanted = source_hash()
    try:
        image = client.images.get(APP_IMAGE)
        if (image.labels or {}).get(HASH_LABEL) == wanted:
            return APP_IMAGE
    except docker.errors.ImageNotFound:
        pass
    data = build_rootfs()
    base = [f"LABEL {HASH_LABEL}={wanted}", f"USER {UID}:{UID}", "WORKDIR /etc/gpuguard",
            f"ENV PYTHONPATH=/{SITE}", "ENV PYTHONDONTWRITEBYTECODE=1",
            "ENV PYTHONUNBUFFERED=1", "ENV PATH=/usr/local/bin:/usr/bin:/bin"]  # fmt: skip
    for name, entrypoint in (
        (APP_IMAGE, '["gpuguard"]'),
        (WORKLOAD_IMAGE, '["python3", "-m", "gpuguard.gpusim.workload"]'),
    ):
        repo, tag = name.rsplit(":", 1)
        changes = [*base, f"ENTRYPOINT {entrypoint}", 'CMD ["--help"]']
        client.api.import_image_from_data(data, repository=repo, tag=tag, changes=changes)
    return APP_IMAGE


def build_rootfs() -> bytes:
    """The image's root filesystem as a tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        added: set[str] = set()
        add_base_layout(tar, passwd=f"gpuguard:x:{UID}:{UID}::/nonexistent:/bin/sh\n")
        added.update(m.name for m in tar.getmembers())
        _add_python(tar, added)
        with tempfile.TemporaryDirectory() as tmp:
            site = Path(tmp) / "site"
            _install_gpuguard(site)
            _add_dependencies(site)
            _add_tree(tar, added, site, SITE)
            for library in sorted(_linked_libraries(set(site.rglob("*.so")))):
                _add_file(tar, added, library)
        _add_entrypoint(tar, added)
        _add_ctr(tar, added)
        _add_dir(tar, added, "var/lib/gpuguard/actuator", mode=0o700, owner=UID)
        _add_dir(tar, added, "etc/gpuguard")
    return buf.getvalue()


# What deploy/Dockerfile copies into its build stage: the wheel is built from these alone.
DOCKERFILE_SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "gpuguard", "rules",
                      "grafana/dashboards", "deploy/prometheus", "deploy/alertmanager")  # fmt: skip


def _install_gpuguard(site: Path) -> None:
    """pip builds gpuguard's wheel from what the Dockerfile copies (a clean tree: no stale
    ``build/`` of the checkout) and installs it into ``site``: gpuguard as shipped."""
    source = site.parent / "src"
    for name in DOCKERFILE_SOURCES:
        origin = resources.IMPORT_ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        else:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, source / name)
    wheels = site.parent / "wheels"
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(source)],
                   check=True, capture_output=True)  # fmt: skip
    (wheel,) = wheels.glob("gpuguard-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, capture_output=True)  # fmt: skip


def _add_dependencies(site: Path) -> None:
    """Copy gpuguard's runtime dependencies, as installed here, into ``site``."""
    for dist in _runtime_distributions("gpuguard"):
        for file in dist.files or ():
            source = Path(str(dist.locate_file(file)))
            if {"__pycache__", ".."} & set(file.parts) or not source.is_file():
                continue  # bytecode, and console scripts outside site-packages
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode & 0o755)


def _runtime_distributions(name: str) -> list[importlib.metadata.Distribution]:
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [req for req in importlib.metadata.requires(name) or () if ";" not in req]
    while todo:
        req = re.split(r"[<>=!~ \[]", todo.pop(), maxsplit=1)[0]
        key = req.lower().replace("_", "-")
        if key in seen:
            continue
        dist = importlib.metadata.distribution(req)
        seen[key] = dist
        todo += [r for r in dist.requires or () if ";" not in r]
    return list(seen.values())


def _add_python(tar: tarfile.TarFile, added: set[str]) -> None:
    """The host's interpreter at its own path (its RUNPATH names it), stdlib, libraries."""
    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    binary = prefix / "bin" / version
    _add_file(tar, added, binary)
    _add_link(tar, added, str(prefix / "bin" / "python3")[1:], version)
    stdlib = Path(sysconfig.get_paths(vars={"base": str(prefix)})["stdlib"])
    for child in sorted(stdlib.iterdir()):
        if child.name not in _SKIP_STDLIB and not child.name.startswith("config-"):
            _add_tree(tar, added, child, str(child)[1:])
    libs = {binary, *(p for p in stdlib.glob("lib-dynload/*.so") if not _UNNEEDED.match(p.name))}
    libs |= set(prefix.glob("lib/libpython*.so*"))
    for library in sorted(_linked_libraries(libs)):
        _add_file(tar, added, library)
    _add_link(tar, added, "usr/bin/python3", str(binary))


def _linked_libraries(objects: set[Path]) -> set[Path]:
    """Every shared library ``ldd`` says these objects load (and the ELF interpreter)."""
    found: set[Path] = set()
    for obj in objects:
        out = subprocess.run(["ldd", str(obj)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            match = re.search(r"(/\S+) \(0x", line)
            if match and not match.group(1).startswith(str(obj.parent)):
                found.add(Path(match.group(1)))
    return found


def _add_ctr(tar: tarfile.TarFile, added: set[str]) -> None:
    """The host's ``ctr`` where it has one (the image's containerd source needs it)."""
    found = shutil.which("ctr")
    if found is None:
        return
    ctr = Path(found).resolve()
    _add_dir(tar, added, "usr/local/bin")
    _add_file(tar, added, ctr, "usr/local/bin/ctr")
    for library in sorted(_linked_libraries({ctr})):
        _add_file(tar, added, library)


def _add_entrypoint(tar: tarfile.TarFile, added: set[str]) -> None:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    script = (f"#!{sys.base_prefix}/bin/{version}\nimport sys\nfrom gpuguard.cli import main\n"
              "sys.exit(main())\n").encode()  # fmt: skip
    _add_dir(tar, added, "usr/local/bin")
    info = tarfile.TarInfo("usr/local/bin/gpuguard")
    info.size, info.mode = len(script), 0o755
    tar.addfile(info, io.BytesIO(script))


def _add_tree(tar: tarfile.TarFile, added: set[str], source: Path, arcname: str) -> None:
    if source.is_dir() and not source.is_symlink():
        _add_dir(tar, added, arcname)
        for child in sorted(source.iterdir()):
            if child.name != "__pycache__" and not _UNNEEDED.match(child.name):
                _add_tree(tar, added, child, f"{arcname}/{child.name}")
    elif source.is_symlink():
        _add_link(tar, added, arcname, os.readlink(source))
    elif source.is_file():
        _add_file(tar, added, source, arcname)


def _add_file(tar: tarfile.TarFile, added: set[str], source: Path, arcname: str = "") -> None:
    """``source`` at ``arcname`` (default: its own path); a symlink is followed, and kept."""
    name = arcname or str(Path(os.path.realpath(source.parent)) / source.name)[1:]
    if name in added:
        return
    _add_dir(tar, added, str(Path(name).parent))
    if source.is_symlink():
        target = os.readlink(source)
        _add_link(tar, added, name, target)
        _add_file(tar, added, (source.parent / target).resolve())
        return
    info = tar.gettarinfo(str(source), name)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = 0o755 if info.mode & 0o111 else 0o644
    with open(source, "rb") as handle:
        tar.addfile(info, handle)
    added.add(name)


def _add_link(tar: tarfile.TarFile, added: set[str], name: str, target: str) -> None:
    if name in added:
        return
    _add_dir(tar, added, str(Path(name).parent))
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    tar.addfile(info)
    added.add(name)


def _add_dir(
    tar: tarfile.TarFile, added: set[str], name: str, mode: int = 0o755, owner: int = 0
) -> None:
    if name in ("", ".") or name in added:
        return
    _add_dir(tar, added, str(Path(name).parent))
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, owner, owner
    tar.addfile(info)
    added.add(name)
