from __future__ import annotations

import threading
import time

import pytest

from gpuguard.exporter.events import EventLog


def test_seq_increases_and_none_fields_are_dropped() -> None:
    log = EventLog(10, clock=lambda: 5.0)
    first = log.append("task_started", task_id="t1", container_id=None)
    second = log.append("task_ended", task_id="t1", run_s=1.5)
    assert (first["seq"], second["seq"], log.seq) == (1, 2, 2)
    assert first == {"seq": 1, "ts": 5.0, "type": "task_started", "task_id": "t1"}
    batch = log.since(0)
    assert [e["seq"] for e in batch.events] == [1, 2]
    assert batch.next == 2 and not batch.truncated
    assert log.since(1).events == (second,)


def test_unknown_type_rejected() -> None:
    with pytest.raises(ValueError):
        EventLog(4).append("nonsense")


def test_truncated_when_since_is_older_than_the_ring() -> None:
    log = EventLog(3)
    for _ in range(5):
        log.append("container_started")
    batch = log.since(0)
    assert batch.truncated and [e["seq"] for e in batch.events] == [3, 4, 5]
    assert not log.since(2).truncated  # seq 3 onwards are all still there
    assert log.since(1).truncated


def test_since_newer_than_anything_is_truncated() -> None:
    log = EventLog(3)
    log.append("container_started")
    batch = log.since(99, timeout=5)
    assert batch.truncated and batch.next == 1 and batch.events == ()


def test_times_out_empty() -> None:
    log = EventLog(3)
    started = time.monotonic()
    batch = log.since(0, timeout=0.1)
    assert batch.events == () and batch.next == 0 and not batch.truncated
    assert time.monotonic() - started >= 0.09


def test_long_poll_wakes_at_once() -> None:
    log = EventLog(8)
    got: list[float] = []

    def follower() -> None:
        batch = log.since(0, timeout=10)
        got.append(time.monotonic())
        assert batch.events[0]["type"] == "container_paused"

    thread = threading.Thread(target=follower)
    thread.start()
    time.sleep(0.1)
    appended = time.monotonic()
    log.append("container_paused", container_id="c")
    thread.join(timeout=5)
    assert got and got[0] - appended < 0.05
