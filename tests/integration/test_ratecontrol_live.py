"""Best-effort under rate control, end to end and for real (real-time work seen by NVML only).

A real-time server with a latency SLO (gpusim's ``server``, vLLM's histogram on its
``--metrics-port``, scraped by the stack's Prometheus as ``test_slo_live.py`` does) shares
gpusim with a managed best-effort trainer. The actuator polls Prometheus for the server's
10 s attainment (``gpuguard:container_gpu_slo_attainment_ratio:10s``) and runs the trainer
by a duty cycle. It starts at a run fraction of 0.8, where the trainer's kernels stretch
most requests past the target: the SLO suffers, the fraction falls; and however it falls,
the trainer runs in every period (the floor), so no freeze lasts a whole period.

Without an SLO the fraction follows the trainer's measured demand (the interference law):
a data-loader-bound trainer that uses about a fifth of the device runs well above the floor
beside a real-time server, at the fraction its demand allows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuguard import labels
from gpuguard.actuator.admission.ratecontrol import interference_fraction
from gpuguard.actuator.audit import read_audit
from gpuguard.actuator.decision import RateLaw
from gpuguard.demo.stack.localstack import LocalStack
from gpuguard.demo.stack.process import free_port
from gpuguard.gpusim.workload.latency_metrics import E2E_LATENCY
from tests.integration.stack_support import with_alerting, workload
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

SERVER, TRAINER = "rc-server", "rc-trainer"
PERIOD_S, FLOOR, INITIAL = 1.0, 0.2, 0.8
RUN_S = "150"


@pytest.fixture(scope="module")
def stack(short_tmp: Path) -> Iterator[LocalStack]:
    """One node whose actuator runs rate control against the stack's Prometheus."""
    flags = [
        "--policy.best-effort-control=rate",
        f"--besteffort.period={PERIOD_S:g}s",
        f"--besteffort.floor={FLOOR}",
        f"--besteffort.initial={INITIAL}",
        "--besteffort.max-step=0.5",  # two steps from the start to the floor, not four
    ]
    # NVML only (a host where the launch probe cannot attach): rate control's domain; with
    # the probe the trainer follows the server's edges instead (test_tasks_live.py)
    stack = LocalStack(
        short_tmp / "rate", ["rc-node"], time_scale=0.1, default_ports=False,
        actuator_flags=flags, exporter_flags=["--probe.launch=off"],
    )  # fmt: skip
    yield from with_alerting(stack)


def _frozen_spans(audit: Path, since: float, name: str = TRAINER) -> list[tuple[float, float]]:
    """A trainer's freezes by its duty cycle, from the audit log: (frozen at, its thaw
    asked at; the runtime's unpause after that is a loaded machine's, not the law's)."""
    spans, frozen_at = [], None
    for record in read_audit(audit):
        if record.get("event") != "action" or record.get("container") != name:
            continue
        if record.get("result") != "ok" or record["ts"] < since:
            continue
        if record["action"] == "pause":
            frozen_at = float(record.get("frozen") or record["finished"])
        elif frozen_at is not None:
            spans.append((frozen_at, float(record["started"])))
            frozen_at = None
    return spans


def test_the_run_fraction_falls_while_the_slo_suffers_and_never_below_the_floor(
    stack: LocalStack, record_property: Any
) -> None:
    node = stack.nodes[0]
    prometheus = stack.prometheus
    assert prometheus is not None
    client = node.client()
    made: list[Any] = []
    port = free_port()
    audit = node.state_dir / "audit.jsonl"
    try:
        # 300 ms requests twice a second, target 500 ms: met alone, missed beside the
        # trainer's kernels when it runs through most of a request
        made.append(
            workload(
                node, client, SERVER,
                {labels.CLASS: "real-time", labels.SLO_METRIC: E2E_LATENCY,
                 labels.SLO_TARGET: "500ms", labels.SLO_OBJECTIVE: "0.9",
                 labels.SLO_PORT: str(port)},
                ["server", "--arrivals", "fixed", "--rate", "2", "--duration", RUN_S,
                 "--request-work", "3.0", "--kernels", "6", "--metrics-port", str(port)],
            )
        )  # fmt: skip
        # the signal first (a device that declares an SLO and has no reading yet is stale:
        # its fraction would go to the floor at once, before the SLO could suffer)
        signal = f'gpuguard:container_gpu_slo_attainment_ratio:10s{{container="{SERVER}"}}'
        [alone] = wait_for(lambda: prometheus.query(signal), 45, "the server's 10 s attainment")
        record_property("attainment_alone", alone["value"][1])
        made.append(
            workload(
                node, client, TRAINER, {labels.MANAGED: "true", labels.CLASS: "best-effort"},
                ["train", "--duration", RUN_S, "--step-work", "0.5", "--kernels", "4",
                 "--sync-every", "5"],
            )
        )  # fmt: skip
        started = time.time()
        fraction = 'gpuguard_actuator_besteffort_run_fraction{gpu="0"}'

        def fallen() -> float | None:
            value = prometheus.query_value(fraction)
            return value if value is not None and value < INITIAL else None

        low = wait_for(fallen, 60, "the run fraction below its start", interval=0.5)
        record_property("attainment_shared", prometheus.query(signal)[0]["value"][1])
        record_property("run_fraction_after_s", round(time.time() - started, 1))
        steps = [r for r in read_audit(audit) if r.get("event") == "run_fraction"]
        assert any(r["step"] == "down" for r in steps), steps
        assert all(r["run_fraction"] >= FLOOR for r in steps)
        record_property("run_fraction_low", low)
        queries = 'gpuguard_actuator_slo_queries_total{result="ok"}'
        assert (prometheus.query_value(queries) or 0) > 0

        # the floor: the trainer is thawed in every period, however bad the SLO
        time.sleep(8)
        spans = _frozen_spans(audit, started)
        assert len(spans) >= 5, spans
        longest = max(end - begin for begin, end in spans)
        record_property("longest_freeze_s", round(longest, 3))
        record_property("freezes", len(spans))
        # (1 - floor) of a period and a decision's lateness on a busy machine; a period
        # without its thaw would make one (1 - floor) + 1 periods long
        assert longest < (1 - FLOOR) * PERIOD_S + 0.3, spans
        reasons = {
            r.get("reason")
            for r in read_audit(audit)
            if r.get("container") == TRAINER and r.get("event") == "action"
        }
        assert reasons <= {"duty_cycle", "realtime_idle"}, reasons
    finally:
        for container in made:
            container.remove(force=True)
        client.close()


def test_without_an_slo_a_light_trainer_runs_the_fraction_its_measured_demand_allows(
    stack: LocalStack, record_property: Any
) -> None:
    node = stack.nodes[0]
    client = node.client()
    made: list[Any] = []
    audit = node.state_dir / "audit.jsonl"
    law = RateLaw(floor=FLOOR, initial=INITIAL)  # the stack's bound is the default, 1.05
    try:
        # a real-time server with no SLO: 300 ms requests once a second (idle 70% of the
        # time, when the trainer computes alone and shows its demand)
        made.append(
            workload(
                node, client, "rc-plain", {labels.CLASS: "real-time"},
                ["server", "--arrivals", "fixed", "--rate", "1", "--duration", RUN_S,
                 "--request-work", "3.0", "--kernels", "6"],
            )
        )  # fmt: skip
        # 20 ms steps, each after 60 ms of host input: about a quarter of the device
        made.append(
            workload(
                node, client, "rc-light", {labels.MANAGED: "true", labels.CLASS: "best-effort"},
                ["train", "--duration", RUN_S, "--step-work", "0.2", "--kernels", "1",
                 "--sync-every", "1", "--input-wait", "0.06"],
            )
        )  # fmt: skip
        light = made[-1].id
        started = time.time()

        def demand() -> float | None:
            state = requests.get(node.exporter_url + "/api/v1/state", timeout=5).json()
            mine = [c for c in state["containers"] if c["id"] == light]
            return mine[0]["demand_sm_ratio"] if mine else None

        measured = wait_for(demand, 60, "the light trainer's demand")
        record_property("demand", round(measured, 3))
        assert 0.1 < measured < 0.5, measured  # it computes a part of each period, not all

        def settled() -> list[dict[str, Any]] | None:
            steps = [
                r for r in read_audit(audit)
                if r.get("event") == "run_fraction" and r["ts"] >= started
                and r.get("signal") == "interference"
            ]  # fmt: skip
            wanted = interference_fraction(demand() or measured, law)
            near = steps and abs(steps[-1]["run_fraction"] - wanted) < 0.08
            return steps if near else None

        steps = wait_for(settled, 60, "the run fraction at the light trainer's", interval=1)
        final = steps[-1]["run_fraction"]
        record_property("run_fraction", final)
        record_property("interference_steps", len(steps))
        assert final > FLOOR + 0.1, steps  # well above the floor a busy trainer gets
        assert all(FLOOR <= r["run_fraction"] <= 1 for r in steps)
        # it still runs the duty cycle beside the server's requests: frozen, thawed
        spans = _frozen_spans(audit, started, "rc-light")
        assert spans, "never frozen beside the server"
    finally:
        for container in made:
            container.remove(force=True)
        client.close()
