"""Decide again when something falls due: a hold, a best-effort share, a run quantum.

Events and webhooks cannot be relied on for that: a frozen container's share falls due
while nothing on the device changes. ``Decision.next_due`` says when; this thread calls
back then (or at once for a time already past), one call at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("gpuguard.actuator")

#: never wake more often than this, however close two due times are
MIN_GAP_S = 0.02


class DueTimer:
    """One daemon thread waiting for the earliest due wall time it was given."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._cond = threading.Condition()
        self._due: float | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="due-timer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def at(self, due: float | None) -> None:
        """Replace the due time with ``due`` (wall clock; None: nothing due)."""
        with self._cond:
            self._due = due
            self._cond.notify()

    @property
    def due(self) -> float | None:
        with self._cond:
            return self._due

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    wait = None if self._due is None else self._due - time.time()
                    if wait is not None and wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stopped:
                    return
                self._due = None
            try:
                self._callback()
            except Exception:  # the timer must go on
                log.exception("timed decision failed")
            time.sleep(MIN_GAP_S)
