"""The fast path stops at once: a long poll under way is not waited for, and no decision
starts once ``stop()`` has returned (the actuator then resumes what it paused)."""

from __future__ import annotations

import threading
import time
from typing import Any

from gpuguard.actuator.fastpath import FastPath
from gpuguard.contract import EventType, TriggerSource
from gpuguard.statedoc import Event, EventBatch


class Controller:
    """What the fast path calls on the controller: decisions are counted."""

    def __init__(self) -> None:
        self.decisions: list[TriggerSource] = []
        self.last_state: Any = type("State", (), {"seq": 1})()

    def decide_now(self, source: TriggerSource, event_ts: float | None = None) -> None:
        self.decisions.append(source)

    def exporter_ok(self) -> None:
        pass


class LongPoll:
    """The exporter's event stream: each poll waits until released, then a task starts."""

    def __init__(self) -> None:
        self.polling = threading.Event()
        self.release = threading.Event()
        self.closed = False

    def events(self, since: int, timeout: float) -> EventBatch:
        self.polling.set()
        self.release.wait(timeout)
        started = Event(since + 1, time.time(), EventType.TASK_STARTED)
        return EventBatch((started,), since + 1, False)

    def close(self) -> None:
        self.closed = True


def test_stop_does_not_wait_for_the_long_poll_and_nothing_is_decided_after_it() -> None:
    controller, stream = Controller(), LongPoll()
    fast = FastPath(controller, stream)  # type: ignore[arg-type]
    fast.start()
    assert stream.polling.wait(5)
    assert controller.decisions == [TriggerSource.FAST]  # the resync on start
    began = time.monotonic()
    fast.stop()
    assert time.monotonic() - began < 1.0 and stream.closed
    stream.release.set()  # the poll answers with a new task: too late to act on
    time.sleep(0.2)
    assert controller.decisions == [TriggerSource.FAST]
