"""A tenant that counts, read from the host: a counter that stops is a frozen container.

The tenant writes each value whole to a dot file and renames it into place, so a read never
sees it empty. A counter that advances proves the container runs; one that holds still over
a window proves it frozen. A running container on a loaded machine may not be scheduled for
a window, so "it runs again" is waited for, bounded (``resumes``), never sampled once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.waiting import wait_for

Read = Callable[[], "int | None"]


def counter_script(path: str) -> str:
    """The busybox shell loop counting into ``path`` every 10 ms, written whole."""
    folder, name = path.rsplit("/", 1)
    tmp = f"{folder}/.{name}"
    return (
        f"i=0; while true; do i=$((i+1)); echo $i > {tmp}; "
        f"/bin/busybox mv {tmp} {path}; sleep 0.01; done"
    )


def read_counter(path: Path) -> int | None:
    """The counter's value; None where there is none yet (or its container is gone)."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def moved(read: Read, window_s: float) -> bool:
    """Whether the counter moved within ``window_s``: any value read above the first."""
    deadline = time.monotonic() + window_s
    first = read()
    while time.monotonic() < deadline:
        time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        value = read()
        if first is None:
            first = value
        elif value is not None and value > first:
            return True
    return False


def resumes(read: Read, what: str, timeout_s: float = 10.0) -> bool:
    """True once the counter moves within a 0.1 s window; AssertionError naming ``what``
    when it has not after ``timeout_s``."""
    return bool(wait_for(lambda: moved(read, 0.1), timeout_s, what, interval=0.02))
