"""The launch probe's pure parts: its records, capability check, library search, flags,
and the activity tracker's busy periods (edges on the event stream, tasks, counters)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest

from gpuguard.contract import ActivitySource, EventType, ProbeReason
from gpuguard.exporter import launchprobe
from gpuguard.exporter.activity import ActivityFeed, ActivityTracker, group
from gpuguard.exporter.cgroup import ProcReader
from gpuguard.exporter.collector import build_rows
from gpuguard.exporter.config import add_flags, load_config
from gpuguard.exporter.errors import ConfigError
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.launchprobe import (
    LaunchProbe,
    LaunchSample,
    ProbeStatus,
    ProcLaunches,
    Wake,
    find_library,
    missing_capability,
    parse_proc,
    parse_wake,
)
from gpuguard.exporter.model import ProcessOwner
from tests.unit.exporter_fakes import FakeProcfs, cid, three_container_poller


def proc(
    pid: int = 7,
    launches: int = 0,
    last: float | None = None,
    period: float | None = None,
    waits: int = 0,
    waiting: float | None = None,
    wait_end: float | None = None,
) -> ProcLaunches:
    return ProcLaunches(pid, launches, 0, period, last, period, waits, 0.0, waiting, wait_end)


def test_parse_proc_turns_monotonic_ns_into_wall_seconds() -> None:
    record = "42 3 1 1000000000 2000000000 1500000000 2 5000000 0 2500000000"
    p = parse_proc(record.split(), 100)
    assert (p.pid, p.launches, p.copies, p.waits) == (42, 3, 1, 2)
    assert (p.first, p.last, p.period, p.wait_end) == (101.0, 102.0, 101.5, 102.5)
    assert p.wait_s == 0.005 and p.waiting_since is None


def test_parse_proc_reads_the_next_inputs_and_skips_later_fields() -> None:
    record = "42 3 5 1000000000 2000000000 1500000000 2 5000000 0 2500000000"
    old = parse_proc(record.split(), 100)
    assert (old.inputs, old.input_start, old.input_after) == (0, None, None)
    new = parse_proc(f"{record} 2 2600000000 2000000000 7 8".split(), 100)
    assert (new.inputs, new.input_start, new.input_after) == (2, 102.6, 102.0)
    assert new.launches == old.launches and new.wait_end == old.wait_end


@pytest.mark.parametrize(
    "fields",
    [
        "1 2 3",
        "a 1 1 1 1 1 1 1 1 1",
        "1 1 1 1 1 1 1 1 1 -1",
        "1 1 1 1 1 1 1 1 1 1 1",
        "1 1 1 1 1 1 1 1 1 1 1 1",
        "1 1 1 1 1 1 1 1 1 1 1 -1 1",
    ],
)
def test_parse_proc_refuses_a_malformed_record(fields: str) -> None:
    with pytest.raises(ValueError):
        parse_proc(fields.split(), 0.0)


def test_parse_wake_turns_monotonic_ns_into_wall_seconds() -> None:
    assert parse_wake(["42", "1500000000"], 100) == Wake(42, 101.5)


@pytest.mark.parametrize("fields", ["1", "1 2 3", "a 1", "0 5", "5 0", "-1 5"])
def test_parse_wake_refuses_a_malformed_record(fields: str) -> None:
    with pytest.raises(ValueError):
        parse_wake(fields.split(), 0.0)


@pytest.mark.parametrize(
    ("caps", "missing"),
    [
        (1 << 21, False),  # CAP_SYS_ADMIN
        ((1 << 38) | (1 << 39), False),  # CAP_PERFMON + CAP_BPF
        (1 << 39, True),  # CAP_BPF alone cannot attach a uprobe
        (0, True),
    ],
)
def test_capabilities(caps: int, missing: bool) -> None:
    status = f"Name:\tx\nCapEff:\t{caps:016x}\n"
    assert (missing_capability(status) is not None) == missing
    assert missing_capability("Name:\tx\n") is not None


def test_find_library_prefers_the_flag_then_gpusim(tmp_path: Path) -> None:
    assert find_library(tmp_path / "x.so", None) == tmp_path / "x.so"
    assert find_library(None, tmp_path / "gpusim.sock") in (None, *map(Path, _driver_paths()))
    (tmp_path / "libcuda.so.1").write_bytes(b"")
    assert find_library(None, tmp_path / "gpusim.sock") == tmp_path / "libcuda.so.1"


def _driver_paths() -> tuple[str, ...]:
    from gpuguard.exporter.launchprobe import DRIVER_PATHS

    return DRIVER_PATHS


def test_a_probe_without_library_says_so_and_does_not_start() -> None:
    probe = LaunchProbe(lambda: Path("/nonexistent"), None, 0.01, lambda _s: None)
    status = probe.start()
    assert not status.attached and status.reason is ProbeReason.NO_LIBRARY


def test_a_probe_binary_that_fails_is_reported(tmp_path: Path) -> None:
    """A program that exits 4 (the library has no launch entry point): no_library."""
    fake = tmp_path / "probe"
    fake.write_text("#!/bin/sh\necho 'no launch entry point in x' >&2\nexit 4\n")
    fake.chmod(0o755)
    library = tmp_path / "libcuda.so.1"
    library.write_bytes(b"")
    probe = LaunchProbe(lambda: fake, library, 0.01, lambda _s: None)
    status = probe.start()
    if missing_capability(Path("/proc/self/status").read_text()):
        assert status.reason is ProbeReason.NO_PERMISSION
        return
    assert not status.attached and status.reason is ProbeReason.NO_LIBRARY
    assert "no launch entry point" in status.detail


def fake_probe(tmp_path: Path, script: str) -> tuple[Path, Path]:
    """A stand-in probe program (a shell script) and an empty library file to name."""
    fake = tmp_path / "probe"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    library = tmp_path / "libcuda.so.1"
    library.write_bytes(b"")
    return fake, library


@pytest.mark.parametrize(
    ("last", "says"), [("wakes", "busy edges pushed"), ("-", "busy edges read (no BPF ring")]
)
def test_a_probe_says_whether_it_pushes_busy_edges(tmp_path: Path, last: str, says: str) -> None:
    """The program's arguments, and its ready line's last field, as a kernel gives it."""
    fake, library = fake_probe(
        tmp_path,
        f'echo "$@" > {tmp_path}/argv\necho "ready cuLaunchKernel - - {last}"\nexec sleep 30\n',
    )
    probe = LaunchProbe(lambda: fake, library, 0.01, lambda _s: None, lambda _w: None, 0.02)
    try:
        status = probe.start()
    finally:
        probe.stop()
    if missing_capability(Path("/proc/self/status").read_text()):
        assert status.reason is ProbeReason.NO_PERMISSION
        return
    assert status.attached and says in status.detail
    assert (tmp_path / "argv").read_text().split() == [str(library), "10", "20000"]


def test_a_probe_that_ticks_on_usr1_is_read_when_a_tick_is_asked_for(tmp_path: Path) -> None:
    """``tick_at`` signals the probe at the asked time (the earliest of those pending); a
    probe whose ready line does not say ``usr1`` is never signalled (SIGUSR1 would end it)."""
    fake, library = fake_probe(
        tmp_path,
        f"trap 'date +%s.%N >> {tmp_path}/asked; echo t 1; echo .' USR1\n"
        'echo "ready cuLaunchKernel - - wakes usr1"\nwhile :; do sleep 0.01; done\n',
    )
    ticks: list[float] = []
    probe = LaunchProbe(lambda: fake, library, 1.0, lambda s: ticks.append(time.time()))
    try:
        status = probe.start()
        if missing_capability(Path("/proc/self/status").read_text()):
            assert status.reason is ProbeReason.NO_PERMISSION
            return
        assert status.attached and "idle edges timed" in status.detail and probe.asks_ticks
        asked = time.time() + 0.3
        probe.tick_at(asked + 0.5)
        probe.tick_at(asked)  # earlier: replaces the one pending
        probe.tick_at(asked + 0.2)  # later: waits for the pending one's tick to ask again
        deadline = time.time() + 5
        while not ticks and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.8)
    finally:
        probe.stop()
    signalled = [float(t) for t in (tmp_path / "asked").read_text().split()]
    assert len(signalled) == 1 and asked - 0.01 <= signalled[0] < asked + 0.2
    assert len(ticks) == 1


def test_a_quiet_record_goes_to_on_quiet_between_ticks(tmp_path: Path) -> None:
    fake, library = fake_probe(
        tmp_path,
        'echo "ready cuLaunchKernel - - wakes usr1"\necho "q 7 2000000000"\nexec sleep 30\n',
    )
    quiet: list[Wake] = []
    probe = LaunchProbe(lambda: fake, library, 1.0, lambda _s: None, on_quiet=quiet.append)
    try:
        status = probe.start()
        deadline = time.time() + 5
        while status.attached and not quiet and time.time() < deadline:
            time.sleep(0.01)
    finally:
        probe.stop()
    if status.attached:
        offset = time.time() - time.monotonic()
        assert [q.pid for q in quiet] == [7]
        assert quiet[0].at == pytest.approx(2.0 + offset, abs=0.5)


def test_feed_asks_for_a_tick_a_task_gap_after_a_wait_returned(tmp_path: Path) -> None:
    t, _events = tracked(gap=0.02)
    feed = ActivityFeed(ProcReader(tmp_path), dict, t)
    asked: list[float] = []
    feed.on_quiet(Wake(7, 5.0))  # no probe that can tick: nothing asked
    feed.ask_tick = asked.append
    feed.on_quiet(Wake(7, 5.0))
    assert asked == [pytest.approx(5.02, abs=0.001)]


def test_a_probe_that_cannot_tick_on_usr1_is_never_signalled(tmp_path: Path) -> None:
    fake, library = fake_probe(tmp_path, 'echo "ready cuLaunchKernel - - wakes"\nexec sleep 30\n')
    probe = LaunchProbe(lambda: fake, library, 1.0, lambda _s: None)
    try:
        status = probe.start()
        probe.tick_at(time.time())
        time.sleep(0.2)
        if status.attached:
            assert not probe.asks_ticks and "idle edges" not in status.detail
            assert probe.status.attached  # not ended by a signal it does not handle
    finally:
        probe.stop()


def test_a_probe_that_never_gets_ready_is_failed_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``ready`` line in time: the probe is killed, and a slow exit (a real one detaches
    every uprobe it attached) leaves the exporter on NVML's samples, never stops it."""
    monkeypatch.setattr(launchprobe, "_READY_TIMEOUT_S", 0.2)
    monkeypatch.setattr(launchprobe, "_EXIT_TIMEOUT_S", 0.2)
    fake = tmp_path / "probe"
    fake.write_text("#!/bin/sh\nsleep 2 &\nsleep 2\n")  # the child holds the pipes open
    fake.chmod(0o755)
    library = tmp_path / "libcuda.so.1"
    library.write_bytes(b"")
    status = LaunchProbe(lambda: fake, library, 0.01, lambda _s: None).start()
    if missing_capability(Path("/proc/self/status").read_text()):
        assert status.reason is ProbeReason.NO_PERMISSION
        return
    assert not status.attached and status.reason is ProbeReason.FAILED
    assert status.detail == "not ready within 0.2 s"


@pytest.mark.parametrize("kind", ["missing", "not_executable"])
def test_a_probe_program_that_cannot_run_is_no_binary(tmp_path: Path, kind: str) -> None:
    binary = tmp_path / "probe"
    if kind == "not_executable":
        binary.write_text("#!/bin/sh\n")
    library = tmp_path / "libcuda.so.1"
    library.write_bytes(b"")
    probe = LaunchProbe(lambda: binary, library, 0.01, lambda _s: None)
    status = probe.start()
    if missing_capability(Path("/proc/self/status").read_text()):
        assert status.reason is ProbeReason.NO_PERMISSION
        return
    assert not status.attached and status.reason is ProbeReason.NO_BINARY
    assert f"cannot run {binary}" in status.detail


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser.parse_args(list(argv))


def test_probe_flags() -> None:
    config = load_config(parse(), env={}).probe
    assert config.enabled and config.interval_s == 0.01 and config.library is None
    config = load_config(
        parse("--probe.launch", "off", "--probe.interval", "5ms", "--probe.library", "/x.so"),
        env={},
    ).probe
    assert not config.enabled and config.interval_s == 0.005 and config.library == Path("/x.so")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--probe.launch", "on"), "--probe.launch 'on': must be one of auto, off"),
        (("--probe.interval", "2s"), "between 1ms and 1s"),
        (("--probe.interval", "500us"), "--probe.interval"),
        (("--probe.task-gap", "soon"), "--probe.task-gap"),
    ],
)
def test_bad_probe_flags_are_one_clear_error(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(parse(*argv), env={})


def test_group_joins_processes_to_containers() -> None:
    owners = {1: ProcessOwner("a", 1), 2: ProcessOwner(None, 1), 3: None}
    grouped = group([proc(1), proc(2), proc(3), proc(4)], owners)
    assert list(grouped) == ["a"] and [p.pid for p in grouped["a"]] == [1]


def tracked(gap: float = 0.02, timeout: float = 0.5) -> tuple[ActivityTracker, EventLog]:
    events = EventLog(100)
    return ActivityTracker(events, gap, timeout, names=lambda c: f"name-{c}"), events


def edges(events: EventLog) -> list[tuple[str, float]]:
    return [(e["type"], e["ts"]) for e in events.since(0).events]


def test_a_kernel_is_in_flight_from_its_launch_to_its_wait_not_through_the_copies() -> None:
    t, _ = tracked()
    t.update(10.0, {"c": [proc(launches=1, last=10.0, period=10.0, waiting=10.0)]}, [])
    assert t.view()["c"].in_flight and t.view()["c"].busy
    # the kernel's wait returned; the output copy's wait runs: busy, no kernel in flight
    t.update(10.2, {"c": [proc(launches=1, last=10.0, period=10.0, waiting=10.15,
                                wait_end=10.1)]}, [])  # fmt: skip
    assert t.view()["c"].busy and not t.view()["c"].in_flight
    t.update(10.3, {"c": [proc(launches=2, last=10.25, period=10.25, wait_end=10.2)]}, [])
    assert t.view()["c"].in_flight  # the next kernel, launched after the last wait


def stepping(period: float, waits: int, wait_end: float | None, waiting: float | None = None):
    return ProcLaunches(7, waits + 1, 0, 0.0, period, period, waits, 0.0, waiting, wait_end)


def test_a_step_is_seen_whole_between_two_reads_with_exactly_its_wait_between() -> None:
    from gpuguard.exporter.activity import step_between

    mid = stepping(10.00, 3, 9.99, waiting=10.001)  # a step launched at 10.00, in its wait
    # back to back: its wait returned at 10.04 and the next step launched at once
    assert step_between(mid, stepping(10.0401, 4, 10.04, waiting=10.041)) == (10.00, 10.04)
    # nothing launched since the return: the step is the burst the read shows
    assert step_between(mid, stepping(10.00, 4, 10.04)) == (10.00, 10.04)
    assert step_between(mid, stepping(10.09, 5, 10.08)) is None  # two waits: two steps
    assert step_between(mid, stepping(10.00, 3, 9.99, waiting=10.001)) is None  # still in it
    idle = stepping(9.90, 3, 9.99)  # between steps at the first read: its next burst unseen
    assert step_between(idle, stepping(10.05, 4, 10.04, waiting=10.05)) is None
    assert step_between(idle, stepping(10.00, 4, 10.04)) == (10.00, 10.04)  # seen: its own
    assert step_between(idle, stepping(9.90, 4, 10.04)) is None  # a wait with no launch


def test_the_tracker_publishes_the_newest_step_seen_whole() -> None:
    t, _ = tracked()
    t.update(10.01, {"c": [stepping(10.00, 3, 9.99, waiting=10.001)]}, [])
    assert t.view()["c"].last_step is None
    t.update(10.05, {"c": [stepping(10.0401, 4, 10.04, waiting=10.041)]}, [])
    assert t.view()["c"].last_step == (10.00, 10.04)
    t.update(10.12, {"c": [stepping(10.11, 6, 10.10, waiting=10.111)]}, [])  # two steps
    assert t.view()["c"].last_step == (10.00, 10.04)  # kept: the newest seen whole


def test_an_edge_is_published_only_once_the_view_shows_it() -> None:
    t, events = tracked()
    seen: list[bool] = []
    events.subscribe(lambda: seen.append(t.view().get("c") is not None and t.view()["c"].busy))
    t.update(10.0, {"c": [proc(launches=1, last=10.0, period=10.0, waiting=10.0)]}, [])
    assert seen == [True]


def test_a_one_shot_is_one_task_from_its_first_launch_to_its_last_wait() -> None:
    """Three kernels, each waited for and the next launched 1 ms later: one task."""
    t, events = tracked()
    t.update(10.000, {"c": [proc(launches=1, last=10.0, period=10.0, waiting=10.0)]}, [])
    t.update(10.101, {"c": [proc(launches=2, last=10.101, period=10.101, wait_end=10.1)]}, [])
    t.update(10.302, {"c": [proc(launches=3, last=10.302, period=10.302, wait_end=10.301)]}, [])
    t.update(10.40, {"c": [proc(launches=3, last=10.302, period=10.302, wait_end=10.38)]}, [])
    assert edges(events) == [(EventType.GPU_BUSY, 10.0)]
    assert t.view()["c"].busy
    t.update(10.42, {"c": [proc(launches=3, last=10.302, period=10.302, wait_end=10.39)]}, [])
    assert edges(events) == [(EventType.GPU_BUSY, 10.0), (EventType.GPU_IDLE, 10.39)]
    idle = events.since(1).events[0]
    assert idle["container"] == "name-c" and idle["busy_since"] == 10.0
    view = t.view()["c"]
    assert not view.busy and view.tasks == 1 and view.last_task == (10.0, 10.39)
    assert view.busy_s == pytest.approx(0.39) and view.launches == 3


def test_requests_further_apart_than_the_gap_are_separate_tasks() -> None:
    t, events = tracked()
    t.update(1.00, {"s": [proc(launches=2, last=1.0, period=0.99, waiting=1.0)]}, [])
    t.update(1.10, {"s": [proc(launches=2, last=1.0, period=0.99, wait_end=1.05)]}, [])
    t.update(1.20, {"s": [proc(launches=4, last=1.2, period=1.19, waiting=1.2)]}, [])
    t.update(1.30, {"s": [proc(launches=4, last=1.2, period=1.19, wait_end=1.25)]}, [])
    assert edges(events) == [
        (EventType.GPU_BUSY, 0.99), (EventType.GPU_IDLE, 1.05),
        (EventType.GPU_BUSY, 1.19), (EventType.GPU_IDLE, 1.25),
    ]  # fmt: skip
    assert t.view()["s"].tasks == 2


def test_a_settled_busy_period_is_due_to_end_at_the_task_gap() -> None:
    """The feed asks the probe for a tick then, so the idle edge is not left to the next read."""
    t, _events = tracked()
    assert t.idle_due() is None
    t.update(1.00, {"s": [proc(launches=2, last=1.0, period=0.99, waiting=1.0)]}, [])
    assert t.idle_due() is None  # a wait in progress
    settled = {"s": [proc(launches=2, last=1.0, period=0.99, wait_end=1.05)]}
    t.update(1.06, settled, [])
    assert t.idle_due() == pytest.approx(1.05 + t.task_gap_s)
    t.update(1.05 + t.task_gap_s, settled, [])
    assert t.idle_due() is None and not t.view()["s"].busy


def test_feed_asks_for_a_tick_when_a_busy_period_is_due_to_end(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path)
    procfs.add(100, cid(1), 500)
    t, _events = tracked()
    feed = ActivityFeed(ProcReader(procfs.root), dict, t)
    asked: list[float] = []
    feed.ask_tick = asked.append
    busy = proc(pid=100, launches=1, last=1.0, period=1.0, waiting=1.0)
    feed.on_tick(LaunchSample(1.0, {100: busy}, frozenset()))
    assert asked == []
    done = proc(pid=100, launches=1, last=1.0, period=1.0, wait_end=1.01)
    feed.on_tick(LaunchSample(1.011, {100: done}, frozenset()))
    assert asked == [pytest.approx(1.01 + t.task_gap_s, abs=0.001)]


def test_launches_without_a_wait_end_after_the_idle_timeout() -> None:
    t, events = tracked(timeout=0.5)
    t.update(2.0, {"c": [proc(launches=5, last=2.0, period=1.9)]}, [])
    t.update(2.3, {"c": [proc(launches=5, last=2.0, period=1.9)]}, [])
    assert t.view()["c"].busy
    t.update(2.6, {"c": [proc(launches=5, last=2.0, period=1.9)]}, [])
    assert edges(events)[-1] == (EventType.GPU_IDLE, 2.0)


def test_a_wait_in_progress_keeps_the_task_running() -> None:
    t, _ = tracked(timeout=0.1)
    t.update(3.0, {"c": [proc(launches=1, last=3.0, period=3.0, waiting=3.0)]}, [])
    t.update(9.0, {"c": [proc(launches=1, last=3.0, period=3.0, waiting=3.0)]}, [])
    assert t.view()["c"].busy and t.view()["c"].busy_s == pytest.approx(6.0)


def test_an_exited_process_ends_its_task_and_keeps_counting() -> None:
    t, events = tracked()
    last = proc(pid=5, launches=4, last=4.0, period=3.9, wait_end=4.1)
    t.update(4.0, {"c": [proc(pid=5, launches=4, last=4.0, period=3.9, waiting=4.0)]}, [])
    t.update(4.5, {}, [last])
    assert edges(events)[-1] == (EventType.GPU_IDLE, 4.1)  # its last call, not the tick
    assert t.view()["c"].launches == 4 and not t.view()["c"].busy
    dying = proc(pid=6, launches=1, last=5.0, period=5.0, waiting=5.0)
    t.update(5.0, {"c": [dying]}, [])
    t.update(5.3, {}, [dying])
    assert edges(events)[-1] == (EventType.GPU_IDLE, 5.3)  # died waiting: by this tick


def test_a_wake_starts_an_idle_containers_busy_period_before_the_next_tick() -> None:
    t, events = tracked()
    t.update(0.90, {"s": [proc(launches=1, last=0.9, period=0.9, waiting=0.9)]}, [])
    t.update(1.00, {"s": [proc(launches=1, last=0.9, period=0.9, wait_end=0.95)]}, [])
    assert edges(events)[-1] == (EventType.GPU_IDLE, 0.95)
    seen: list[bool] = []
    events.subscribe(lambda: seen.append(t.view()["s"].busy))
    t.wake("s", 1.203)
    assert edges(events)[-1] == (EventType.GPU_BUSY, 1.203) and seen == [True]
    view = t.view()["s"]
    assert view.busy_since == 1.203 and view.in_flight and view.launches == 2
    # the tick that shows the launch goes on from the wake: no second edge
    t.update(1.21, {"s": [proc(launches=2, last=1.203, period=1.203, waiting=1.204,
                              wait_end=0.95)]}, [])  # fmt: skip
    t.update(1.30, {"s": [proc(launches=2, last=1.203, period=1.203, wait_end=1.25)]}, [])
    assert edges(events)[-3:] == [
        (EventType.GPU_IDLE, 0.95), (EventType.GPU_BUSY, 1.203), (EventType.GPU_IDLE, 1.25),
    ]  # fmt: skip


def test_a_wake_while_busy_or_before_the_last_end_changes_nothing() -> None:
    t, events = tracked()
    t.update(1.00, {"s": [proc(launches=1, last=1.0, period=1.0, waiting=1.0)]}, [])
    t.wake("s", 1.05)  # the tracker has not seen the task end: one task goes on
    t.update(1.30, {"s": [proc(launches=1, last=1.0, period=1.0, wait_end=1.1)]}, [])
    t.wake("s", 1.09)
    assert edges(events) == [(EventType.GPU_BUSY, 1.0), (EventType.GPU_IDLE, 1.1)]


def test_feed_joins_a_wake_through_procfs(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path)
    procfs.add(100, cid(1), 500)
    t, events = tracked()
    feed = ActivityFeed(ProcReader(procfs.root), dict, t)
    feed.on_wake(Wake(100, 2.0))
    feed.on_wake(Wake(999, 2.0))  # no such process: no container, no edge
    assert edges(events) == [(EventType.GPU_BUSY, 2.0)]
    assert events.since(0).events[0]["container_id"] == cid(1)


def test_feed_joins_a_tick_through_procfs(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path)
    procfs.add(100, cid(1), 500)
    t, events = tracked()
    feed = ActivityFeed(ProcReader(procfs.root), dict, t)
    p = proc(pid=100, launches=1, last=1.0, period=1.0, waiting=1.0)
    feed.on_tick(LaunchSample(1.0, {100: p, 999: proc(pid=999)}, frozenset()))
    assert list(t.view()) == [cid(1)] and edges(events) == [(EventType.GPU_BUSY, 1.0)]


def test_metrics_say_which_source_sees_each_container(tmp_path: Path) -> None:
    _, _, poller = three_container_poller(tmp_path / "proc")
    t, _ = tracked()
    t.update(1.0, {cid(1): [proc(launches=3, last=1.0, period=1.0, waiting=1.0)]}, [])
    poller.activity = t.view
    poller.probe = lambda: ProbeStatus(True, None, "attached")
    rows = build_rows(poller.poll_once())
    sources = {
        (labels.values[4], labels.values[5], labels.values[6])
        for labels, _ in rows.gauges["gpuguard_container_activity_source"]
    }
    assert (cid(1)[:12], ActivitySource.LAUNCH, "") in sources
    assert (cid(2)[:12], ActivitySource.NVML, ProbeReason.NO_CALLS) in sources
    launches = [v for _, v in rows.gauges["gpuguard_container_launches"]]
    assert launches == [3]
    up = rows.gauges["gpuguard_exporter_launch_probe_up"]
    assert [v for _, v in up] == [1]


def test_without_the_probe_every_container_is_nvml_with_the_reason(tmp_path: Path) -> None:
    _, _, poller = three_container_poller(tmp_path / "proc")
    poller.probe = lambda: ProbeStatus(False, ProbeReason.NO_PERMISSION, "needs CAP_BPF")
    rows = build_rows(poller.poll_once())
    sources = rows.gauges["gpuguard_container_activity_source"]
    assert len(sources) == 3
    assert {(lab.values[5], lab.values[6]) for lab, _ in sources} == {
        (ActivitySource.NVML, ProbeReason.NO_PERMISSION)
    }
    assert not rows.gauges["gpuguard_container_launches"]
    ((labels, value),) = rows.gauges["gpuguard_exporter_launch_probe_up"]
    assert value == 0 and labels.values == ("node-a", "no_permission")


def test_state_says_how_each_container_is_seen(tmp_path: Path) -> None:
    from gpuguard.exporter.state import state_json

    _, _, poller = three_container_poller(tmp_path / "proc")
    t, _ = tracked()
    t.update(1.0, {cid(1): [proc(launches=2, last=1.0, period=0.9, waiting=1.0)]}, [])
    poller.activity = t.view
    poller.probe = lambda: ProbeStatus(True, None, "attached")
    doc = state_json(poller.poll_once())
    activity = {c["name"]: c["activity"] for c in doc["containers"]}
    assert activity["rt-1"] == {
        "source": "launch", "reason": None, "busy": True, "busy_since": 0.9,
        "launches": 2, "tasks": 0, "last_task": None, "inflight": None, "inflight_error": None,
        "in_flight": True, "last_step": None,
    }  # fmt: skip
    assert activity["rt-2"]["source"] == "nvml" and activity["rt-2"]["reason"] == "no_calls"
    assert activity["rt-2"]["busy"] is None


def test_a_container_that_only_copied_is_seen_by_the_probe_with_no_kernel_in_flight(
    tmp_path: Path,
) -> None:
    # a server's start-up (its model copied in, no kernel yet): its calls are seen, so no
    # kernel in flight is a fact, and its best-effort neighbours are not duty-cycled for it
    from gpuguard.exporter.state import state_json

    _, _, poller = three_container_poller(tmp_path / "proc")
    t, events = tracked()
    loading = ProcLaunches(7, 0, 2, None, None, None, 1, 0.2, None, 1.0)
    t.update(1.0, {cid(1): [loading]}, [])
    poller.activity = t.view
    poller.probe = lambda: ProbeStatus(True, None, "attached")
    activity = {c["name"]: c["activity"] for c in state_json(poller.poll_once())["containers"]}
    assert activity["rt-1"]["source"] == "launch" and activity["rt-1"]["reason"] is None
    assert activity["rt-1"]["in_flight"] is False and activity["rt-1"]["busy"] is False
    assert activity["rt-1"]["launches"] == 0
    assert activity["rt-2"]["source"] == "nvml"  # no call seen: NVML's samples still decide
    assert edges(events) == []  # a copy is no busy edge


def test_feed_keeps_an_exited_process_in_its_container_until_it_is_gone(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path)
    procfs.add(100, cid(1), 500)
    t, _ = tracked()
    feed = ActivityFeed(ProcReader(procfs.root), dict, t)
    p = proc(pid=100, launches=5, last=1.0, period=1.0, wait_end=1.1)
    for tick in range(99):
        feed.on_tick(LaunchSample(1.0 + tick / 100, {100: p}, frozenset()))
    procfs.remove(100)  # exited; the probe reports it gone a moment later
    feed.on_tick(LaunchSample(2.0, {100: p}, frozenset()))  # the owners' refresh
    assert t.view()[cid(1)].launches == 5
    feed.on_tick(LaunchSample(2.01, {}, frozenset({100})))
    assert t.view()[cid(1)].launches == 5  # counters never go down
