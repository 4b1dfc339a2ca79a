from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuguard.contract import PriorityClass, TaskMode
from gpuguard.demo.stack.reference_collector import GpuguardCollector
from gpuguard.exporter.collector import TextRenderer, build_rows
from gpuguard.exporter.errors import BackendError
from gpuguard.exporter.model import DeviceSample, GpuSample
from gpuguard.exporter.state import state_json
from tests.unit.exporter_fakes import GIB, NO_POD, cid, container, sample, three_container_poller

# The fakes' GPU 0 on every per-GPU series, named as dcgm-exporter names it too
GPU0 = {"gpu": "0", "UUID": "GPU-00000000", "GPU_I_ID": ""}


@pytest.fixture
def setup(tmp_path: Path):
    backend, containers, poller = three_container_poller(tmp_path / "proc")
    registry = CollectorRegistry()
    registry.register(GpuguardCollector(lambda: poller.snapshot))
    return backend, containers, poller, registry


def test_register_touches_nothing() -> None:
    calls = []
    registry = CollectorRegistry()
    registry.register(GpuguardCollector(lambda: calls.append(1)))
    assert calls == []


def test_series_from_the_last_poll(setup) -> None:
    backend, _, poller, registry = setup
    backend.next = sample(0.9, {})  # the exporter sees the tasks begin
    poller.poll_once()
    backend.next = sample(1.0, {100: GIB, 200: 2 * GIB, 300: GIB}, sm={100: 0.5})
    poller.poll_once()
    backend.next = sample(1.1, {100: 3 * GIB, 200: 2 * GIB, 300: GIB}, sm={100: 0.5})
    poller.poll_once()
    v = registry.get_sample_value
    n = {"node": "node-a"}
    c1 = {**n, **NO_POD, "container": "rt-1", "container_id": cid(1)[:12]}
    c2 = {**n, **NO_POD, "container": "rt-2", "container_id": cid(2)[:12]}
    c3 = {**n, **NO_POD, "container": "bad", "container_id": cid(3)[:12]}
    info = {"uuid": "GPU-00000000", "name": "gpusim", "UUID": "GPU-00000000"}
    assert (
        v("gpuguard_gpu_info", {**n, "gpu": "0", **info, "GPU_I_ID": "", "GPU_I_PROFILE": ""}) == 1
    )
    assert v("gpuguard_gpu_memory_used_bytes", {**n, **GPU0}) == 6 * GIB
    assert v("gpuguard_container_managed", c3) == 0
    assert v("gpuguard_container_paused", c2) == 1
    assert v("gpuguard_container_deadline_seconds", c1) == 9.0
    assert v("gpuguard_container_deadline_seconds", c3) is None
    assert v("gpuguard_container_deadline_invalid", c3) == 1
    assert v("gpuguard_container_gpu_memory_bytes", {**c1, **GPU0}) == 3 * GIB
    assert v("gpuguard_container_gpu_sm_utilization_ratio", {**c1, **GPU0}) == 0.5
    assert v("gpuguard_container_gpu_processes", {**c2, **GPU0}) == 1
    assert v("gpuguard_container_task_phase", {**c1, **GPU0, "phase": "computing"}) == 1
    assert v("gpuguard_container_task_phase", {**c1, **GPU0, "phase": "input"}) == 0
    assert v("gpuguard_container_task_elapsed_seconds", {**c1, **GPU0}) == pytest.approx(0.15)
    assert v("gpuguard_container_task_slack_seconds", {**c1, **GPU0}) == pytest.approx(8.85)
    assert v("gpuguard_container_task_boundary", {**c1, **GPU0, "boundary": "open"}) == 1
    assert v("gpuguard_container_task_boundary", {**c1, **GPU0, "boundary": "exact"}) is None
    assert v("gpuguard_container_task_slack_seconds", {**c2, **GPU0}) is None
    assert v("gpuguard_tasks_waiting", {**n, **GPU0}) == 1
    assert v("gpuguard_unattributed_gpu_processes", {**n, **GPU0}) == 1
    assert v("gpuguard_exporter_polls_total", n) == 3
    assert v("gpuguard_exporter_collector_success", {**n, "source": "gpu"}) == 1
    assert v("gpuguard_exporter_build_info", {**n, "version": "0.1.0", "backend": "test"}) == 1
    assert v("gpuguard_task_run_seconds_count", {**n, **GPU0}) == 0
    backend.next = sample(1.2, {200: 2 * GIB, 300: GIB})
    poller.poll_once()
    assert v("gpuguard_container_tasks_finished_total", c1) == 1
    assert v("gpuguard_container_deadline_hits_total", c1) == 1
    assert v("gpuguard_container_busy_periods_total", c1) is None  # none yet: no series
    assert v("gpuguard_task_run_seconds_count", {**n, **GPU0}) == 1
    assert v("gpuguard_task_run_seconds_bucket", {**n, **GPU0, "le": "0.25"}) == 1


def test_busy_time_is_counted_apart_from_deadline_hits_and_misses(setup) -> None:
    # rt-1 (deadline 9 s) computes from the exporter's first poll: nobody saw it begin, so
    # its 12 s are busy time that may hold several requests, not one task's miss
    backend, _, poller, registry = setup
    for i in range(121):
        backend.next = sample(1.0 + i / 10, {100: GIB}, sm={100: 1.0})
        poller.poll_once()
    v = registry.get_sample_value
    c1 = {"node": "node-a", **NO_POD, "container": "rt-1", "container_id": cid(1)[:12]}
    merged = {**c1, **GPU0, "boundary": "merged"}
    assert v("gpuguard_container_task_boundary", merged) == 1
    assert v("gpuguard_container_task_slack_seconds", {**c1, **GPU0}) < 0
    backend.next = sample(13.2, {})
    poller.poll_once()
    assert v("gpuguard_container_task_boundary", merged) is None  # no running task
    assert v("gpuguard_container_busy_periods_total", c1) == 1
    assert v("gpuguard_container_busy_seconds_total", c1) == pytest.approx(12.1, abs=0.2)
    for counter in ("tasks_finished", "deadline_hits", "deadline_misses"):
        assert v(f"gpuguard_container_{counter}_total", c1) == 0
    assert v("gpuguard_task_run_seconds_count", {"node": "node-a", **GPU0}) == 0


def test_removed_container_leaves_no_series(setup) -> None:
    backend, containers, poller, registry = setup
    backend.next = sample(1.0, {100: GIB})
    poller.poll_once()
    backend.next = sample(1.1, {})
    poller.poll_once()
    containers.set(container(2, "rt-2"), container(3, "bad"))
    poller.poll_once()
    text = generate_latest(registry).decode()
    assert cid(1)[:12] not in text and 'container="rt-1"' not in text
    assert 'container="rt-2"' in text


def test_failing_gpu_backend_keeps_tasks_and_answers(setup) -> None:
    backend, _, poller, registry = setup
    backend.next = sample(1.0, {100: GIB})
    poller.poll_once()
    backend.next = BackendError("gpusim at /x: cannot connect")
    snap = poller.poll_once()
    v = registry.get_sample_value
    assert v("gpuguard_exporter_collector_success", {"node": "node-a", "source": "gpu"}) == 0
    assert v("gpuguard_exporter_errors_total", {"node": "node-a", "source": "gpu"}) == 1
    assert v("gpuguard_gpu_info", {"node": "node-a", "gpu": "0", "uuid": "GPU-00000000",
                                   "name": "gpusim", "UUID": "GPU-00000000", "GPU_I_ID": "",
                                   "GPU_I_PROFILE": ""}) is None  # fmt: skip
    assert [t.pid for t in snap.tasks] == [100]  # not ended because a sample is missing
    assert poller.health() is None  # it did sample once
    assert poller.degraded() == "degraded: gpu source failing: gpusim at /x: cannot connect"


def test_a_docker_source_that_fails_is_said_not_hidden(setup) -> None:
    backend, containers, poller, registry = setup
    backend.next = sample(1.0, {100: GIB})
    poller.poll_once()
    assert poller.degraded() is None
    containers.connected = False
    containers.last_error = "Error while fetching server API version: Permission denied"
    poller.poll_once()
    v = registry.get_sample_value
    assert v("gpuguard_exporter_collector_success", {"node": "node-a", "source": "docker"}) == 0
    assert poller.health() is None  # still serving: a restart would not mend the socket
    detail = poller.degraded()
    assert detail is not None and detail.startswith("degraded: docker source failing")
    assert "Permission denied" in detail


def test_the_source_followed_is_the_one_named(setup) -> None:
    backend, containers, poller, registry = setup
    containers.ENGINE = "containerd"  # the exporter follows containerd on a Kubernetes node
    backend.next = sample(1.0, {100: GIB})
    poller.poll_once()
    v = registry.get_sample_value
    node = {"node": "node-a"}
    assert v("gpuguard_exporter_collector_success", {**node, "source": "containerd"}) == 1
    assert v("gpuguard_exporter_errors_total", {**node, "source": "containerd"}) == 0
    assert v("gpuguard_exporter_collector_success", {**node, "source": "docker"}) is None
    containers.connected, containers.last_error = False, "ctr: connection refused"
    containers.errors = 1
    poller.poll_once()
    assert v("gpuguard_exporter_collector_success", {**node, "source": "containerd"}) == 0
    assert v("gpuguard_exporter_errors_total", {**node, "source": "containerd"}) == 1
    assert poller.degraded() == (
        "degraded: containerd source failing: not connected to containerd (ctr: connection refused)"
    )
    assert state_json(poller.snapshot)["sources"] == {
        "gpu": True, "containerd": False, "procfs": True,
    }  # fmt: skip


def test_text_renderer_matches_the_collector(setup) -> None:
    backend, _, poller, registry = setup
    backend.next = sample(1.0, {100: GIB, 200: GIB, 300: GIB}, sm={100: 0.25})
    poller.poll_once()
    backend.next = sample(1.3, {200: GIB, 300: GIB})
    poller.poll_once()
    fast = TextRenderer().render(build_rows(poller.snapshot)).decode()

    def samples(text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
        return {
            (s.name, tuple(sorted(s.labels.items())), s.value)
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        }

    reference = generate_latest(registry).decode()
    assert samples(fast) == samples(reference)
    assert fast.count("# TYPE") == reference.count("# TYPE")


def test_text_renderer_renders_identity_again_when_the_index_changes(setup) -> None:
    # /metrics keeps the text of what each container is until the container index changes
    backend, containers, poller, _ = setup
    renderer = TextRenderer()

    def scrape(t: float) -> str:
        backend.next = sample(t, {100: GIB})
        poller.poll_once()
        body = renderer.render_snapshot(poller.snapshot).decode()
        assert body == TextRenderer().render(build_rows(poller.snapshot)).decode()
        return body

    labels = f'node="node-a",namespace="",pod="",container="rt-1",container_id="{cid(1)[:12]}"'
    assert f"gpuguard_container_paused{{{labels}}} 0.0" in scrape(1.0)
    assert f"gpuguard_container_paused{{{labels}}} 0.0" in scrape(1.1)  # the kept text
    containers.set(container(1, "rt-1", state="paused"), container(2), container(3))
    assert f"gpuguard_container_paused{{{labels}}} 1.0" in scrape(1.2)
    containers.set(container(1, "rt-1", deadline_s=4.0), container(2), container(3))
    body = scrape(1.3)
    assert f"gpuguard_container_paused{{{labels}}} 0.0" in body
    assert f"gpuguard_container_deadline_seconds{{{labels}}} 4.0" in body


def test_label_values_are_escaped() -> None:
    from gpuguard.exporter.collector import _escape_label

    assert _escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


def test_no_poll_yet_renders_headers_only() -> None:
    text = TextRenderer().render(build_rows(None)).decode()
    assert "# TYPE gpuguard_exporter_polls_total counter" in text
    assert "{" not in text


def test_task_mode_class_invalid_labels_and_demand(setup) -> None:
    backend, containers, poller, registry = setup
    invalid = replace(
        container(3, "bad"), task_mode_error="invalid gpuguard.task 'x'", class_error="bad"
    )
    best_effort = container(2, "train", class_label=PriorityClass.BEST_EFFORT)
    containers.set(container(1, "rt-1", deadline_s=9.0, task_mode=TaskMode.MEMORY), best_effort,
                   invalid)  # fmt: skip
    for t in (1.0, 1.1):  # the first sample began its run; the second is a whole period
        backend.next = sample(t, {100: GIB}, sm={100: 0.4})
        poller.poll_once()
    backend.next = sample(1.2, {})
    poller.poll_once()
    v = registry.get_sample_value
    n = {"node": "node-a"}
    c1 = {**n, **NO_POD, "container": "rt-1", "container_id": cid(1)[:12]}
    c2 = {**n, **NO_POD, "container": "train", "container_id": cid(2)[:12]}
    c3 = {**n, **NO_POD, "container": "bad", "container_id": cid(3)[:12]}
    assert v("gpuguard_container_task_info", {**c1, "task_mode": "memory", "class": "real-time"})
    assert v("gpuguard_container_task_info", {**c2, "task_mode": "burst", "class": "best-effort"})
    assert v("gpuguard_container_task_info", {**c3, "task_mode": "burst", "class": "normal"})
    assert v("gpuguard_container_label_invalid", {**c3, "label": "gpuguard.task"}) == 1
    assert v("gpuguard_container_label_invalid", {**c3, "label": "gpuguard.class"}) == 1
    assert v("gpuguard_container_label_invalid", {**c1, "label": "gpuguard.task"}) is None
    assert v("gpuguard_container_demand_sm_ratio", c1) == pytest.approx(0.4)
    assert v("gpuguard_container_demand_sm_ratio", c2) is None


def test_label_cache_stays_bounded_with_container_churn(tmp_path: Path) -> None:
    # Containers come and go: the label text of removed ones must not stay behind.
    backend, containers, poller = three_container_poller(tmp_path / "proc")
    backend.next = sample(1.0)
    renderer = TextRenderer()
    sizes = []
    for round_ in range(300):
        containers.set(*(container(1000 + 10 * round_ + k) for k in range(10)))
        poller.poll_once()
        body = renderer.render_snapshot(poller.snapshot)
        assert f"rt-{1000 + 10 * round_}" in body.decode()
        sizes.append(len(renderer.cache))
    # It may grow to a few times the live label sets before it trims, but no further.
    assert sizes[0] > 20  # two label sets per container, plus the node's and the GPU's
    assert max(sizes[-100:]) <= max(sizes[:100]) <= 20 * sizes[0], (sizes[0], max(sizes))


def test_mig_instances_carry_dcgm_exporters_labels_and_count_memory_once(setup) -> None:
    """Each MIG instance joins dcgm-exporter's series on (UUID, GPU_I_ID); the parent's
    memory is its instances', so only they report it."""
    backend, _, poller, registry = setup

    def device(mig: int | None, total: int, used: int, uuid: str, name: str) -> DeviceSample:
        return DeviceSample(
            index=0, uuid=uuid, name=name, memory_total_bytes=total, memory_used_bytes=used,
            utilization_ratio=None, mig_index=mig, gpu_instance_id=None if mig is None else mig + 7,
        )  # fmt: skip

    backend.next = GpuSample(
        timestamp=1.0,
        devices=(
            device(None, 80 * GIB, 30 * GIB, "GPU-p", "NVIDIA A100 80GB"),
            device(0, 40 * GIB, 10 * GIB, "MIG-a", "NVIDIA A100 80GB MIG 3g.40gb"),
            device(1, 40 * GIB, 20 * GIB, "MIG-b", "NVIDIA A100 80GB MIG 3g.40gb"),
        ),
    )
    poller.poll_once()
    v = registry.get_sample_value
    n = {"node": "node-a"}
    assert v("gpuguard_gpu_info", {**n, "gpu": "0:1", "uuid": "MIG-b",
             "name": "NVIDIA A100 80GB MIG 3g.40gb", "UUID": "GPU-p", "GPU_I_ID": "8",
             "GPU_I_PROFILE": "3g.40gb"}) == 1  # fmt: skip
    assert v("gpuguard_gpu_info", {**n, "gpu": "0", "uuid": "GPU-p", "name": "NVIDIA A100 80GB",
             "UUID": "GPU-p", "GPU_I_ID": "", "GPU_I_PROFILE": ""}) == 1  # fmt: skip
    parent = {**n, "gpu": "0", "UUID": "GPU-p", "GPU_I_ID": ""}
    assert v("gpuguard_gpu_memory_total_bytes", parent) is None
    assert v("gpuguard_gpu_memory_used_bytes", parent) is None
    totals = [
        v("gpuguard_gpu_memory_total_bytes", {**n, "gpu": g, "UUID": "GPU-p", "GPU_I_ID": i})
        for g, i in (("0:0", "7"), ("0:1", "8"))
    ]
    assert totals == [40 * GIB, 40 * GIB]


def test_mig_profile_comes_from_the_mig_device_name() -> None:
    def named(name: str, mig: int | None) -> DeviceSample:
        return DeviceSample(0, "u", name, 1, 0, None, mig_index=mig)

    assert named("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 0).mig_profile == "1g.10gb"
    assert named("sim0 MIG 3g.40gb", 2).mig_profile == "3g.40gb"
    assert named("NVIDIA H100 80GB HBM3", None).mig_profile is None
    assert named("odd name", 1).mig_profile is None


def test_claims_the_trust_policy_rejected_are_counted(setup) -> None:
    backend, containers, poller, registry = setup
    why = (("gpuguard.class", "real-time is not allowed"), ("gpuguard.deadline", "too short"))
    tenant = replace(container(1, "tenant", class_label=PriorityClass.NORMAL), claims_rejected=why)
    containers.set(tenant, container(2, "honest"))
    backend.next = sample(1.0, {})
    poller.poll_once()
    v = registry.get_sample_value
    c1 = {"node": "node-a", **NO_POD, "container": "tenant", "container_id": cid(1)[:12]}
    c2 = {"node": "node-a", **NO_POD, "container": "honest", "container_id": cid(2)[:12]}
    for label, _ in why:
        assert v("gpuguard_container_claim_rejected", {**c1, "label": label}) == 1
    assert v("gpuguard_container_claim_rejected", {**c2, "label": "gpuguard.class"}) is None


def test_whose_deadline_counts_toward_the_node_and_which_policy_is_in_force(setup) -> None:
    backend, containers, poller, registry = setup
    own = replace(container(1, "tenant", deadline_s=1.0), deadline_vouched=False)
    containers.set(own, container(2, "vouched", deadline_s=9.0), container(3, "none"))
    backend.next = sample(1.0, {})
    poller.trust_policy = ("file", "/etc/gpuguard/trust.yml")
    poller.poll_once()
    v = registry.get_sample_value

    def labels(i: int, name: str) -> dict[str, str]:
        return {"node": "node-a", **NO_POD, "container": name, "container_id": cid(i)[:12]}

    assert v("gpuguard_container_deadline_vouched", labels(1, "tenant")) == 0
    assert v("gpuguard_container_deadline_vouched", labels(2, "vouched")) == 1
    assert v("gpuguard_container_deadline_vouched", labels(3, "none")) is None  # no deadline
    policy = {"node": "node-a", "policy": "file", "file": "/etc/gpuguard/trust.yml"}
    assert v("gpuguard_exporter_trust_policy_info", policy) == 1


def test_a_containers_labels_are_kept_while_it_is_the_same_and_remade_when_it_changes() -> None:
    from gpuguard.exporter.collector import _C, LabelCache

    cache = LabelCache()
    info = container(1)
    first = cache.of(_C, info, lambda: ("n", "", "", info.name, info.short_id))
    assert first.text.startswith('node="n",namespace="",pod="",container="rt-1",container_id=')

    def never() -> tuple[str, ...]:
        raise AssertionError("made again for the same container")

    assert cache.of(_C, info, never) is first
    renamed = replace(info, name="rt-1b")  # a new ContainerInfo: the index saw a change
    again = cache.of(_C, renamed, lambda: ("n", "", "", renamed.name, renamed.short_id))
    assert again.values[3] == "rt-1b"
    # one container on two GPUs: a label set each
    on_0 = cache.of(_C, info, lambda: ("n", "", "", "x", "0"), "0", ("", ""))
    assert on_0 is not first and on_0.values[3] == "x"
