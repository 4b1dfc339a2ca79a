"""Rate control's signal (gpuguard/actuator/admission/slosignal.py): what a reply of
Prometheus says,
per device, and what a failed query does. The poller against the real Prometheus runs in
tests/integration/test_ratecontrol_live.py."""

from __future__ import annotations

from typing import Any

import pytest

from gpuguard.actuator.admission.ratecontrol import SloReading
from gpuguard.actuator.admission.slosignal import (
    ATTAINMENT_RULE,
    Attainment,
    SloSignal,
    attainment_query,
    attainments_from_result,
    device_readings,
)
from gpuguard.actuator.metrics import ActuatorMetrics
from gpuguard.demo.stack.process import free_port
from tests.unit.policy_support import cid, container, state, task


def series(values: list[tuple[float, str]], **labels: str) -> dict[str, Any]:
    metric = {"__name__": ATTAINMENT_RULE, "node": "host-a", "container": "srv", **labels}
    return {"metric": metric, "values": [[t, v] for t, v in values]}


def test_the_query_reads_this_nodes_series_over_the_staleness_range() -> None:
    assert attainment_query("host-a", 15.0) == f'{ATTAINMENT_RULE}{{node="host-a"}}[15s]'
    assert attainment_query('we"ird\\', 0.2) == f'{ATTAINMENT_RULE}{{node="we\\"ird\\\\"}}[1s]'


def test_the_newest_sample_of_each_series_with_its_own_time() -> None:
    result = [
        series([(100.0, "1"), (101.0, "0.97")], container_id="a" * 12, gpu="0"),
        series([(99.0, "0.5")], container_id="b" * 12, gpu="1:2"),  # a MIG instance
        # skipped: no id, a short id, no gpu, a bad gpu, no share, no values, no metric
        series([(101.0, "1")], gpu="0"),
        series([(101.0, "1")], container_id="abc", gpu="0"),
        series([(101.0, "1")], container_id="c" * 12),
        series([(101.0, "1")], container_id="c" * 12, gpu="x"),
        series([(101.0, "NaN")], container_id="c" * 12, gpu="0"),
        series([(101.0, "1.5")], container_id="c" * 12, gpu="0"),
        series([], container_id="c" * 12, gpu="0"),
        {"values": [[101.0, "1"]]},
        "not a series",
    ]
    assert attainments_from_result(result) == [
        Attainment("a" * 12, (0, None), 0.97, 101.0),
        Attainment("b" * 12, (1, 2), 0.5, 99.0),
    ]


def slo(name: str, objective: float = 0.99, klass: str | None = None) -> dict[str, Any]:
    doc = container(name, deadline=2.0, klass=klass)
    doc["slo"] = {"metric": "m", "target_s": 0.5, "objective": objective, "port": 8000}
    return doc


def test_readings_per_device_for_real_time_containers_that_declare_an_slo() -> None:
    cs = [slo("s", 0.9), slo("u"), container("r", deadline=2.0), slo("n", klass="normal")]
    ts = [task("u", "computing", 1, gpu=2, pid=5)]
    st = state(cs, ts, gpus=3)
    seen = [
        Attainment(cid("s")[:12], (0, None), 0.8, 50.0),
        Attainment(cid("r")[:12], (0, None), 0.1, 50.0),  # declares none: ignored
        Attainment(cid("n")[:12], (1, None), 0.1, 50.0),  # not real-time: ignored
        Attainment("f" * 12, (1, None), 0.1, 50.0),  # gone from the state: ignored
    ]
    readings, declared = device_readings(st, seen)
    assert readings == {(0, None): [SloReading(0.8, 0.9, 50.0)]}
    # where it has a reading, and where it runs a task now (no reading there yet)
    assert declared == {(0, None), (2, None)}


def test_a_failed_query_is_counted_and_leaves_the_readings_to_age() -> None:
    metrics = ActuatorMetrics("host-a")
    signal = SloSignal(
        f"http://127.0.0.1:{free_port()}", "host-a", 15.0,
        lambda result: metrics.slo_queries.labels(result).inc(), timeout_s=0.5,
    )  # fmt: skip
    try:
        assert not signal.poll()
        assert signal.latest() == []
        assert signal.last_error is not None and "ConnectionError" in signal.last_error
    finally:
        signal.stop()
    failed = metrics.registry.get_sample_value(
        "gpuguard_actuator_slo_queries_total", {"result": "failed"}
    )
    assert failed == 1.0


@pytest.mark.parametrize("objective", [0, 1, 1.5, "x"])
def test_an_slo_objective_outside_its_range_makes_the_state_unreadable(objective: Any) -> None:
    from gpuguard.statedoc import StateError

    doc = slo("s")
    doc["slo"]["objective"] = objective
    with pytest.raises(StateError, match="objective"):
        state([doc], [])
