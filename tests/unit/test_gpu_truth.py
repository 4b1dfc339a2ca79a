"""The truth kit's pure parts: matching detected tasks to the workload's own clocks, the
freeze drain read from step ends, contention at a concurrency level, the fitted profile."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from gputruth import contention, detection, freeze, launchprobe, semantics
from gputruth.rig import Sampler

from gpuguard.contract import Phase, TaskMode
from gpuguard.exporter.model import DeviceSample, GpuProcess, GpuSample, ProcessUtilization
from gpuguard.exporter.tracker import TaskView


def _task(start: float, end: float | None, pid: int = 7) -> TaskView:
    return TaskView(
        task_id=f"-:{pid}:1:{start}", container_id=None, pid=pid, gpu="0", gpu_index=0,
        mig_index=None, proc_start_ticks=1, order=(start, 1, 0), mode=TaskMode.BURST,
        phase=Phase.ENDED, started_at=start, memory_bytes=1, sm_ratio=0.0, deadline_s=None,
        overrun=False, ended_at=end,
    )  # fmt: skip


def test_truth_of_oneshot_runs_and_server_requests() -> None:
    oneshot = [
        {"event": "task_start", "run": 0, "t": 1.0},
        {"event": "task_end", "run": 0, "t": 2.0},
        {"event": "task_start", "run": 1, "t": 3.0},  # never ended: not a task
    ]
    assert detection.truth_intervals(oneshot, "oneshot") == [detection.Interval(1.0, 2.0)]
    oneshot.insert(1, {"event": "context_created", "run": 0, "t": 1.4})  # torch imported
    assert detection.truth_intervals(oneshot, "oneshot")[0].context == 1.4
    server = [{"event": "request", "gpu_start": 5.0, "gpu_end": 5.2, "t": 5.3}]
    assert detection.truth_intervals(server, "server") == [detection.Interval(5.0, 5.2)]


def test_each_true_task_takes_the_detected_task_it_overlaps_most_once() -> None:
    truth = [detection.Interval(0.0, 1.0), detection.Interval(1.2, 2.0)]
    a, b, running = _task(0.05, 1.1), _task(1.25, 2.02), _task(3.0, None)
    pairs = detection.match(truth, [b, running, a])
    assert [task for _, task in pairs] == [a, b]
    # one detected task merging both can stand for only one of them
    merged = _task(0.0, 2.0)
    assert len(detection.match(truth, [merged])) == 1


def test_kernels_count_for_n_only_when_they_ran_beside_every_other_process() -> None:
    kernels = [(0, 0.0, 2.0), (1, 0.1, 2.1), (2, 0.0, 2.0), (0, 3.0, 4.0)]
    assert contention.at_concurrency(kernels, 3) == kernels[:3]
    assert contention.at_concurrency(kernels, 1) == [kernels[3]]


def test_contention_ratios_and_error_against_the_model() -> None:
    result = contention.compare({1: 10.0, 2: 25.0}, [])
    assert result["rows"][1]["ratio"] == 2.5
    paper_ratio = result["rows"][1]["paper_b"]
    assert result["max_rel_error_vs_gpusim"] == pytest.approx(abs(paper_ratio - 2.5) / 2.5, 1e-3)


def test_fitted_profile_is_a_valid_gpusim_profile() -> None:
    measured = contention.compare({1: 2.0, 2: 4.5, 3: 7.0}, [(1, 5e9, 2e9)])
    profile = contention.fit_profile("h100", "NVIDIA H100", measured, 0.16, 80 * 2**30, 5 * 2**20)
    assert profile.concurrent_kernel_s == (2.0, 4.5, 7.0)
    assert profile.copy_in_bytes_per_s == 5e9 and profile.sample_period_s == 0.16
    gap = contention.fit_profile("x", "x", contention.compare({1: 2.0, 4: 8.0}, []), None, 1, None)
    assert gap.concurrent_kernel_s == (2.0, 4.0, 6.0, 8.0)
    assert gap.description.endswith("n = 2, 3 interpolated")
    with pytest.raises(ValueError, match="alone"):
        contention.fit_profile("x", "x", contention.compare({2: 2.0, 3: 7.0}, []), None, 1, None)


def test_each_level_runs_long_enough_to_overlap_despite_a_skewed_start() -> None:
    assert contention.runs_for(3, None, 8.0) == contention.RUNS  # nothing alone yet
    assert contention.runs_for(1, 0.1, 8.0) == 80
    assert contention.runs_for(10, 0.1, 8.0) == 8
    assert contention.runs_for(10, 1.0, 8.0) == contention.RUNS
    assert contention.runs_for(1, 1e-6, 8.0) == 200
    assert contention.runs_for(2, 0.1, 0.0) == contention.RUNS  # gpusim: a fixed count


def test_each_logged_run_takes_the_busy_span_it_overlaps_most() -> None:
    """On a GPU the context's first kernel and the calibration are a span before run 0."""
    runs = [(1.0, 1.1), (1.7, 1.8)]
    spans = [(0.4, 0.45), (1.0, 1.11), (1.7, 1.81)]
    assert launchprobe.pair_runs(runs, spans) == {0: 1, 1: 2}
    assert launchprobe.pair_runs(runs, [(1.0, 1.9)]) == {0: 0}  # one span, one run


class _Recorded(Sampler):
    def __init__(self, samples: list[GpuSample]) -> None:
        self.samples = samples
        self.costs_s = [0.001, 0.002, 0.003]


def test_freeze_drain_is_the_last_step_end_inside_the_window() -> None:
    steps = [{"event": "step", "t": t} for t in (0.8, 0.9, 1.0, 1.05, 1.12, 2.0, 2.1)]
    sample = GpuSample(1.1, (DeviceSample(0, "u", "g", 1, 1, 0.5,
        (GpuProcess(7, 1),), (ProcessUtilization(7, 1_100_000, 0.9, 0.0),)),))  # fmt: skip
    result = freeze.analyse(steps, [(1.0, 1.5)], _Recorded([sample]), 7, "cgroup v2")
    assert result["freeze_drain_ms_p95"] == pytest.approx(120.0)
    assert result["thaw_first_step_ms_p50"] == pytest.approx(500.0)
    assert result["exporter_last_active_ms_p95"] == pytest.approx(100.0)


def test_a_sample_taken_while_a_step_ran_counts_for_no_step() -> None:
    # the context was asked for at 0.9 and answered done at 1.0; a sample at 0.95 already
    # lists the process: it is no sign that the process was listed from its start
    marks = {"start": 0.0, "context": 1.0, "alloc": 2.0, "free": 3.0, "release": 4.0,
             "compute": 5.0, "exit": 6.0}  # fmt: skip
    sent = {step: at - 0.1 for step, at in marks.items() if step != "start"}
    listed = {0.95: 300, 1.5: 300, 2.5: 1300}
    samples = [
        GpuSample(t, (DeviceSample(0, "u", "g", 10_000, 0, 0.0, (GpuProcess(7, m),)),))
        for t, m in listed.items()
    ]
    assert semantics.analyse(_Recorded(samples), 7, marks, sent)["process_listed_from"] == (
        "context"
    )
    # without the asking times the race reads as listed from the start
    assert semantics.analyse(_Recorded(samples), 7, marks)["process_listed_from"] == "start"


def test_semantics_say_when_the_process_appeared_and_that_freed_memory_stays() -> None:
    marks = {"start": 0.0, "context": 1.0, "alloc": 2.0, "free": 3.0, "release": 4.0,
             "compute": 5.0, "exit": 6.0}  # fmt: skip
    listed = {1.5: 300, 2.5: 1300, 3.5: 1300, 4.5: 300, 5.5: 300}
    samples = [
        GpuSample(t, (DeviceSample(0, "u", "g", 10_000, 0, 0.0, (GpuProcess(7, m),)),))
        for t, m in listed.items()
    ]
    result = semantics.analyse(_Recorded(samples), 7, marks)
    assert result["process_listed_from"] == "context"
    assert result["freed_memory_stays_listed"] is True
    assert result["memory_after"]["release"] == 300
    assert result["sample_call_ms_p50"] == 2.0
