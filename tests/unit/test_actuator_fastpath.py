"""The fast path stops at once: a long poll under way is not waited for, and no decision
starts once ``stop()`` has returned (the actuator then resumes what it paused); busy and
idle edges alone are decided on before the state is read."""

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

    def decide_on_edges(self, events: list[Event], event_ts: float) -> None:
        self.decisions.append(f"edges {','.join(e.type for e in events)}")  # type: ignore[arg-type]

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


class Batches:
    """The exporter's event stream: the given batches, one a poll, then nothing."""

    def __init__(self, *batches: list[str]) -> None:
        self.batches = list(batches)
        self.done = threading.Event()

    def events(self, since: int, timeout: float) -> EventBatch:
        if not self.batches:
            self.done.set()
            time.sleep(0.05)
            return EventBatch((), since, False)
        types = self.batches.pop(0)
        events = tuple(Event(since + 1 + i, time.time(), t) for i, t in enumerate(types))
        return EventBatch(events, since + len(types), False)

    def close(self) -> None:
        pass


def test_edges_alone_are_decided_on_first_then_on_a_fresh_read() -> None:
    controller = Controller()
    stream = Batches(
        [EventType.GPU_BUSY, EventType.CONTAINER_PAUSED],
        [EventType.GPU_IDLE],
        [EventType.GPU_IDLE, EventType.GPU_BUSY],
        [EventType.GPU_BUSY, EventType.TASK_STARTED],
    )
    fast = FastPath(controller, stream)  # type: ignore[arg-type]
    fast.start()
    assert stream.done.wait(5)
    fast.stop()
    fast_ = TriggerSource.FAST
    assert controller.decisions == [
        fast_, "edges gpu_busy", fast_, "edges gpu_idle", fast_,
        "edges gpu_idle,gpu_busy", fast_, fast_,
    ]  # fmt: skip
