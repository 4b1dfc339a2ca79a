"""Files that an operator, or a neighbour with access to a directory, can get wrong.

Every file gpuguard reads because someone named it (a config, token, rules or actions file)
and every file in the actuator's state directory goes through here:

* ``read_bytes``/``read_text``: regular files only, at most ``limit`` bytes; the open is
  non-blocking and a FIFO is refused before a read.
* ``open_state_file`` and ``replace``: files in a state directory are never reached through
  a symbolic link (``O_NOFOLLOW``), are regular files, and are created with mode 0600, so a
  link planted as ``journal.lock`` or ``audit.jsonl`` can neither truncate, append to nor
  chmod a file elsewhere.

Refusals are ``FileRefused``, an ``OSError`` whose ``strerror`` says why in a few words, so
callers that print ``exc.strerror`` on one line need nothing new.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import time
from pathlib import Path

_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
_CHUNK = 1 << 16


class FileRefused(OSError):
    """Not a regular file, larger than allowed, or a symbolic link where none may be."""

    def __init__(self, path: os.PathLike[str] | str, why: str) -> None:
        super().__init__(errno.EINVAL, why, str(path))


def read_bytes(path: os.PathLike[str] | str, limit: int, *, follow_symlinks: bool = True) -> bytes:
    """The whole content of a regular file of at most ``limit`` bytes.

    Raises ``FileNotFoundError`` when it is missing, ``FileRefused`` when it is not a regular
    file, is too large or (``follow_symlinks=False``) is a link, and ``OSError`` otherwise.
    """
    fd = _open(path, _READ_FLAGS, follow_symlinks)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(path, f"not a regular file ({_kind(info.st_mode)})")
        if info.st_size > limit:
            raise FileRefused(path, f"larger than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:  # st_size may be stale (a file growing, procfs): read, but bounded
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise FileRefused(path, f"larger than {limit} bytes")
    finally:
        os.close(fd)


def read_text(path: os.PathLike[str] | str, limit: int, *, follow_symlinks: bool = True) -> str:
    """``read_bytes`` decoded as UTF-8 (``UnicodeDecodeError`` when it is not)."""
    return read_bytes(path, limit, follow_symlinks=follow_symlinks).decode("utf-8")


def open_state_file(path: os.PathLike[str] | str, flags: int, mode: int = 0o600) -> int:
    """A descriptor of the regular file ``path``, created with ``mode`` if missing, never
    through a symbolic link; ``FileRefused`` for a link or anything not a regular file."""
    fd = _open(path, flags | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, False, mode)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(path, f"not a regular file ({_kind(info.st_mode)})")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def replace(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` (mode 0600) so a reader sees the old file or the new
    one, whole. ``durable``: fsync the file and the directory (survives a power cut)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    # O_EXCL + O_NOFOLLOW: a name planted in between is refused, never followed.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)  # rename replaces a link itself, never what it points to
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(path.parent)  # the rename itself must survive a power cut


def sync_file(path: Path) -> None:
    """fsync a file that was replaced without it (``durable=False``), and its directory."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def set_aside(path: Path, tag: str) -> Path:
    """Rename ``path`` to ``<name>.<tag>-<time>-<pid>`` (``-<n>`` when taken), keeping it
    for the operator. Whatever it is (a file, a directory, a FIFO, a link) is renamed,
    never opened or followed."""
    stem = f"{path.name}.{tag}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    for n in range(1000):
        target = path.with_name(stem if n == 0 else f"{stem}-{n}")
        if not os.path.lexists(target):
            os.replace(path, target)
            return target
    raise OSError(errno.EEXIST, "too many files set aside", str(path))


def _open(path: os.PathLike[str] | str, flags: int, follow: bool, mode: int = 0o600) -> int:
    try:
        return os.open(path, flags if follow else flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise FileRefused(path, "a symbolic link") from None
        if exc.errno == errno.ENXIO:  # a FIFO without a reader, opened for writing
            raise FileRefused(path, "not a regular file (fifo)") from None
        if exc.errno == errno.EISDIR:
            raise FileRefused(path, "not a regular file (directory)") from None
        raise


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISLNK, "symbolic link"),
    ):
        if test(mode):
            return name
    return "special file"
