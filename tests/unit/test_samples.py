"""Holding NVML's per-process samples between the driver's instants
(gpuguard/exporter/samples.py)."""

from __future__ import annotations

import pytest

from gpuguard.contract import Phase
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.join import join
from gpuguard.exporter.model import (
    DeviceSample,
    GpuProcess,
    GpuSample,
    ProcessOwner,
    ProcessUtilization,
)
from gpuguard.exporter.samples import SampleHold
from gpuguard.exporter.tracker import Tracker
from tests.unit.exporter_fakes import GIB, cid, container

P = 1 / 6  # NVML's sample period
MEM = 2 * GIB


def poll(
    t: float, samples: dict[int, list[tuple[float, float]]], pids: tuple[int, ...] = (1, 2)
) -> GpuSample:
    """One poll at ``t``: the driver's samples (pid -> [(instant, share)]) it returns."""
    return GpuSample(
        timestamp=t,
        devices=(
            DeviceSample(
                index=0, uuid="GPU-0", name="gpu", memory_total_bytes=24 * GIB,
                memory_used_bytes=MEM * len(pids), utilization_ratio=1.0,
                processes=tuple(GpuProcess(pid, MEM) for pid in pids),
                process_samples=tuple(
                    ProcessUtilization(pid, int(at * 1e6), share, 0.0)
                    for pid, found in samples.items()
                    for at, share in found
                ),
            ),
        ),
    )  # fmt: skip


def shares(sample: GpuSample) -> dict[int, tuple[float, bool]]:
    return {s.pid: (s.sm_ratio, s.held) for s in sample.devices[0].process_samples}


def nvml_polls(kernel: tuple[float, float], until: float, every: float = 0.02) -> list[GpuSample]:
    """Polls every ``every`` s of pid 1 running one kernel, as NVML reports it."""
    start, end = kernel
    polls, seen = [], 0.0
    t = 0.0
    while t <= until:
        found = []
        k = int(seen / P) + 1
        while k * P <= t:
            lo, hi = (k - 1) * P, k * P
            busy = max(0.0, min(hi, end) - max(lo, start)) / P
            if busy > 0:
                found.append((k * P, busy))
            seen = k * P
            k += 1
        polls.append(poll(t, {1: found} if found else {}, pids=(1,)))
        t = round(t + every, 6)
    return polls


def test_a_poll_between_two_instants_holds_the_last_sample() -> None:
    hold = SampleHold()
    first = hold.apply(poll(0.17, {1: [(P, 1.0)]}))
    assert shares(first) == {1: (1.0, False)}
    assert first.devices[0].sample_period_s is None  # one instant: no period learnt yet
    assert shares(hold.apply(poll(0.19, {}))) == {1: (1.0, True)}  # no news is not SM 0
    learnt = hold.apply(poll(0.34, {1: [(2 * P, 1.0)]}))
    assert shares(learnt) == {1: (1.0, False)}
    assert hold.period("0") == pytest.approx(P, abs=1e-5)
    assert learnt.devices[0].sample_period_s == pytest.approx(P, abs=1e-5)  # the state says it
    # overdue: more than a period (and a margin) since its last sample
    assert shares(hold.apply(poll(2 * P + 1.25 * P - 0.01, {}))) == {1: (1.0, True)}
    assert shares(hold.apply(poll(2 * P + 1.25 * P + 0.01, {}))) == {}


def test_a_newer_instant_without_the_process_ends_the_hold() -> None:
    hold = SampleHold()
    hold.apply(poll(0.17, {1: [(P, 1.0)], 2: [(P, 1.0)]}))
    # the driver sampled at 2P: pid 2 ran, pid 1 did not
    assert shares(hold.apply(poll(0.34, {2: [(2 * P, 1.0)]}))) == {2: (1.0, False)}
    assert shares(hold.apply(poll(0.36, {}))) == {2: (1.0, True)}


def test_a_sample_that_shows_the_kernels_stopping_is_not_held() -> None:
    hold = SampleHold()
    hold.apply(poll(0.17, {1: [(P, 1.0)]}))
    hold.apply(poll(0.34, {1: [(2 * P, 1.0)]}))
    # a whole period, then a quarter of one on an otherwise idle device: it ended there
    stopped = hold.apply(poll(0.51, {1: [(3 * P, 0.25)]}))
    (s,) = stopped.devices[0].process_samples
    assert s.ended_us == pytest.approx((2 * P + 0.25 * P) * 1e6, abs=1)
    assert shares(hold.apply(poll(0.52, {}))) == {}


def test_a_steady_partial_share_is_held() -> None:
    # a server whose requests leave short gaps: 0.8 of every period, no fall
    hold = SampleHold()
    for k in range(1, 5):
        hold.apply(poll(k * P + 0.005, {1: [(k * P, 0.8)]}))
    assert shares(hold.apply(poll(4 * P + 0.05, {}))) == {1: (0.8, True)}


def test_the_first_sample_of_a_run_says_where_it_began() -> None:
    hold = SampleHold()
    first = hold.apply(poll(0.17, {1: [(P, 0.3)]}))
    (s,) = first.devices[0].process_samples
    assert s.began_us == pytest.approx((P - 0.3 * P) * 1e6, abs=1)


def test_tracker_between_nvml_samples_keeps_a_running_task_computing() -> None:
    # issue 8: at 50 polls/s NVML gives a sample on one poll in eight; the others read as
    # SM 0, so the task looked idle (and a best-effort container beside it was thawed)
    tracker = Tracker(EventLog(1000))
    info = container(1, deadline_s=5.0)
    hold = SampleHold()
    phases, shares_seen = [], []
    for sample in nvml_polls((0.05, 1.03), until=1.5):
        held = hold.apply(sample)
        joined = join(held, {1: ProcessOwner(cid(1), 100)}, {info.id: info})
        tracker.update(joined, sample.timestamp, {info.id: info})
        running = tracker.running()
        if running:
            phases.append((sample.timestamp, running[0].phase))
            shares_seen.append((sample.timestamp, running[0].sm_ratio))
    computing = [t for t, phase in phases if phase == Phase.COMPUTING]
    # computing without a gap from its first sample until its kernels' end was seen
    assert computing[0] == pytest.approx(P, abs=0.02) and computing[-1] >= 1.03
    first, last = computing[0], computing[-1]
    assert all(phase == Phase.COMPUTING for t, phase in phases if first <= t <= last)
    assert all(share > 0 for t, share in shares_seen if first <= t <= last)
    # the end is seen at the poll that gets the driver's first instant after it (7P = 1.17),
    # not a period later
    draining = [t for t, phase in phases if phase == Phase.DRAINING]
    assert draining and 7 * P <= draining[0] <= 7 * P + 0.02
    assert tracker.running()[0].busy_until == pytest.approx(1.03, abs=1e-3)


def test_tables_stay_bounded_under_process_churn() -> None:
    hold = SampleHold()
    for n in range(2000):
        t = n * 0.2
        hold.apply(poll(t, {n: [(t, 1.0)]}, pids=(n,)))
        hold.apply(poll(t + 0.1, {}, pids=()))
    sizes = [len(hold._last), len(hold._before), len(hold._run), len(hold._busy)]
    assert sizes[:3] == [0, 0, 0] and sizes[3] <= 8
