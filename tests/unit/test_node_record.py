"""Paper C's node record (gpuguard/exporter/record.py, types in gpuguard/noderecord.py):
state, float
time, free memory, per GPU."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuguard.contract import Phase, PriorityClass, StateReason, TaskBoundary, TaskMode
from gpuguard.exporter.collector import TextRenderer, build_rows
from gpuguard.exporter.model import (
    AttributedProcess,
    ContainerInfo,
    DeviceSample,
    GpuSample,
    Joined,
)
from gpuguard.exporter.record import NodeRecorder, RecordConfig, gpu_record
from gpuguard.exporter.state import state_json
from gpuguard.exporter.tracker import TaskView
from gpuguard.noderecord import COMPACT_SIZE, NodeRecord
from tests.support.compact import decode_compact
from tests.unit.exporter_fakes import GIB, sample, three_container_poller

CONFIG = RecordConfig(window_s=60.0, busy_window_s=5.0)


def device(used: int = 0, total: int = 24 * GIB, util: float | None = 0.0, gpu: int = 0):
    return DeviceSample(gpu, f"GPU-{gpu}", "gpusim", total, used, util)


def task(
    started: float,
    deadline: float | None,
    ended: float | None = None,
    overrun: bool = False,
    gpu: str = "0",
    boundary: TaskBoundary = TaskBoundary.EXACT,
) -> TaskView:
    return TaskView(
        task_id=f"c:{started}",
        container_id="c" * 64,
        pid=1,
        gpu=gpu,
        gpu_index=int(gpu),
        mig_index=None,
        proc_start_ticks=1,
        order=(started, 1, 1),
        mode=TaskMode.BURST,
        phase=Phase.ENDED if ended is not None else Phase.COMPUTING,
        started_at=started,
        memory_bytes=GIB,
        sm_ratio=0.5,
        deadline_s=deadline,
        overrun=overrun,
        ended_at=ended,
        boundary=boundary,
    )


def test_idle_gpu_is_in_state_1_with_unbounded_float_time() -> None:
    record = gpu_record(device(used=GIB), [], [], 100.0, 0.0, CONFIG)
    assert (record.state, record.reasons) == (1, ())
    assert record.float_time_s == math.inf and record.deadline_tasks == 0
    assert record.memory_free_bytes == 23 * GIB
    assert record.min_slack_s is None


def test_float_time_sums_running_slack_and_finished_float_in_the_window() -> None:
    running = [task(95.0, 10.0), task(99.0, None)]  # slack 5; no deadline: not counted
    finished = [
        task(80.0, 10.0, ended=86.0),  # float 4
        task(10.0, 10.0, ended=12.0),  # ended before the window (100 - 60): ignored
    ]
    record = gpu_record(device(), running, finished, 100.0, 0.2, CONFIG)
    assert record.float_time_s == pytest.approx(9.0)
    assert record.deadline_tasks == 2
    assert record.running_tasks == 2
    assert record.min_slack_s == pytest.approx(5.0)
    assert record.state == 1


def test_a_miss_in_the_window_means_state_0_and_is_forgotten_after_it() -> None:
    missed = task(50.0, 2.0, ended=60.0)  # ran 10 s against 2 s
    now_inside, now_after = 100.0, 121.0  # window 60 s: the miss at 60 counts until 120
    inside = gpu_record(device(), [], [missed], now_inside, 0.0, CONFIG)
    assert (inside.state, inside.reasons) == (0, (StateReason.MISSED_DEADLINE,))
    assert inside.recent_misses == 1
    assert inside.float_time_s == pytest.approx(-8.0)
    after = gpu_record(device(), [], [missed], now_after, 0.0, CONFIG)
    assert (after.state, after.recent_misses) == (1, 0)


def test_state_0_takes_more_than_the_miss_ratio_of_judged_tasks() -> None:
    hits = [task(float(i), 10.0, ended=i + 1.0) for i in range(50, 68)]  # 18 met
    misses = [task(70.0, 1.0, ended=75.0), task(76.0, 1.0, ended=80.0)]
    two_of_20 = gpu_record(device(), [], hits + misses, 100.0, 0.0, CONFIG)
    assert (two_of_20.recent_misses, two_of_20.state) == (2, 1)  # 10%: not more than 0.1
    three = [*misses, task(81.0, 1.0, ended=90.0)]
    three_of_21 = gpu_record(device(), [], hits + three, 100.0, 0.0, CONFIG)
    assert three_of_21.reasons == (StateReason.MISSED_DEADLINE,)
    any_miss = RecordConfig(window_s=60.0, miss_ratio=0.0)  # paper C's literal rule
    assert gpu_record(device(), [], hits + misses[:1], 100.0, 0.0, any_miss).state == 0


def test_a_tenants_own_misses_never_set_the_gpus_state() -> None:
    """Tasks of a container whose deadline the trust policy does not vouch for (issue 26:
    misses against a raised 1 s deadline took the node out) count as running, nothing more."""
    own = "c" * 64
    misses = [task(70.0, 1.0, ended=75.0), task(76.0, 1.0, ended=90.0)]
    running = [task(95.0, 1.0, overrun=True)]
    counted = gpu_record(device(), running, misses, 100.0, 0.0, CONFIG)
    assert counted.reasons == (StateReason.MISSED_DEADLINE,)
    mine = gpu_record(device(), running, misses, 100.0, 0.0, CONFIG, frozenset({own}))
    assert (mine.state, mine.recent_misses, mine.deadline_tasks) == (1, 0, 0)
    assert (mine.float_time_s, mine.min_slack_s, mine.running_tasks) == (math.inf, None, 1)
    # the recorder takes the set from the containers it is given
    info = ContainerInfo(own, "tenant", "img", "running", deadline_s=1.0, deadline_vouched=False)
    recorder = NodeRecorder("n", CONFIG)
    record = recorder.update(100.0, GpuSample(100.0, (device(),)), None, tuple(running),
                             tuple(misses), {own: info})  # fmt: skip
    assert record.state == 1 and record.gpus[0].recent_misses == 0


def test_a_running_overrun_counts_as_a_miss_now() -> None:
    record = gpu_record(device(), [task(90.0, 5.0, overrun=True)], [], 100.0, 0.0, CONFIG)
    assert record.reasons == (StateReason.MISSED_DEADLINE,)
    assert record.min_slack_s == pytest.approx(-5.0)


def test_busy_time_of_a_merged_burst_never_takes_the_gpu_out() -> None:
    # issue 15: a server's back-to-back requests merged into one long burst past the
    # deadline put its node in state 0 for most of the run
    merged = TaskBoundary.MERGED
    running = [task(60.0, 2.0, boundary=merged)]  # 40 s of busy time against 2 s
    finished = [task(20.0, 2.0, ended=52.0, boundary=merged)]  # a 32 s merged "task"
    record = gpu_record(device(), running, finished, 100.0, 0.6, CONFIG)
    assert (record.state, record.reasons, record.recent_misses) == (1, (), 0)
    assert record.float_time_s == math.inf and record.deadline_tasks == 0  # not reduced
    assert record.min_slack_s is None and record.running_tasks == 1
    exact = [task(70.0, 1.0, ended=75.0), task(80.0, 10.0, ended=81.0)]  # a miss, a hit
    beside = gpu_record(device(), running, finished + exact, 100.0, 0.6, CONFIG)
    assert beside.recent_misses == 1 and beside.float_time_s == pytest.approx(-4.0 + 9.0)


def test_an_open_burst_is_judged_when_it_ends_not_while_it_runs() -> None:
    late = task(90.0, 5.0, boundary=TaskBoundary.OPEN)  # 10 s so far: past its deadline
    record = gpu_record(device(), [late, task(98.0, 5.0)], [], 100.0, 0.0, CONFIG)
    assert record.state == 1 and record.recent_misses == 0
    assert record.float_time_s == pytest.approx(3.0)  # 0 for the open one, 3 s of slack
    assert record.min_slack_s == pytest.approx(0.0)
    ended = task(90.0, 5.0, ended=99.0)  # it ended exact: now it is a miss
    assert gpu_record(device(), [], [ended], 100.0, 0.0, CONFIG).state == 0


def test_tasks_without_a_kernel_are_not_judged() -> None:
    startup = task(90.0, 1.0, ended=90.0, boundary=TaskBoundary.NO_KERNEL)
    record = gpu_record(device(), [], [startup], 100.0, 0.0, CONFIG)
    assert record.deadline_tasks == 0 and record.float_time_s == math.inf


def test_memory_at_the_threshold_is_full() -> None:
    total = 100 * GIB
    assert gpu_record(device(94 * GIB, total), [], [], 1.0, 0.0, CONFIG).state == 1
    full = gpu_record(device(95 * GIB, total), [], [], 1.0, 0.0, CONFIG)
    assert full.reasons == (StateReason.MEMORY_FULL,)


def one_device(t: float, util: float, used: int = 0) -> GpuSample:
    return GpuSample(t, (device(used=used, util=util),))


def test_saturation_is_the_share_of_the_busy_window_not_one_sample() -> None:
    recorder = NodeRecorder("n", CONFIG)
    for i in range(40):  # 4 s of polls, idle
        recorder.update(i * 0.1, one_device(i * 0.1, 0.0), None, (), ())
    spike = recorder.update(4.0, one_device(4.0, 1.0), None, (), ())
    assert spike.gpus[0].state == 1  # one busy sample among idle ones: not "100%"
    for i in range(41, 100):  # busy from 4.1 s to 9.9 s: the 5 s window is all busy
        record = recorder.update(i * 0.1, one_device(i * 0.1, 1.0), None, (), ())
    assert record.gpus[0].busy_ratio == 1.0
    assert record.gpus[0].reasons == (StateReason.SATURATED,)
    assert record.state == 0


def _computing(cid: str) -> Joined:
    proc = AttributedProcess("0", 0, None, 7, 1, cid, GIB, 1.0)
    return Joined(processes=(proc,), usage=())


@pytest.mark.parametrize(
    ("klass", "managed", "state"),
    [
        (PriorityClass.BEST_EFFORT, True, 1),  # frozen for real-time work: the GPU is free
        (PriorityClass.BEST_EFFORT, False, 0),  # unmanaged: never frozen, the GPU stays busy
        (PriorityClass.NORMAL, True, 0),
    ],
)
def test_a_gpu_busy_only_with_managed_best_effort_work_is_not_saturated(
    klass: PriorityClass, managed: bool, state: int
) -> None:
    cid = "b" * 64
    info = ContainerInfo(cid, "trainer", "img", "running", managed=managed, class_label=klass)
    recorder = NodeRecorder("n", CONFIG)
    for i in range(60):  # 6 s of a training loop keeping the GPU at 100%
        record = recorder.update(
            i * 0.1, one_device(i * 0.1, 1.0), _computing(cid), (), (), {cid: info}
        )
    assert record.gpus[0].state == state


def test_a_node_is_in_state_1_while_one_of_its_gpus_is() -> None:
    full = device(24 * GIB, gpu=0)
    free = device(GIB, gpu=1)
    recorder = NodeRecorder("n", CONFIG)
    both = recorder.update(1.0, GpuSample(1.0, (full, free)), None, (), ())
    assert [g.state for g in both.gpus] == [0, 1]
    assert (both.state, both.reasons) == (1, ())
    assert both.memory_free_bytes == 23 * GIB
    only_full = recorder.update(2.0, GpuSample(2.0, (full,)), None, (), ())
    assert (only_full.state, only_full.reasons) == (0, (StateReason.MEMORY_FULL,))


def test_no_gpu_sample_means_state_0() -> None:
    record = NodeRecorder("n").update(1.0, None, None, (), ())
    assert (record.state, record.reasons, record.gpus) == (0, (StateReason.NO_GPU,), ())


@pytest.mark.parametrize(
    ("float_time", "expected"),
    [(12.345, 12.345), (-3.5, -3.5), (math.inf, math.inf), (1e12, math.inf)],
)
def test_compact_report_is_table_3s_16_bytes(float_time: float, expected: float) -> None:
    gpu = gpu_record(device(used=GIB), [], [], 1.0, 0.0, CONFIG)
    from dataclasses import replace

    record = NodeRecord("n", 1.0, (replace(gpu, float_time_s=float_time),))
    data = record.compact()
    assert len(data) == COMPACT_SIZE == 1 + 5 + 10
    back = decode_compact(data)
    assert back.state == 1
    assert back.float_time_s == pytest.approx(expected)
    assert back.memory_free_bytes == 23 * GIB
    with pytest.raises(ValueError):
        decode_compact(data[:-1])


def test_poller_publishes_the_record_as_metrics_and_state(tmp_path: Path) -> None:
    backend, _, poller = three_container_poller(tmp_path / "proc")
    backend.next = sample(0.9, {})  # seen before rt-1's task began: its start is real
    poller.poll_once()
    backend.next = sample(1.0, {100: GIB})  # began at 0.95
    poller.poll_once()
    backend.next = sample(1.1, {100: GIB}, sm={100: 0.5})
    snap = poller.poll_once()
    assert snap.record is not None
    [gpu] = snap.record.gpus
    assert gpu.deadline_tasks == 1  # rt-1's task, deadline 9 s
    assert gpu.float_time_s == pytest.approx(9.0 - 0.15)

    doc = state_json(snap)["node_record"]
    assert doc["node"] == "node-a" and doc["state"] == 1
    assert doc["gpus"][0]["float_time_s"] == pytest.approx(8.85)
    assert state_json(snap)["tasks"][0]["boundary"] == "open"
    assert bytes.fromhex(doc["compact"]) == snap.record.compact()

    text = TextRenderer().render(build_rows(snap)).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    g = (("GPU_I_ID", ""), ("UUID", "GPU-00000000"), ("gpu", "0"), ("node", "node-a"))
    assert samples[("gpuguard_gpu_state", g)] == 1
    assert samples[("gpuguard_gpu_float_time_seconds", g)] == pytest.approx(8.85)
    assert samples[("gpuguard_gpu_free_memory_bytes", g)] == 23 * GIB
    assert samples[("gpuguard_gpu_running_tasks", g)] == 1
    saturated = (*g, ("reason", "saturated"))
    assert samples[("gpuguard_gpu_state_reason", saturated)] == 0
    assert samples[("gpuguard_node_state", (("node", "node-a"),))] == 1


def test_unbounded_float_time_renders_as_plus_inf(tmp_path: Path) -> None:
    backend, _, poller = three_container_poller(tmp_path / "proc")
    backend.next = sample(1.0, {})
    snap = poller.poll_once()
    text = TextRenderer().render(build_rows(snap)).decode()
    gpu0 = 'node="node-a",gpu="0",UUID="GPU-00000000",GPU_I_ID=""'
    assert f"gpuguard_gpu_float_time_seconds{{{gpu0}}} +Inf\n" in text
    assert 'gpuguard_node_float_time_seconds{node="node-a"} +Inf\n' in text
    assert "inf\n" not in text
    assert state_json(snap)["node_record"]["float_time_s"] is None


def test_record_flags_are_validated_once() -> None:
    import argparse

    from gpuguard.exporter.config import add_flags, load_config
    from gpuguard.exporter.errors import ConfigError

    def config(*argv: str):
        parser = argparse.ArgumentParser()
        add_flags(parser)
        return load_config(parser.parse_args(list(argv)), env={})

    assert config().record == RecordConfig()
    got = config(
        "--record.window=1m",
        "--record.busy-window=2s",
        "--record.memory-threshold=0.9",
        "--record.miss-ratio=0",
    )
    assert got.record == RecordConfig(
        window_s=60.0, miss_ratio=0.0, busy_window_s=2.0, memory_threshold=0.9
    )
    for bad in (
        ("--record.busy-window=10m",),  # longer than the record window
        ("--record.miss-ratio=1",),
        ("--record.window=soon",),
        ("--record.busy-threshold=1.5",),
        ("--record.memory-threshold=nan",),
    ):
        with pytest.raises(ConfigError, match="--record"):
            config(*bad)
