"""Polling until a condition holds: the one ``wait_for`` of the unit and integration tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T], timeout: float, what: str = "condition", interval: float = 0.1
) -> T:
    """Call ``check`` every ``interval`` s until it returns something truthy; return that.

    ``check`` runs at least once (also with ``timeout=0``); the last failed call ends at or
    after the deadline, then AssertionError names ``what``.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
