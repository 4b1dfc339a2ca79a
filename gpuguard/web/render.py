"""One render for concurrent callers: a burst of scrapes costs a few renders, not hundreds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future


class SharedRender:
    """Callers that arrive while a render runs wait for it and get its result.

    Nothing is kept afterwards, so a caller never gets a body rendered before the render
    it joined began: as fresh as rendering for itself, at a fraction of the cost.
    """

    def __init__(self, render: Callable[[], bytes]) -> None:
        self._render = render
        self._lock = threading.Lock()
        self._running: Future[bytes] | None = None

    def get(self) -> bytes:
        with self._lock:
            running = self._running
            mine: Future[bytes] = Future()
            if running is None:
                self._running = mine
        if running is not None:
            return running.result()
        try:
            body = self._render()
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._running = None
        mine.set_result(body)
        return body
