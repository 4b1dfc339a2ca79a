"""The contention model, driven with explicit times (no clock, fully deterministic)."""

from __future__ import annotations

import pytest

from gpuguard.gpusim.contention import (
    COPY_IN_BYTES_PER_S,
    COPY_OUT_BYTES_PER_S,
    ContentionSimulator,
    JobKind,
    Segment,
    kernel_rate,
    matmul_bytes,
    matmul_work_s,
)
from gpuguard.gpusim.usage import UsageHistory
from gpuguard.slowdown import PAPER_B_KERNEL_S, slowdown_factor


def run_to_end(sim: ContentionSimulator) -> list[float]:
    """Advance event by event until idle; returns finish times in order."""
    finished = []
    while (t := sim.next_completion_time()) is not None:
        finished += [job.finished for job in sim.advance(t) if job.finished is not None]
    return finished


@pytest.mark.parametrize("n", [1, 2, 5, 10])
def test_concurrent_kernels_match_paper_b(n: int) -> None:
    sim = ContentionSimulator(now=100.0)
    for pid in range(n):
        sim.add_job(100.0, JobKind.KERNEL, matmul_work_s(13312), pid)
    finished = run_to_end(sim)
    assert len(finished) == n
    expected = PAPER_B_KERNEL_S[n - 1]
    for t in finished:
        assert abs((t - 100.0) - expected) / expected < 0.05
    # Paper B: all concurrent tasks slow down uniformly, nobody finishes early.
    assert max(finished) - min(finished) < 1e-6


def test_slowdown_factor_is_held_beyond_the_table() -> None:
    assert slowdown_factor(1) == 1.0
    assert slowdown_factor(2) == pytest.approx(23.271 / (2 * 10.795))
    assert slowdown_factor(25) == slowdown_factor(10)
    with pytest.raises(ValueError):
        slowdown_factor(0)


def test_time_scale_shortens_kernels() -> None:
    sim = ContentionSimulator(time_scale=0.1)
    sim.add_job(0.0, JobKind.KERNEL, 10.795, pid=1)
    assert sim.next_completion_time() == pytest.approx(1.0795)
    assert kernel_rate(1, 0.1) == pytest.approx(10.0)


def test_matmul_sizes() -> None:
    assert matmul_work_s(13312) == pytest.approx(10.795)
    assert matmul_work_s(13312 // 2) == pytest.approx(10.795 / 8)
    assert matmul_bytes(13312) == 3 * 13312 * 13312 * 4


def test_single_copies_match_paper_b() -> None:
    sim = ContentionSimulator()
    sim.add_job(0.0, JobKind.COPY_IN, 2 * 13312 * 13312 * 4, pid=1)
    sim.add_job(0.0, JobKind.COPY_OUT, 13312 * 13312 * 4, pid=1)
    copy_in_end, copy_out_end = run_to_end(sim)
    assert copy_in_end == pytest.approx(0.189, rel=0.01)
    assert copy_out_end == pytest.approx(0.32, rel=0.02)


def test_copies_share_bandwidth_per_direction() -> None:
    sim = ContentionSimulator()
    size = int(COPY_IN_BYTES_PER_S)  # one second alone
    for pid in (1, 2):
        sim.add_job(0.0, JobKind.COPY_IN, size, pid)
    # A copy out is on the other direction: it does not slow the copies in.
    sim.add_job(0.0, JobKind.COPY_OUT, int(COPY_OUT_BYTES_PER_S), pid=3)
    assert run_to_end(sim) == pytest.approx([1.0, 2.0, 2.0])


def test_copy_time_scale() -> None:
    sim = ContentionSimulator(copy_time_scale=0.5)
    sim.add_job(0.0, JobKind.COPY_IN, int(COPY_IN_BYTES_PER_S), pid=1)
    assert sim.next_completion_time() == pytest.approx(0.5)


def test_staggered_arrivals_conserve_work() -> None:
    # A alone for 1 s, then A and B share (each at 1/(2 f2)), then B alone again.
    sim = ContentionSimulator()
    sim.add_job(0.0, JobKind.KERNEL, 3.0, pid=1)
    job_b, done = sim.add_job(1.0, JobKind.KERNEL, 3.0, pid=2)
    assert done == []
    f2 = slowdown_factor(2)
    a_end = 1.0 + 2.0 * 2 * f2  # A's remaining 2 s of work at rate 1/(2 f2)
    finished = run_to_end(sim)
    assert finished[0] == pytest.approx(a_end)
    # B did the same 2 s of work while shared and does its last 1 s alone.
    assert finished[1] == pytest.approx(a_end + 1.0)
    assert job_b.remaining == 0.0


def test_advance_between_events_and_in_the_past() -> None:
    sim = ContentionSimulator()
    job, _ = sim.add_job(0.0, JobKind.KERNEL, 2.0, pid=1)
    assert sim.advance(0.5) == []
    assert job.remaining == pytest.approx(1.5)
    assert sim.advance(0.2) == []  # the past is the present
    assert sim.now == 0.5
    assert sim.advance(5.0) == [job]
    assert job.finished == pytest.approx(2.0)
    assert sim.next_completion_time() is None


def test_cancel_gives_the_device_back() -> None:
    sim = ContentionSimulator()
    a, _ = sim.add_job(0.0, JobKind.KERNEL, 1.0, pid=1)
    b, _ = sim.add_job(0.0, JobKind.KERNEL, 1.0, pid=2)
    sim.cancel(0.5, b)
    # A got 0.5 / (2 f2) work in the first half second, then runs alone.
    expected = 0.5 + (1.0 - 0.5 / (2 * slowdown_factor(2)))
    assert sim.next_completion_time() == pytest.approx(expected)
    assert sim.advance(10.0) == [a]


def test_invalid_amounts_are_refused() -> None:
    sim = ContentionSimulator()
    with pytest.raises(ValueError):
        sim.add_job(0.0, JobKind.KERNEL, 0.0, pid=1)
    with pytest.raises(ValueError):
        ContentionSimulator(time_scale=0)


def test_usage_follows_nvml_semantics() -> None:
    usage = UsageHistory(horizon=30.0)
    sim = ContentionSimulator(on_segment=usage.record)
    sim.add_job(0.0, JobKind.KERNEL, 10.0, pid=1)
    sim.add_job(1.0, JobKind.KERNEL, 10.0, pid=2)
    sim.advance(2.0)
    assert usage.utilization(1.5, 2.0) == 1.0
    assert usage.sm_ratio(1, 1.5, 2.0) == pytest.approx(0.5)
    assert usage.sm_ratio(2, 1.5, 2.0) == pytest.approx(0.5)
    assert usage.sm_ratio(1, 0.0, 1.0) == pytest.approx(1.0)
    assert usage.kernel_pids_since(0.0) == {1: 2.0, 2: 2.0}
    assert usage.utilization(-1.0, 1.0) == pytest.approx(0.5)  # idle before t=0


def test_usage_prunes_old_history() -> None:
    usage = UsageHistory(horizon=1.0)
    for i in range(300):  # enough records to trigger pruning
        pid = 1 if i < 10 else 2
        usage.record(Segment(float(i), i + 1.0, {pid: 1.0}, {pid: 0.5}))
    assert usage.kernel_pids_since(0.0) == {2: 300.0}
    assert set(usage.sm) == {2}  # pid 1 went idle long ago and was forgotten
    assert len(usage.sm[2].times) == 1  # a constant rate needs a single checkpoint
    assert usage.utilization(299.0, 300.0) == 1.0
    assert usage.copy_ratio(2, 299.5, 300.0) == pytest.approx(0.5)


def test_usage_gaps_are_idle_and_the_future_is_unknown() -> None:
    usage = UsageHistory(horizon=10.0)
    usage.record(Segment(0.0, 1.0, {1: 0.5, 2: 0.5}, {}))
    usage.record(Segment(3.0, 4.0, {2: 1.0}, {}))
    assert usage.utilization(0.0, 4.0) == pytest.approx(0.5)
    assert usage.sm_ratio(1, 0.0, 4.0) == pytest.approx(0.125)
    assert usage.sm_ratio(2, 0.0, 4.0) == pytest.approx(0.375)
    assert usage.utilization(4.0, 6.0) == 0.0  # nothing recorded after 4.0 yet
    assert usage.sm_ratio(3, 0.0, 4.0) == 0.0
