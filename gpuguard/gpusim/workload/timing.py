"""Waiting for a wall-clock time, and stopping a long-lived workload on SIGTERM."""

from __future__ import annotations

import signal
import time
from types import FrameType


class Stopped(Exception):
    """SIGTERM arrived: a long-lived workload logs its summary and exits."""


def _raise_stopped(_signum: int, _frame: FrameType | None) -> None:
    raise Stopped


def stop_on_sigterm() -> None:
    """Make SIGTERM (``docker stop``) raise ``Stopped`` in the main thread."""
    signal.signal(signal.SIGTERM, _raise_stopped)


def wait_until(when: float | None) -> float:
    """Sleep until wall time ``when`` (if it is ahead); returns the later of it and now."""
    now = time.time()
    if when is None or when <= now:
        return now
    time.sleep(when - now)
    return when
