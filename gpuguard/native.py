"""Small C programs built on demand: gpusim's driver stand-in and the exporter's launch probe.

``build(name, sources, commands)`` returns the path of ``name`` in the cache directory
(``$GPUGUARD_NATIVE_DIR``, else ``~/.cache/gpuguard/native``), built by ``commands`` the first
time the sources' content is seen; the cache key is a hash of the sources and the commands,
so an edited source is rebuilt and a built file is never committed. A failed build raises
``NativeBuildError`` with the tool's own message and leaves nothing in the cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

NATIVE_DIR_ENV = "GPUGUARD_NATIVE_DIR"


class NativeBuildError(RuntimeError):
    """A compiler is missing or refused the sources."""


def cache_dir() -> Path:
    """Where built files are kept."""
    configured = os.environ.get(NATIVE_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "gpuguard" / "native"


def build(name: str, sources: Sequence[Path], commands: Sequence[Sequence[str]]) -> Path:
    """``name`` built by ``commands`` (run in a scratch directory holding copies of
    ``sources``; ``{out}`` in a command is the output file), cached by content."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    for command in commands:
        digest.update("\0".join(command).encode())
    target = cache_dir() / digest.hexdigest()[:16] / name
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="gpuguard-native-") as scratch:
        for source in sources:
            shutil.copy(source, scratch)
        out = Path(scratch) / name
        for command in commands:
            argv = [part.replace("{out}", str(out)) for part in command]
            if shutil.which(argv[0]) is None:
                raise NativeBuildError(f"cannot build {name}: {argv[0]} is not installed")
            done = subprocess.run(argv, cwd=scratch, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                message = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
                raise NativeBuildError(f"cannot build {name}: {' '.join(argv[:2])}: {message}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{name}.{os.getpid()}")
        shutil.copy2(out, partial)
        partial.replace(target)  # atomic: a concurrent builder sees a whole file or none
    return target
