"""The Kubernetes node mark (``gpuguard/actuator/nodemarks/taints.py``) through the official client,
against a loopback stand-in that checks every request against the API's schema
(``tests/support/kube_stand_in.py``): no API server can run here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from exporter_support import ExporterProcess
from test_actuator_live import ActuatorProcess

from gpuguard.actuator.nodemarks.taints import LABEL_KEY, TAINT_KEY, TaintMarker, kubernetes_api
from gpuguard.contract import Result
from gpuguard.demo.stack.gpusim import GpusimService
from tests.support.kube_stand_in import KubeStandIn, node, schema_problem

pytestmark = pytest.mark.integration

OPERATOR_TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
MARK_TAINT = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}


@pytest.fixture
def api_server() -> Iterator[KubeStandIn]:
    stand_in = KubeStandIn(
        {"gpu-1": node("gpu-1", {"zone": "a"}, [OPERATOR_TAINT]), "gpu-2": node("gpu-2")}
    ).start()
    yield stand_in
    stand_in.stop()


def marker(stand_in: KubeStandIn, name: str = "gpu-1") -> TaintMarker:
    return TaintMarker(name, lambda: kubernetes_api(stand_in.url))


def test_mark_then_clear_touches_only_gpuguards_taint_and_label(api_server: KubeStandIn) -> None:
    nodes = marker(api_server)
    assert nodes.node_id() == "gpu-1"
    assert nodes.apply(provisionable=False) == Result.OK
    stored = api_server.nodes["gpu-1"]
    assert stored["spec"]["taints"] == [OPERATOR_TAINT, MARK_TAINT]
    assert stored["metadata"]["labels"] == {"zone": "a", LABEL_KEY: "true"}
    assert stored["spec"]["podCIDR"] == "10.244.0.0/24"  # the rest of the node kept

    assert nodes.apply(provisionable=False) == Result.ALREADY  # no second write
    assert [m for m, _ in api_server.requests].count("PUT") == 1

    assert nodes.apply(provisionable=True) == Result.OK
    stored = api_server.nodes["gpu-1"]
    assert stored["spec"]["taints"] == [OPERATOR_TAINT]  # the operator's stays
    assert stored["metadata"]["labels"] == {"zone": "a"}
    assert nodes.apply(provisionable=True) == Result.ALREADY
    assert api_server.violations == []
    assert {path for _, path in api_server.requests} == {"/api/v1/nodes/gpu-1"}


def test_a_node_without_taints_or_labels(api_server: KubeStandIn) -> None:
    nodes = marker(api_server, "gpu-2")
    assert nodes.apply(provisionable=True) == Result.ALREADY
    assert nodes.apply(provisionable=False) == Result.OK
    assert nodes.apply(provisionable=True) == Result.OK
    assert "taints" not in api_server.nodes["gpu-2"]["spec"]
    assert api_server.violations == []


def test_a_concurrent_change_is_read_again_not_overwritten(api_server: KubeStandIn) -> None:
    api_server.conflicts = 1  # someone else updates the node between our read and write
    assert marker(api_server).apply(provisionable=False) == Result.OK
    puts = [r for r in api_server.requests if r[0] == "PUT"]
    assert len(puts) == 2 and api_server.violations == []


def test_a_persistent_conflict_and_a_missing_node_raise(api_server: KubeStandIn) -> None:
    from kubernetes.client.exceptions import ApiException

    api_server.conflicts = 10
    with pytest.raises(ApiException) as conflict:
        marker(api_server).apply(provisionable=False)
    assert conflict.value.status == 409
    with pytest.raises(ApiException) as missing:
        marker(api_server, "gpu-9").apply(provisionable=False)
    assert missing.value.status == 404


def test_the_stand_in_refuses_what_the_api_would() -> None:
    assert schema_problem(node("n")) is None
    assert schema_problem({**node("n"), "bogus": 1}) is not None
    bad_taint = node("n", taints=[{"key": TAINT_KEY}])  # no effect: required
    assert schema_problem(bad_taint) is not None
    assert schema_problem({**node("n"), "kind": "Pod"}) is not None


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager"


def on_node(name: str, node_name: str) -> bytes:
    """An Alertmanager fixture, re-addressed to ``node_name``."""
    text = (FIXTURES / name).read_text().replace('"host-a"', f'"{node_name}"')
    return text.replace('node=\\"host-a\\"', f'node=\\"{node_name}\\"').encode()


def test_the_actuator_marks_its_kubernetes_node_from_alertmanager(
    sim: GpusimService, tmp_path: Path
) -> None:
    stand_in = KubeStandIn({"itest": node("itest", {"zone": "a"}, [OPERATOR_TAINT])}).start()
    no_docker = f"unix://{tmp_path}/no-docker.sock"
    exporter = ExporterProcess(tmp_path, no_docker, sim.socket).start()
    actuator = ActuatorProcess(
        tmp_path / "actuator", exporter.url, no_docker, "--mode=webhook",
        "--node.marker=kubernetes", f"--kubernetes.api-server={stand_in.url}",
    )  # fmt: skip
    try:
        actuator.start()
        assert actuator.post(on_node("firing.json", "itest")).status_code == 200
        stored = stand_in.nodes["itest"]
        assert stored["spec"]["taints"] == [OPERATOR_TAINT, MARK_TAINT]
        assert stored["metadata"]["labels"] == {"zone": "a", LABEL_KEY: "true"}
        assert actuator.post(on_node("resolved.json", "itest")).status_code == 200
        stored = stand_in.nodes["itest"]
        assert stored["spec"]["taints"] == [OPERATOR_TAINT]
        assert stored["metadata"]["labels"] == {"zone": "a"}
        marks = [(r["action"], r["result"]) for r in actuator.audit()
                 if r["event"] == "action" and r.get("node") == "itest"]  # fmt: skip
        # its start-up sync may or may not come first: it finds nothing to undo ("already")
        changed = [m for m in marks if m[1] != "already"]
        assert changed == [("mark_node", "ok"), ("unmark_node", "ok")], marks
        assert stand_in.violations == []
    finally:
        actuator.stop()
        exporter.stop()
        stand_in.stop()
