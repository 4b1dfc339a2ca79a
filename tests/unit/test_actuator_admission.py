"""Which admission decisions one webhook asks for (``actuator.targets.admission_targets``)."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuguard.actuator.targets import MAX_ADMISSION_NODES, admission_targets
from gpuguard.actuator.webhook import Alert

T0 = datetime(2025, 11, 22, tzinfo=UTC)


def alert(node: str | None, gpu: int | None, status: str = "firing", name: str = "A") -> Alert:
    labels = {"alertname": name}
    if node is not None:
        labels["node"] = node
    if gpu is not None:
        labels["gpu"] = str(gpu)
    return Alert(status, labels, {}, T0, T0, "", f"{node}{gpu}", gpu)


def test_one_gpu_stays_one_gpu_decision() -> None:
    assert admission_targets([alert("a", 0), alert("a", 0, name="B")]) == ([("a", 0, "A")], 0)


def test_several_gpus_of_a_node_become_one_node_wide_decision() -> None:
    targets, dropped = admission_targets([alert("a", 0), alert("a", 1), alert("b", 2)])
    assert targets == [("a", None, "A"), ("b", 2, "A")] and dropped == 0


def test_resolved_alerts_ask_for_nothing() -> None:
    assert admission_targets([alert("a", 0, status="resolved")]) == ([], 0)


def test_twelve_thousand_gpus_cost_one_decision() -> None:
    alerts = [alert("a", gpu) for gpu in range(12_000)]
    assert admission_targets(alerts) == ([("a", None, "A")], 0)


def test_nodes_beyond_the_bound_are_dropped_and_counted() -> None:
    alerts = [alert(f"n{i}", 0) for i in range(MAX_ADMISSION_NODES + 5)]
    targets, dropped = admission_targets(alerts)
    assert len(targets) == MAX_ADMISSION_NODES and dropped == 5
