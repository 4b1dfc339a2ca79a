from __future__ import annotations

import pytest

from gpuguard.exporter.join import join
from gpuguard.exporter.model import (
    DeviceSample,
    GpuProcess,
    GpuSample,
    ProcessOwner,
    ProcessUtilization,
)
from tests.unit.exporter_fakes import GIB, cid, container, sample


def test_processes_attributed_to_their_containers() -> None:
    s = sample(10.0, {100: GIB, 200: 2 * GIB, 300: GIB}, sm={100: 0.5, 200: 0.25})
    owners = {
        100: ProcessOwner(cid(1), 11),
        200: ProcessOwner(cid(1), 22),
        300: ProcessOwner(None, 33),
    }
    joined = join(s, owners, {cid(1): container(1)})
    by_pid = {p.pid: p for p in joined.processes}
    assert by_pid[100].container_id == cid(1) and by_pid[100].start_ticks == 11
    assert by_pid[300].container_id is None
    assert by_pid[300].sm_ratio is None  # no sample this poll
    (usage,) = joined.usage
    assert (usage.container_id, usage.gpu, usage.processes) == (cid(1), "0", 2)
    assert usage.memory_bytes == 3 * GIB
    assert usage.sm_ratio == 0.75
    assert joined.unattributed == {"0": 1}
    assert joined.device_sm_ratio == {"0": 0.75}


def test_unknown_container_counts_as_unattributed_but_keeps_its_id() -> None:
    joined = join(sample(1.0, {5: GIB}), {5: ProcessOwner(cid(9), 1)}, {})
    assert joined.processes[0].container_id == cid(9)
    assert joined.usage == ()
    assert joined.unattributed == {"0": 1}


def test_vanished_process_and_unknown_memory() -> None:
    joined = join(sample(1.0, {5: None}), {5: None}, {})
    (proc,) = joined.processes
    assert proc.container_id is None and proc.start_ticks == 0
    assert proc.used_memory_bytes is None


def test_sm_is_the_mean_of_a_pids_samples_and_devices_are_separate() -> None:
    dev0 = DeviceSample(
        0, "GPU-0", "g", 10, 1, 1.0, (GpuProcess(1, 1),),
        (ProcessUtilization(1, 1, 0.2, 0), ProcessUtilization(1, 2, 0.4, 0)),
    )  # fmt: skip
    dev1 = DeviceSample(1, "GPU-1", "g", 10, 1, 0.0, (GpuProcess(1, 1),), (), mig_index=None)
    mig = DeviceSample(2, "MIG-x", "g", 10, 1, None, (GpuProcess(2, 1),), (), mig_index=3)
    owners = {1: ProcessOwner(cid(1), 1), 2: ProcessOwner(cid(1), 2)}
    joined = join(GpuSample(1.0, (dev0, dev1, mig)), owners, {cid(1): container(1)})
    usage = {(u.gpu, u.container_id): u for u in joined.usage}
    assert usage[("0", cid(1))].sm_ratio == pytest.approx(0.3)
    assert usage[("1", cid(1))].sm_ratio == 0.0
    assert ("2:3", cid(1)) in usage
    assert [p.gpu for p in joined.processes] == ["0", "1", "2:3"]
