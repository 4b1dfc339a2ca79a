"""One render for concurrent callers (a burst of scrapes costs a few renders, not hundreds),
and the text of a prometheus_client registry as the services serve it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any


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


class _WithoutCreated:
    """A registry's collectors as Prometheus should see them: no ``*_created`` series.

    prometheus_client adds a ``<name>_created`` timestamp to every counter and histogram
    child (about 50 series on the actuator) that no rule or dashboard reads; its switch to
    stop that is process-wide, so it is dropped here, per render, from the families.
    """

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Any]:
        for family in self.registry.collect():
            if family.type in _WITH_CREATED:
                created = f"{family.name}_created"
                family.samples = [s for s in family.samples if s.name != created]
            yield family


_WITH_CREATED = frozenset({"counter", "histogram", "summary"})


def metrics_text(registry: Any) -> bytes:
    """``registry`` in Prometheus' text format, without the ``*_created`` series."""
    from prometheus_client import generate_latest

    return generate_latest(_WithoutCreated(registry))
