"""The exporter's endpoints without a socket: cached renders, long-poll waiting, the state."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path

import pytest

from gpuguard.contract import EventType
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.http import (
    BadRequest,
    EventWaiters,
    MetricsCache,
    SnapshotCache,
    parse_events_query,
)
from gpuguard.exporter.state import program_name, state_json
from tests.unit.exporter_fakes import GIB, cid, sample, three_container_poller


def test_snapshot_cache_renders_once_per_poll(tmp_path: Path) -> None:
    backend, _, poller = three_container_poller(tmp_path / "proc")
    renders: list[int] = []

    def render(snap: object) -> bytes:
        renders.append(1)
        return b"body " * 100

    cache = SnapshotCache(poller, render)
    backend.next = sample(1.0, {100: GIB})
    poller.poll_once()
    for _ in range(5):
        assert cache.get() == b"body " * 100
        assert gzip.decompress(cache.get(gzip=True)) == b"body " * 100
    backend.next = sample(2.0, {100: GIB})
    poller.poll_once()
    cache.get()
    assert len(renders) == 2


def test_the_state_shows_activity_as_of_the_read_and_renders_again_on_every_event(
    tmp_path: Path,
) -> None:
    from gpuguard.exporter.activity import ActivityTracker
    from gpuguard.exporter.http import exporter_router
    from gpuguard.exporter.launchprobe import ProcLaunches
    from gpuguard.web.routes import Request

    backend, _, poller = three_container_poller(tmp_path / "proc")
    events = EventLog(100)
    tracker = ActivityTracker(events, 0.02, 0.5)
    poller.activity = tracker.view
    backend.next = sample(1.0, {100: GIB})
    poller.poll_once()
    router = exporter_router(poller, events)

    def busy() -> bool | None:
        reply = router.resolve("GET", "/api/v1/state").handler(Request("GET", "/api/v1/state"))
        assert not isinstance(reply, Awaitable)
        doc = json.loads(reply.body)
        return next(c["activity"]["busy"] for c in doc["containers"] if c["id"] == cid(1))

    assert busy() is None  # not seen by the probe yet
    # a launch after the poll: its edge is on the stream, and the state read next shows it
    launch = ProcLaunches(7, 1, 0, 1.0, 1.0, 1.0, 0, 0.0, 1.0, None)
    tracker.update(1.01, {cid(1): [launch]}, [])
    assert events.seq == 1 and busy() is True


def test_metrics_carry_process_metrics(tmp_path: Path) -> None:
    backend, _, poller = three_container_poller(tmp_path / "proc")
    backend.next = sample(1.0, {100: GIB})
    poller.poll_once()
    text = MetricsCache(poller).body().decode()
    assert "gpuguard_gpu_info{" in text
    assert "\nprocess_resident_memory_bytes " in text and "\nprocess_open_fds " in text


def test_state_shows_the_program_not_its_arguments(tmp_path: Path) -> None:
    backend, containers, poller = three_container_poller(tmp_path / "proc")
    infos = list(containers.snapshot().values())
    first = replace(infos[0], command="/usr/bin/python3 -m serve --db-password=hunter2")
    containers.set(first, *infos[1:])
    backend.next = sample(1.0, {100: GIB})
    snap = poller.poll_once()
    doc = state_json(snap)
    commands = {c["name"]: c["command"] for c in doc["containers"]}
    assert commands[first.name] == "python3"
    assert "hunter2" not in str(doc)


def test_program_name() -> None:
    assert program_name("/usr/bin/python3 -m x --token=t") == "python3"
    assert program_name("sleep 10") == "sleep"
    assert program_name("") == ""


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_a_waiting_follower_wakes_when_another_thread_appends() -> None:
    events = EventLog(10)
    waiters = EventWaiters(events)

    async def follow() -> object:
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, lambda: threading.Thread(target=append, args=(events,)).start())
        return await waiters.wait(0, timeout=5)

    batch = run(follow())
    assert [e["type"] for e in batch.events] == [EventType.TASK_STARTED]  # type: ignore[attr-defined]


def append(events: EventLog) -> None:
    events.append(EventType.TASK_STARTED, task_id="t")


def test_waiting_ends_at_the_timeout_or_an_interrupt() -> None:
    events = EventLog(10)
    waiters = EventWaiters(events)

    async def quiet() -> object:
        return await waiters.wait(0, timeout=0.05)

    assert run(quiet()).events == ()  # type: ignore[attr-defined]

    async def interrupted() -> object:
        interrupt = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.05, interrupt.set_result, None)
        return await waiters.wait(0, timeout=30, interrupt=interrupt)

    batch = run(interrupted())
    assert batch.events == () and not batch.truncated  # type: ignore[attr-defined]


def test_existing_events_and_truncation_answer_at_once() -> None:
    events = EventLog(2)
    waiters = EventWaiters(events)
    for _ in range(3):
        append(events)

    async def behind() -> object:
        return await waiters.wait(0, timeout=30)

    batch = run(behind())
    assert batch.truncated and len(batch.events) == 2  # type: ignore[attr-defined]


def test_events_query() -> None:
    assert parse_events_query("") == (0, 10.0)
    assert parse_events_query("since=12&timeout=0.5") == (12, 0.5)


@pytest.mark.parametrize(
    "query",
    [
        "since=-1",
        "since=x",
        "since=%C2%B2",  # '²': str.isdigit() says yes, int() says no
        "since=" + "9" * 5000,  # int() refuses more than 4,300 digits
        "timeout=61",
        "timeout=-1",
        "timeout=nan",
        "timeout=x",
        "timeout=%EF%BC%91",  # a fullwidth 1
        "foo=1",
    ],
)
def test_events_query_rejects(query: str) -> None:
    with pytest.raises(BadRequest):
        parse_events_query(query)


def test_a_finished_task_keeps_its_container_name_once_the_container_is_gone(
    tmp_path: Path,
) -> None:
    backend, containers, poller = three_container_poller(tmp_path / "proc")
    backend.next = sample(1.0, {100: GIB}, sm={100: 0.9})
    poller.poll_once()
    *_, second, third = containers.snapshot().values()
    containers.set(second, third)  # rt-1 is removed as its process exits
    events_from = poller.events.seq
    backend.next = sample(1.1, {})
    snap = poller.poll_once()
    backend.next = sample(1.2, {})
    snap = poller.poll_once()
    (finished,) = state_json(snap)["recent"]
    assert (finished["container_id"], finished["container"]) == (cid(1), "rt-1")
    ended = [e for e in poller.events.since(events_from).events if e["type"] == "task_ended"]
    assert [e["container"] for e in ended] == ["rt-1"]
