"""SLO declarations by container label (gpuguard/labels.py, gpuguard/slo.py), their series on
/metrics and in /api/v1/state, and the gpusim server's histogram in vLLM's format."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuguard import labels
from gpuguard.demo.stack.reference_collector import GpuguardCollector
from gpuguard.exporter.collector import TextRenderer, build_rows
from gpuguard.exporter.containers import container_info
from gpuguard.exporter.state import state_json
from gpuguard.gpusim.workload.cli import parse_args
from gpuguard.gpusim.workload.latency_metrics import E2E_LATENCY, LatencyMetrics
from gpuguard.labels import LabelError
from gpuguard.slo import SloDeclaration, declaration, le_spellings, unit_per_second
from tests.unit.exporter_fakes import GIB, NO_POD, cid, sample, three_container_poller

VLLM = "vllm:e2e_request_latency_seconds"


# --- label parsing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [VLLM, "tgi_request_duration", "nv_inference_first_response_histogram_ms", " req_seconds "],
)
def test_slo_metric_names(name: str) -> None:
    assert labels.parse_slo_metric(name) == name.strip()


@pytest.mark.parametrize(
    ("name", "why"),
    [("", "metric name"), ("9lives", "metric name"), ("a-b", "metric name"),
     ("x" * 201, "longer"), (f"{VLLM}_bucket", "without _bucket"),
     ("req_count", "without _count"), ("req_sum", "without _sum")],
)  # fmt: skip
def test_slo_metric_names_refused(name: str, why: str) -> None:
    with pytest.raises(LabelError, match=why):
        labels.parse_slo_metric(name)


def test_the_documented_metric_form_is_a_kubernetes_label_value_and_the_same_slo() -> None:
    """On a pod the histogram is named with `_` for `:` (a label value may hold no `:`):
    the same declaration as the name with its colon, down to the series the rules match."""
    from tests.support.kubelabels import is_label_key, is_label_value

    documented = VLLM.replace(":", "_")
    assert is_label_value(documented) and not is_label_value(VLLM)
    declared = {}
    for name in (VLLM, documented):
        slo, errors = declaration({labels.SLO_METRIC: name, labels.SLO_TARGET: "500ms"})
        assert errors == () and slo is not None
        declared[name] = (slo.series_name, slo.per_second, slo.bucket_bounds)
    assert declared[VLLM] == declared[documented] == (documented, 1.0, ("0.5",))
    # every label gpuguard reads is a valid key, and the objective's valid value is 0.99
    names = [labels.DEADLINE, labels.MANAGED, labels.ROLE, labels.TASK, labels.CLASS,
             *labels.SLO_LABELS, labels.CONTAINER]  # fmt: skip
    assert all(is_label_key(name) for name in names)
    assert is_label_value("0.99") and not is_label_value("99%")


@pytest.mark.parametrize(
    ("text", "value"), [("0.99", 0.99), ("0.5", 0.5), (".999", 0.999), ("99.9%", 0.999)]
)
def test_slo_objective(text: str, value: float) -> None:
    assert labels.parse_slo_objective(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["0", "1", "1.0", "100%", "0%", "-0.5", "2", "x", "", "nan"])
def test_slo_objective_is_strictly_between_0_and_1(text: str) -> None:
    with pytest.raises(LabelError, match="between 0 and 1"):
        labels.parse_slo_objective(text)


@pytest.mark.parametrize("text", ["0", "65536", "-1", "80a", "", "٨٠"])
def test_slo_port_refused(text: str) -> None:
    with pytest.raises(LabelError, match="TCP port"):
        labels.parse_port(text)


def test_slo_port() -> None:
    assert labels.parse_port("8000") == 8000


# --- the declaration ---------------------------------------------------------------------


def test_declaration_with_defaults() -> None:
    slo, errors = declaration({labels.SLO_METRIC: VLLM, labels.SLO_TARGET: "500ms"})
    assert slo == SloDeclaration(VLLM, 0.5, 0.99, None) and errors == ()


def test_declaration_in_full() -> None:
    given = {
        labels.SLO_METRIC: VLLM,
        labels.SLO_TARGET: "700ms",
        labels.SLO_OBJECTIVE: "99.5%",
        labels.SLO_PORT: "8000",
    }
    slo, errors = declaration(given)
    assert errors == ()
    assert slo == SloDeclaration(VLLM, 0.7, 0.995, 8000)  # 0.7, not 0.7000000000000001


def test_no_labels_no_slo() -> None:
    assert declaration({"gpuguard.deadline": "1s"}) == (None, ())


def test_invalid_labels_count_as_absent_and_are_reported() -> None:
    slo, errors = declaration(
        {labels.SLO_METRIC: VLLM, labels.SLO_TARGET: "1s", labels.SLO_OBJECTIVE: "1.5",
         labels.SLO_PORT: "http"}
    )  # fmt: skip
    assert slo == SloDeclaration(VLLM, 1.0)  # objective 0.99, no port
    assert [label for label, _ in errors] == [labels.SLO_OBJECTIVE, labels.SLO_PORT]


def test_an_unusable_metric_or_target_means_no_slo() -> None:
    slo, errors = declaration({labels.SLO_METRIC: "bad name", labels.SLO_TARGET: "0s"})
    assert slo is None
    assert [label for label, _ in errors] == [labels.SLO_METRIC, labels.SLO_TARGET]
    assert all(label in text for label, text in errors)  # each message names its label


def test_metric_and_target_go_together() -> None:
    slo, errors = declaration({labels.SLO_TARGET: "1s", labels.SLO_OBJECTIVE: "0.9"})
    assert slo is None
    assert errors == (
        (labels.SLO_METRIC, "gpuguard.slo.metric is required with "
                            "gpuguard.slo.objective, gpuguard.slo.target"),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("metric", "per_second"),
    [(VLLM, 1.0), ("tgi_request_duration", 1.0), ("nv_inference_first_response_histogram_ms",
     1e3), ("x_milliseconds", 1e3), ("x_us", 1e6), ("x_microseconds", 1e6)],
)  # fmt: skip
def test_units_follow_the_name(metric: str, per_second: float) -> None:
    assert unit_per_second(metric) == per_second


@pytest.mark.parametrize(
    ("bound", "spellings"),
    [
        (0.5, ("0.5",)),
        (1.0, ("1.0", "1")),  # prometheus_client and Prometheus 3; client_golang
        (2.5, ("2.5",)),
        (500.0, ("500.0", "500")),
        (1e6, ("1000000.0", "1e+06", "1000000")),
        (1234567.0, ("1234567.0", "1.234567e+06", "1234567", "1.23457e+06")),
        (1e-05, ("1e-05",)),
    ],
)
def test_le_spellings(bound: float, spellings: tuple[str, ...]) -> None:
    assert le_spellings(bound) == spellings


def test_bucket_bounds_in_the_histograms_unit() -> None:
    assert SloDeclaration(VLLM, 0.3).bucket_bounds == ("0.3",)
    assert SloDeclaration("nv_inference_first_response_histogram_ms", 0.7).bucket_bounds == (
        "700.0",
        "700",
    )
    assert "500000" in SloDeclaration("x_us", 0.5).bucket_bounds


def test_container_info_carries_the_slo() -> None:
    info = container_info(
        {"Id": cid(1), "Name": "/srv",
         "Config": {"Labels": {labels.SLO_METRIC: VLLM, labels.SLO_TARGET: "500ms",
                               labels.SLO_OBJECTIVE: "2"}}}
    )  # fmt: skip
    assert info.slo == SloDeclaration(VLLM, 0.5)
    assert [label for label, _ in info.slo_errors] == [labels.SLO_OBJECTIVE]


# --- the exporter's series and state -----------------------------------------------------


def _slo_poller(tmp_path: Path) -> tuple[Any, Any]:
    backend, containers, poller = three_container_poller(tmp_path / "proc")
    rt, paused, bad = containers.snapshot().values()
    slo = SloDeclaration(VLLM, 1.0, 0.95, 8000)
    errors = ((labels.SLO_TARGET, "gpuguard.slo.target: invalid duration 'x'"),)
    containers.set(replace(rt, slo=slo), paused, replace(bad, slo_errors=errors))
    backend.next = sample(1.0, {100: GIB, 200: 2 * GIB, 300: GIB}, sm={100: 0.5})
    return poller, poller.poll_once()


def test_slo_series(tmp_path: Path) -> None:
    poller, _ = _slo_poller(tmp_path)
    registry = CollectorRegistry()
    registry.register(GpuguardCollector(lambda: poller.snapshot))
    v = registry.get_sample_value
    c1 = {"node": "node-a", **NO_POD, "container": "rt-1", "container_id": cid(1)[:12]}
    c3 = {"node": "node-a", **NO_POD, "container": "bad", "container_id": cid(3)[:12]}
    escaped = "vllm_e2e_request_latency_seconds"  # as Prometheus may store it
    assert v("gpuguard_container_slo_info", {**c1, "metric": escaped}) == 1
    assert v("gpuguard_container_slo_target_seconds", c1) == 1.0
    assert v("gpuguard_container_slo_objective_ratio", c1) == 0.95
    for le in ("1.0", "1"):
        assert v("gpuguard_container_slo_bucket_info", {**c1, "metric": escaped, "bound": le}) == 1
    assert v("gpuguard_container_label_invalid", {**c3, "label": labels.SLO_TARGET}) == 1
    assert v("gpuguard_container_slo_target_seconds", c3) is None

    # the fast text renderer writes the same series as the collector
    def samples(text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
        return {
            (s.name, tuple(sorted(s.labels.items())), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    fast = TextRenderer().render_snapshot(poller.snapshot).decode()
    assert samples(fast) == samples(generate_latest(registry).decode())
    assert 'bound="1"' in fast


def test_state_carries_the_slo(tmp_path: Path) -> None:
    _, snap = _slo_poller(tmp_path)
    doc = {c["name"]: c for c in state_json(snap)["containers"]}
    assert doc["rt-1"]["slo"] == {"metric": VLLM, "target_s": 1.0, "objective": 0.95,
                                  "port": 8000}  # fmt: skip
    assert doc["bad"]["slo"] is None
    assert build_rows(snap).gauges["gpuguard_container_slo_info"]


# --- gpusim's server: vLLM's histogram ---------------------------------------------------


def test_server_latency_histogram_in_vllms_format() -> None:
    metrics = LatencyMetrics("llama")
    text = generate_latest(metrics.registry).decode()
    assert f'{E2E_LATENCY}_bucket{{le="0.3",model_name="llama"}} 0.0' in text  # from the start
    for seconds in (0.02, 0.04, 0.6):
        metrics.observe(seconds)
    text = generate_latest(metrics.registry).decode()
    assert f"# TYPE {E2E_LATENCY} histogram" in text
    assert f'{E2E_LATENCY}_bucket{{le="0.05",model_name="llama"}} 2.0' in text
    assert f'{E2E_LATENCY}_bucket{{le="1.0",model_name="llama"}} 3.0' in text
    assert f'{E2E_LATENCY}_count{{model_name="llama"}} 3.0' in text


def test_server_metrics_flags() -> None:
    args = parse_args(["server", "--rate", "5", "--duration", "1", "--metrics-port", "9400"])
    assert (args.metrics_port, args.metrics_address, args.model_name) == (
        9400,
        "127.0.0.1",
        "gpusim",
    )
    assert parse_args(["server", "--rate", "5", "--duration", "1"]).metrics_port is None
    with pytest.raises(SystemExit):
        parse_args(["server", "--rate", "5", "--duration", "1", "--metrics-port", "0"])


def test_a_metrics_port_in_use_fails_before_the_gpu_is_taken(tmp_path: Path) -> None:
    import json
    import socket

    from gpuguard.gpusim.workload.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = tmp_path / "server.jsonl"
        argv = ["server", "--rate", "2", "--duration", "1", "--metrics-port", str(port),
                "--socket", str(tmp_path / "no-daemon.sock"), "--log", str(log)]  # fmt: skip
        assert main(argv) == 1
    [line] = [json.loads(text) for text in log.read_text().splitlines()]
    assert (line["event"], line["error"]) == ("error", "metrics_port")
    assert "in use" in line["message"]
