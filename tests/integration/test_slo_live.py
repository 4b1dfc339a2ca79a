"""A tenant's own latency SLO drives the actuator, end to end and for real.

gpusim's ``server`` exports its request latency as vLLM's ``vllm:e2e_request_latency_seconds``
histogram; its container declares the SLO by label (``gpuguard.slo.*``) and runs on the host
network so that the stack's Prometheus, which discovers it through Docker
(``docker_sd_configs``, job ``gpuguard-tenants``), scrapes it on loopback. A managed
best-effort ``train`` container shares the GPU. Its kernels double the server's latency
(solo about 33 ms, shared about 67 ms: over the 50 ms target). The exporter runs without
the launch probe (a host where it cannot attach): NVML samples a request only after it has
ended, so nothing but the SLO can say the server suffers. The SLO rules see the misses,
``GpuguardSloAtRisk`` fires through Alertmanager, and the actuator runs the trainer by its
device's duty cycle because of it (reason ``duty_cycle``), between requests too. A server
whose SLO fails with nothing beside it to freeze marks its node instead.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuguard import labels
from gpuguard.actuator.audit import read_audit
from gpuguard.actuator.engine.freezer import THAWED, ContainerFreezer
from gpuguard.demo.stack.localstack import LocalStack, NodeStack
from gpuguard.demo.stack.process import free_port
from gpuguard.gpusim.workload.latency_metrics import E2E_LATENCY
from tests.dashboards import load_dashboards, panel_queries
from tests.integration.stack_support import with_alerting, workload
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

SERVER, TRAINER = "slo-server", "slo-trainer"
OBJECTIVE = 0.9
# Long enough for the test; every container is removed at its end anyway.
RUN_S = "150"


@pytest.fixture(scope="module")
def stack(short_tmp: Path) -> Iterator[LocalStack]:
    """One node (actuator in its default mode: fast path and webhooks), Prometheus with the
    tenants' job on the node's engine, Alertmanager routing to the actuator."""
    # NVML only: with the launch probe the trainer is frozen on each request's edges and
    # the SLO holds (test_realtime_bench.py, bench/edgefreeze.py)
    stack = LocalStack(
        short_tmp / "slo", ["slo-node"], time_scale=0.1, default_ports=False,
        exporter_flags=["--probe.launch=off"],
    )  # fmt: skip
    yield from with_alerting(stack)


def _paused(client: Any, container: Any) -> bool:
    """Held: Docker shows it paused, or its cgroup is frozen (a best-effort freeze for a
    duty cycle is told to Docker only once it has lasted ``HANDOVER_AFTER_S``)."""
    info = client.api.inspect_container(container.id)["State"]
    if info["Paused"]:
        return True
    return ContainerFreezer().cgroup(container.id, info["Pid"]).state() != THAWED


def _paused_share(client: Any, container: Any, seconds: float) -> float:
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(_paused(client, container))
        time.sleep(0.1)
    return sum(samples) / len(samples)


def test_a_failing_slo_freezes_the_best_effort_neighbour(
    stack: LocalStack, record_property: Any
) -> None:
    node = stack.nodes[0]
    prometheus = stack.prometheus
    assert prometheus is not None
    client = node.client()
    made: list[Any] = []
    port = free_port()
    try:
        server = workload(
            node,
            client,
            SERVER,
            {
                labels.CLASS: "real-time",
                labels.SLO_METRIC: E2E_LATENCY,
                labels.SLO_TARGET: "50ms",
                labels.SLO_OBJECTIVE: str(OBJECTIVE),
                labels.SLO_PORT: str(port),
            },
            ["server", "--arrivals", "fixed", "--rate", "4", "--duration", RUN_S,
             "--request-work", "0.3", "--metrics-port", str(port)],
        )  # fmt: skip
        made.append(server)
        trainer = workload(
            node,
            client,
            TRAINER,
            {labels.MANAGED: "true", labels.CLASS: "best-effort"},
            ["train", "--duration", RUN_S, "--step-work", "0.5", "--kernels", "4",
             "--sync-every", "5"],
        )  # fmt: skip
        made.append(trainer)
        started = time.monotonic()

        # Discovered through Docker, scraped on loopback, joined to the exporter's series.
        up = f'up{{job="gpuguard-tenants",container="{SERVER}"}}'
        wait_for(lambda: prometheus.query_value(up) == 1.0, 30, "the server's scrape target")
        attainment = f'gpuguard:container_gpu_slo_attainment_ratio:1m{{container="{SERVER}"}}'

        def failing() -> list[dict[str, Any]]:
            result = prometheus.query(attainment)
            return [r for r in result if float(r["value"][1]) < OBJECTIVE]

        [series] = wait_for(failing, 40, "the SLO attainment below its objective", interval=0.5)
        assert series["metric"]["gpu"] == "0" and series["metric"]["node"] == "slo-node"
        assert series["metric"]["container_id"] == server.id[:12]
        record_property("attainment_before", series["value"][1])
        flapping = _paused_share(client, trainer, 2.0)  # per-task freezing only, so far
        record_property("trainer_paused_share_before", round(flapping, 2))
        thawed_idle = [
            r
            for r in read_audit(node.state_dir / "audit.jsonl")
            if r.get("container") == TRAINER and r.get("reason") == "realtime_idle"
        ]
        record_property("trainer_thaws_between_requests_before", len(thawed_idle))

        # GpuguardSloAtRisk -> Alertmanager -> protect_slo: the trainer is frozen for it.
        audit = node.state_dir / "audit.jsonl"

        def pressure() -> list[dict[str, Any]]:
            return [r for r in read_audit(audit) if r.get("event") == "slo_pressure"]

        [first, *_] = wait_for(pressure, 45, "the SLO alert at the actuator", interval=0.3)
        assert first["alerts"][0]["container"] == SERVER
        assert first["alerts"][0]["device"] == [0, None]
        record_property("slo_pressure_after_s", round(time.monotonic() - started, 1))
        alerts = [
            a
            for a in prometheus.alerts()
            if a["labels"]["alertname"] == "GpuguardSloAtRisk" and a["state"] == "firing"
        ]
        assert [a["labels"]["container"] for a in alerts] == [SERVER]
        assert alerts[0]["labels"]["gpu"] == "0"

        # Frozen through the server's idle gaps too, not only while a request runs: the duty
        # cycle's run part (its fraction, at most --besteffort.initial while the SLO fails)
        held = _paused_share(client, trainer, 3.0)
        record_property("trainer_paused_share_protected", round(held, 2))
        assert held >= 0.75, f"trainer paused {held:.0%} of the time under SLO pressure"

        def trainer_actions() -> list[dict[str, Any]]:
            return [
                r
                for r in read_audit(audit)
                if r.get("event") == "action"
                and r.get("container") == TRAINER
                and r["ts"] > first["ts"]
            ]

        def refrozen_for_the_slo() -> bool:
            return any(
                r["action"] == "pause" and r["reason"] == "duty_cycle" for r in trainer_actions()
            )

        wait_for(refrozen_for_the_slo, 20, "a freeze of its cycle after its run", interval=0.3)
        thaws = {r["reason"] for r in trainer_actions() if r["action"] == "unpause"}
        assert thaws <= {"duty_cycle"}, thaws  # never realtime_idle between requests
        reasons = requests.get(node.actuator_url + "/api/v1/nodes", timeout=5).json()
        marks = {r["alertname"] for r in reasons["nodes"][0]["reasons"]}
        assert not marks & {"GpuguardSloAtRisk", "GpuguardSloViolated"}  # it could freeze

        # The tasks dashboard's SLO panel has data (tests/dashboards.py: MAY_BE_EMPTY).
        board = load_dashboards()["gpuguard-tasks"]
        for uid, title, expr in panel_queries(board):
            if title == "Latency SLO attainment":
                result = prometheus.query(expr)
                assert [r["metric"]["container"] for r in result] == [SERVER], (uid, expr)

        # The server goes: nothing is under pressure any more, the trainer runs again.
        server.remove(force=True)
        wait_for(lambda: not _paused(client, trainer), 20, "the trainer thawed", interval=0.2)
        record_property("test_s", round(time.monotonic() - started, 1))
    finally:
        for container in made:
            try:
                container.remove(force=True)
            except Exception:  # removed above
                pass
        client.close()


def _slo_marks(node: NodeStack) -> set[str]:
    doc = requests.get(node.actuator_url + "/api/v1/nodes", timeout=5).json()
    return {r["alertname"] for r in doc["nodes"][0]["reasons"]} & {
        "GpuguardSloAtRisk",
        "GpuguardSloViolated",
    }


def test_a_failing_slo_with_nothing_to_freeze_marks_the_node(stack: LocalStack) -> None:
    """Alone on its GPU with a target below what it does alone (33 ms against 25 ms):
    freezing cannot help, so new real-time containers should go elsewhere."""
    node = stack.nodes[0]
    client = node.client()
    port = free_port()
    server = None
    try:
        server = workload(
            node,
            client,
            "slo-alone",
            {
                labels.CLASS: "real-time",
                labels.SLO_METRIC: E2E_LATENCY,
                labels.SLO_TARGET: "25ms",
                labels.SLO_PORT: str(port),
            },
            ["server", "--arrivals", "fixed", "--rate", "4", "--duration", RUN_S,
             "--request-work", "0.3", "--metrics-port", str(port)],
        )  # fmt: skip
        wait_for(lambda: _slo_marks(node), 60, "the node marked for the SLO", interval=0.3)
        server.remove(force=True)
        server = None
        # its series go stale, the alert resolves, the mark goes with it
        wait_for(lambda: not _slo_marks(node), 45, "the SLO mark gone", interval=0.3)
    finally:
        if server is not None:
            server.remove(force=True)
        client.close()
