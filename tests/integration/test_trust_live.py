"""Trust policies on a running exporter and the private engine (docs/security.md).

Without a flag the exporter applies its built-in default: it says so in its log and its
metrics, hostile label sets on real containers come out bounded (their state, read by the
actuator's own policy beside honest tenants, takes nothing from them: issue 26's property
through a live exporter), and a tenant's own misses leave the node record alone. With a
policy file, a container the policy trusts keeps its claim.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from exporter_support import ExporterProcess, sim_mounts
from gpusim_support import workload

from gpuguard import labels
from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.gpusim import GpusimService
from tests.support.stealing import (
    HONEST,
    SLO_LABELS,
    hostile_labels,
    taken,
    without_claims,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

POLICY = """
version: 1
default:
  classes: [normal, best-effort]
  min_deadline: 1s
rules:
  - match: {name: "trusted-*"}
    classes: [real-time, normal, best-effort]
    min_deadline: 10ms
"""
CLAIM = {"gpuguard.class": "real-time", "gpuguard.deadline": "0.0000000001ms"}
#: the issue's own, then drawn ones (seeded): each runs as a real container, with a twin
#: without its claims
ISSUE_SETS = [
    {labels.CLASS: "real-time", labels.MANAGED: "true"},
    {labels.DEADLINE: "0.0000000001ms", labels.TASK: "burst", labels.MANAGED: "true"},
    {labels.CLASS: "real-time", **SLO_LABELS["valid"], labels.MANAGED: "true"},
    {labels.ROLE: "exporter", labels.DEADLINE: "1ms", "io.kubernetes.pod.namespace": "inference-x"},
]
DRAWN = 8


@pytest.fixture
def containers(docker_client: Any, base_image: str) -> Iterator[Callable[..., Any]]:
    """Start ``sleep`` containers with labels; every one removed afterwards."""
    made: list[Any] = []

    def start(name: str, container_labels: dict[str, str]) -> Any:
        container = docker_client.containers.run(
            base_image, ["sleep", "120"], name=name, labels=container_labels, detach=True,
            network_mode="none",
        )  # fmt: skip
        made.append(container)
        return container

    yield start
    for container in made:
        container.remove(force=True)


def by_name(exporter: ExporterProcess, names: set[str]) -> dict[str, dict[str, Any]]:
    def found() -> dict[str, dict[str, Any]] | None:
        docs = {c["name"]: c for c in exporter.state()["containers"]}
        return docs if names <= set(docs) else None

    return wait_for(found, timeout=30, interval=0.1, what=f"{len(names)} containers")


def test_the_built_in_default_is_said_and_bounds_hostile_label_sets(
    exporter: ExporterProcess, containers: Callable[..., Any]
) -> None:
    log = exporter.process.log_path.read_text()
    assert "trust policy: built-in default (0 rules; tenants at large: classes normal" in log
    assert exporter.metric("gpuguard_exporter_trust_policy_info", policy="default") == 1
    rng = random.Random(26)
    hostile_sets = ISSUE_SETS + [hostile_labels(rng) for _ in range(DRAWN)]
    for name, honest_labels in HONEST.items():
        containers(f"trust-{name}", honest_labels)
    for i, hostile_set in enumerate(hostile_sets):
        containers(f"trust-h{i}", hostile_set)
        containers(f"trust-p{i}", without_claims(hostile_set))
    names = {f"trust-{n}" for n in HONEST} | {
        f"trust-{kind}{i}" for i in range(len(hostile_sets)) for kind in "hp"
    }
    docs = by_name(exporter, names)
    honest = {name: docs[f"trust-{name}"] for name in HONEST}
    for i, hostile_set in enumerate(hostile_sets):
        hostile, plain = docs[f"trust-h{i}"], docs[f"trust-p{i}"]
        assert hostile["class"] != "real-time" and hostile["slo"] is None, (hostile_set, hostile)
        assert hostile["deadline_s"] is None or hostile["deadline_s"] >= 1.0, hostile
        assert hostile["deadline_s"] is None or hostile["deadline_vouched"] is False, hostile
        assert taken(honest, hostile, plain) == [], (hostile_set, hostile)
    text = exporter.metrics_text()
    assert (
        'gpuguard_container_claim_rejected{node="itest",namespace="",pod="",container="trust-h0"'
        in text
    )
    assert (
        'gpuguard_container_deadline_vouched{node="itest",namespace="",pod="",container="trust-h1"'
        in text
    )


def test_a_tenants_own_misses_never_mark_the_node_by_default(
    exporter: ExporterProcess, sim: GpusimService, run_python_container: Callable[..., Any]
) -> None:
    """A one-shot of 2 s against a deadline of 1 ms (raised to 1 s): a miss on its own
    account, counted for it, never in the node record (under trust-all it is state 0:
    test_tasks_live)."""
    late = run_python_container(
        workload(sim, "own", "--work-seconds", "40", "--memory-bytes", "64MiB"),
        labels={labels.DEADLINE: "1ms", labels.TASK: "process", labels.MANAGED: "true"},
        extra_mounts=sim_mounts(sim), name="trust-own-misses",
    )  # fmt: skip
    assert late.wait(timeout=60)["StatusCode"] == 0, late.logs().decode()[-2000:]
    mine = {"container": "trust-own-misses"}
    wait_for(
        lambda: exporter.metric("gpuguard_container_deadline_misses_total", **mine) == 1,
        timeout=15, what="its own miss", interval=0.05,
    )  # fmt: skip

    def ended() -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        # the miss is counted as the task overruns; it is in "recent" once seen to end
        state = exporter.state()
        found = [t for t in state["recent"] if t["container"] == "trust-own-misses"]
        return (state, found) if found else None

    state, found = wait_for(ended, timeout=15, what="its task to end", interval=0.05)
    (task,) = found
    assert (task["deadline_s"], task["met_deadline"]) == (1.0, False)
    assert (state["node_record"]["state"], state["node_record"]["reasons"]) == (1, [])
    assert exporter.metric("gpuguard_container_deadline_vouched", **mine) == 0
    assert exporter.metric("gpuguard_gpu_recent_misses", gpu="0") == 0


@pytest.fixture
def policy_exporter(
    dockerd: PrivateDockerd, sim: GpusimService, tmp_path: Path
) -> Iterator[ExporterProcess]:
    path = tmp_path / "trust.yml"
    path.write_text(POLICY)
    process = ExporterProcess(tmp_path, dockerd.url, sim.socket, f"--trust.policy-file={path}")
    yield process.start()
    process.stop()


def test_claims_beyond_the_policy_are_rejected_counted_and_shown(
    policy_exporter: ExporterProcess, containers: Callable[..., Any], tmp_path: Path
) -> None:
    exporter = policy_exporter
    for name in ("tenant-claims", "trusted-server"):
        trusted = name.startswith("trusted")
        containers(name, {**CLAIM, "gpuguard.deadline": "50ms"} if trusted else CLAIM)
    found = by_name(exporter, {"tenant-claims", "trusted-server"})
    tenant, trusted = found["tenant-claims"], found["trusted-server"]
    assert (tenant["class"], tenant["deadline_s"]) == ("normal", 1.0)
    assert {r["label"] for r in tenant["claims_rejected"]} == {
        "gpuguard.class", "gpuguard.deadline",
    }  # fmt: skip
    assert (trusted["class"], trusted["deadline_s"], trusted["claims_rejected"]) == (
        "real-time", 0.05, [],
    )  # fmt: skip
    assert (tenant["deadline_vouched"], trusted["deadline_vouched"]) == (False, True)
    text = exporter.metrics_text()
    rejected = [
        line for line in text.splitlines()
        if line.startswith("gpuguard_container_claim_rejected{")
    ]  # fmt: skip
    assert len(rejected) == 2 and all('container="tenant-claims"' in r for r in rejected)
    policy = {"policy": "file", "file": str(tmp_path / "trust.yml")}
    assert exporter.metric("gpuguard_exporter_trust_policy_info", **policy) == 1


def test_a_managed_tenant_claiming_a_role_waits_its_turn_by_default(
    sim: GpusimService,
    dockerd: PrivateDockerd,
    docker_client: Any,
    exporter: ExporterProcess,
    run_python_container: Callable[..., Any],
    tmp_path: Path,
) -> None:
    # A tenant's own gpuguard.role=exporter once made it unpausable: arriving second, it
    # shared the GPU with the task it should have waited behind
    from test_actuator_live import ActuatorProcess, GuardProcess, paused

    state_dir = tmp_path / "actuator"
    guard = GuardProcess(state_dir, dockerd.url)
    actuator = ActuatorProcess(state_dir, exporter.url, dockerd.url, "--mode=fast")
    try:
        actuator.start()
        start_at = time.time() + 2.0
        made = {}
        for i, (name, extra) in enumerate(
            (("holder", {}), ("claimant", {labels.ROLE: "exporter"}))
        ):
            args = workload(sim, name, "--size", "19456", "--start-at", f"{start_at + 0.8 * i:.3f}")
            made[name] = run_python_container(
                args, labels={labels.MANAGED: "true", **extra}, extra_mounts=sim_mounts(sim),
                name=name,
            )  # fmt: skip
        wait_for(lambda: paused(docker_client, made["claimant"]), 20, "the claimant to wait")
        assert not paused(docker_client, made["holder"])
    finally:
        actuator.stop()
        guard.stop()
