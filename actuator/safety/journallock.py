"""The journal's single writer: an exclusive ``flock`` on ``journal.lock`` in the state directory.

Held by a running actuator for its whole life (or by the guard while the actuator is gone);
the kernel drops it when the holder's process ends, however it ends. The holder's PID is
written into the file for operators. Never opened through a symbolic link.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

from gpuguard import files
from gpuguard.actuator.safety.statewrites import StateWrites

log = logging.getLogger("gpuguard.actuator")

LOCK_FILE = "journal.lock"


class JournalLock:
    """The journal's single writer: an exclusive ``flock`` on ``journal.lock``.

    The lock belongs to the open file: it is dropped when the holder releases it or when its
    process ends, ``kill -9`` included, and it works between containers sharing the state
    directory (same host, same file), where a PID cannot be waited on.
    """

    def __init__(self, state_dir: Path, writes: StateWrites | None = None) -> None:
        self.path = state_dir / LOCK_FILE
        self.writes = writes or StateWrites()
        self._fd: int | None = None
        self._pid_pending = False  # held, and the holder's PID not yet written

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; True when we hold it now. Raises ``OSError``
        only when there is no file to lock (read-only and missing, or not set aside)."""
        return self._take(blocking=False)

    def acquire(self) -> None:
        """Wait for the lock, however long its holder keeps it."""
        self._take(blocking=True)

    def _take(self, blocking: bool) -> bool:
        if self._fd is not None:
            return True
        fd, unwritable = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        if unwritable is not None:  # the lock is held all the same
            self.writes.failed("lock", self.path, unwritable)
            self._pid_pending = True
        else:
            self._write_pid(fd)
        return True

    def retry(self) -> None:
        """Write the holder's PID where an earlier try could not."""
        if self._fd is None or not self._pid_pending:
            return
        try:
            fd = files.open_state_file(self.path, os.O_WRONLY)
        except OSError as exc:
            self.writes.failed("lock", self.path, exc)
            return
        try:
            if os.fstat(fd).st_ino == os.fstat(self._fd).st_ino:  # still the file we lock
                self._write_pid(fd)
            else:
                self._pid_pending = False
        finally:
            os.close(fd)

    def _write_pid(self, fd: int) -> None:
        """For people: who holds it. A failure is reported; the lock is held all the same."""
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as exc:
            self.writes.failed("lock", self.path, exc)
            self._pid_pending = True
            return
        self.writes.ok("lock")
        self._pid_pending = False

    def _open(self) -> tuple[int, OSError | None]:
        """A descriptor of the lock file, and why it could only be opened read-only."""
        try:
            return files.open_state_file(self.path, os.O_RDWR), None
        except files.FileRefused as exc:
            # A link or a FIFO in its place: nobody can hold a lock on it (holders open a
            # regular file). Keep it for the operator and lock a file of our own.
            kept = files.set_aside(self.path, "bad")
            log.error("%s: %s: moved to %s", self.path, exc.strerror, kept.name)
            return files.open_state_file(self.path, os.O_RDWR), None
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            # A read-only state directory: its lock still tells who holds the journal.
            return files.open_state_file(self.path, os.O_RDONLY), exc

    def holder(self) -> str:
        """The PID the holder wrote (as seen in its PID namespace), for log lines."""
        try:
            return files.read_text(self.path, 64, follow_symlinks=False).strip() or "?"
        except (OSError, UnicodeDecodeError):
            return "?"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None
            self._pid_pending = False
