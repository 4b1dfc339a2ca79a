"""The placer as kube-scheduler's extender: what kube-scheduler posts (``ExtenderArgs`` with a
whole ``v1.Pod``, ``NodeNames`` or ``Nodes``) and what it reads back, against
``k8s.io/kube-scheduler/extender/v1/types.go`` and the scheduler's ``HTTPExtender``
(``pkg/scheduler/extender.go``): fields spelt as Go marshals them, the filtered list in the
field the request used, scores 0-10; malformed and huge requests answered 4xx.

The pod and nodes are built as dicts and read back through the official client's models
(a misspelt or mistyped field would not survive), so the JSON is what the API server's
objects look like on the wire.
"""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuguard.contract import StateReason
from gpuguard.demo.stack.process import free_port
from gpuguard.noderecord import GpuRecord, NodeRecord
from gpuguard.placer import extender
from gpuguard.placer.errors import BadRequest, ConfigError
from gpuguard.placer.extender import (
    MAX_BODY,
    NO_RECORD,
    ExtenderArgs,
    declared_request,
    host_priorities,
    node_verdicts,
    parse_args,
)
from gpuguard.placer.http import placer_server
from gpuguard.placer.ranking import NodeView, Request, rank
from gpuguard.placer.service import Placer, Settings
from gpuguard.web.webconfig import WebConfigWatcher, load_web_config
from tests.support.tlscerts import Pki
from tests.unit.test_placer_api import StaticSource

GIB = 2**30
FILTER = f"{extender.PATH_PREFIX}/{extender.FILTER_VERB}"
PRIORITIZE = f"{extender.PATH_PREFIX}/{extender.PRIORITIZE_VERB}"


# --- what kube-scheduler sends ------------------------------------------------------------


def v1_pod(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None):
    """A pending GPU pod as kube-scheduler's informer holds it (what ``Pod`` carries)."""
    doc: dict[str, Any] = {
        "metadata": {
            "name": "infer-7d9f8-abcde",
            "generateName": "infer-7d9f8-",
            "namespace": "team-a",
            "uid": "5f3c2a10-8b1e-4d7a-9c55-0e2f3a4b5c6d",
            "resourceVersion": "48213",
            "creationTimestamp": "2025-03-01T10:00:00+00:00",
            "labels": {"app": "infer", "pod-template-hash": "7d9f8", **(labels or {})},
            "annotations": annotations or {},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "infer-7d9f8",
                    "uid": "0b5e1f7e-2a8c-4c3e-9f1d-7a6b5c4d3e2f",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "server",
                    "image": "registry.example/infer:1.4",
                    "args": ["--port", "8000"],
                    "ports": [{"containerPort": 8000, "protocol": "TCP"}],
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1", "memory": "16Gi"},
                        "requests": {"cpu": "2", "memory": "16Gi", "nvidia.com/gpu": "1"},
                    },
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                },
                {
                    "name": "log-shipper",
                    "image": "registry.example/shipper:2.0",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                },
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }
    return _through_the_model("V1Pod", doc)


def v1_node(name: str) -> dict[str, Any]:
    """A GPU node as the API server has it, with the image list that makes nodes large."""
    doc = {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1001",
            "creationTimestamp": "2025-01-01T00:00:00+00:00",
            "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true"},
        },
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {
            "capacity": {"cpu": "32", "memory": "263846324Ki", "nvidia.com/gpu": "4"},
            "allocatable": {"cpu": "31", "memory": "261646324Ki", "nvidia.com/gpu": "4"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": "2025-03-01T09:59:50+00:00",
                    "lastTransitionTime": "2025-01-01T00:01:00+00:00",
                }
            ],
            "images": [
                {"names": [f"registry.example/img-{i}@sha256:{i:064x}"], "sizeBytes": 10**9 + i}
                for i in range(20)
            ],
            "nodeInfo": {
                "machineID": "m",
                "systemUUID": "s",
                "bootID": "b",
                "kernelVersion": "6.1.0",
                "osImage": "Debian GNU/Linux 12",
                "containerRuntimeVersion": "containerd://1.7.2",
                "kubeletVersion": "v1.30.2",
                "kubeProxyVersion": "v1.30.2",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }
    return _through_the_model("V1Node", doc)


def _through_the_model(kind: str, doc: dict[str, Any]) -> dict[str, Any]:
    pytest.importorskip("kubernetes")
    from kubernetes import client
    from kubernetes.client import ApiClient

    back = ApiClient().sanitize_for_serialization(getattr(client, kind).from_dict(doc))
    assert back == doc, f"not a {kind} as the API has it"
    return back


def scheduler_body(pod: dict[str, Any], names: list[str], cache_capable: bool = True) -> bytes:
    """``json.Marshal(ExtenderArgs{...})`` as ``HTTPExtender`` builds it: fields in the Go
    struct's order, the pointer it leaves nil as ``null``."""
    if cache_capable:
        args = {"Pod": pod, "Nodes": None, "NodeNames": names}
    else:
        args = {"Pod": pod, "Nodes": {"metadata": {}, "items": [v1_node(n) for n in names]},
                "NodeNames": None}  # fmt: skip
    return json.dumps(args, separators=(",", ":")).encode()


# --- the cluster the placer sees ----------------------------------------------------------


def gpu(free_gib: float, running: int = 0, reasons: tuple[StateReason, ...] = ()) -> GpuRecord:
    return GpuRecord(
        "0", "sim", 0 if reasons else 1, reasons, math.inf, running, 0, running, None, 0.1,
        int(free_gib * GIB), 24 * GIB,
    )  # fmt: skip


def view(name: str, record: GpuRecord, age: float = 1.0, marked: bool = False) -> NodeView:
    return NodeView(NodeRecord(name, 999.0, (record,)), age, marked)


CLUSTER = [
    view("gpu-a", gpu(20)),  # best: nobody on it
    view("gpu-b", gpu(12, running=1)),
    view("gpu-g", gpu(12, running=2)),
    view("gpu-c", gpu(20, reasons=(StateReason.SATURATED,))),  # state 0
    view("gpu-f", gpu(1)),  # not enough memory for 4 GiB
    view("gpu-d", gpu(20), marked=True),  # its actuator marked it
    view("gpu-e", gpu(20), age=100.0),  # stale record
]
REAL_TIME = {"gpuguard.deadline": "9s", "gpuguard.memory": "4GiB"}
ALL = ["gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e", "gpu-f", "gpu-g", "cpu-only"]


@pytest.fixture
def placer() -> Placer:
    return Placer(StaticSource(list(CLUSTER)), Settings(), clock=lambda: 1000.0)


# --- parsing ------------------------------------------------------------------------------


def test_the_args_kube_scheduler_sends_with_node_names() -> None:
    args = parse_args(scheduler_body(v1_pod(REAL_TIME), ["gpu-a", "gpu-b"]))
    assert args.pod == "team-a/infer-7d9f8-abcde"
    assert (args.node_names, args.node_items) == (("gpu-a", "gpu-b"), None)
    assert declared_request(args) == Request(deadline_s=9.0, memory_bytes=4 * GIB)


def test_the_args_kube_scheduler_sends_with_whole_nodes() -> None:
    args = parse_args(scheduler_body(v1_pod(REAL_TIME), ["gpu-a", "gpu-b"], cache_capable=False))
    assert args.node_names == ("gpu-a", "gpu-b")
    assert args.node_items is not None and args.node_items[1]["status"]["capacity"]


def test_field_names_match_in_any_case_as_gos_decoder_does() -> None:
    # types_test.go (TestCompatibility) decodes the lower-cased JSON back into the types
    body = scheduler_body(v1_pod(REAL_TIME), ["gpu-a"]).replace(b'"NodeNames"', b'"nodenames"')
    body = body.replace(b'"Pod"', b'"pod"', 1)
    assert parse_args(body).node_names == ("gpu-a",)


def _body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


POD = {"metadata": {"name": "p", "namespace": "n"}}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "not JSON"),
        (b"{nope", "not JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[]", "not ExtenderArgs"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": [NaN]}', "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
        (_body(NodeNames=["a"]), "Pod: must be"),
        (_body(Pod=None, NodeNames=["a"]), "Pod: must be"),
        (_body(Pod={"spec": {}}, NodeNames=["a"]), "Pod.metadata"),
        (_body(Pod={"metadata": {"namespace": "n"}}, NodeNames=["a"]), "name and namespace"),
        (_body(Pod=POD), "exactly one of Nodes and NodeNames"),
        (_body(Pod=POD, Nodes=None, NodeNames=None), "exactly one"),
        (_body(Pod=POD, Nodes={"items": []}, NodeNames=["a"]), "exactly one"),
        (_body(Pod=POD, NodeNames="gpu-a"), "NodeNames: must be a list"),
        (_body(Pod=POD, NodeNames=["gpu-a", 7]), "NodeNames: int is not a node name"),
        (_body(Pod=POD, NodeNames=["GPU_A"]), "is not a node name"),
        (_body(Pod=POD, NodeNames=["a" * 254]), "is not a node name"),
        (_body(Pod=POD, NodeNames=["a\nb"]), "is not a node name"),
        (_body(Pod=POD, Nodes={"items": [{"spec": {}}]}), "v1.NodeList"),
        (_body(Pod=POD, Nodes={"items": [{"metadata": {}}]}), "is not a node name"),
        (_body(Pod=POD, Nodes=[]), "v1.NodeList"),
        (b'{"Pod": {}, "pod": {}, "NodeNames": []}', "Pod given twice"),
        (
            _body(
                Pod={"metadata": {"name": "p", "namespace": "n", "labels": {"a": 1}}},
                NodeNames=["x"],
            ),
            "labels: must map strings",
        ),
    ],
)
def test_malformed_args_are_one_line_errors(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message) as raised:
        parse_args(body)
    assert "\n" not in str(raised.value)


def args_with(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None):
    return ExtenderArgs("n/p", labels or {}, annotations or {}, ("gpu-a",))


def test_the_declaration_comes_from_labels_or_annotations() -> None:
    assert declared_request(args_with()) is None  # no deadline: not real-time
    from_annotations = args_with(
        annotations={"gpuguard.deadline": "1500ms", "gpuguard.runtime": "0.5s"}
    )
    assert declared_request(from_annotations) == Request(1.5, 0, runtime_s=0.5)
    same = args_with({"gpuguard.deadline": "9s"}, {"gpuguard.deadline": "9s"})
    assert declared_request(same) == Request(9.0, 0)


@pytest.mark.parametrize(
    ("labels", "annotations", "message"),
    [
        ({"gpuguard.deadline": "9s"}, {"gpuguard.deadline": "8s"}, "label '9s' and annotation"),
        ({"gpuguard.deadline": "soon"}, {}, "gpuguard.deadline: invalid duration"),
        ({"gpuguard.deadline": "2d"}, {}, "gpuguard.deadline: invalid duration"),
        ({"gpuguard.deadline": "90000s"}, {}, "gpuguard.deadline: at most"),
        ({"gpuguard.deadline": "9s", "gpuguard.memory": "lots"}, {}, "gpuguard.memory: invalid"),
        ({"gpuguard.deadline": "9s"}, {"gpuguard.runtime": ""}, "gpuguard.runtime: invalid"),
    ],
)
def test_a_declaration_that_cannot_be_read(
    labels: dict[str, str], annotations: dict[str, str], message: str
) -> None:
    with pytest.raises(extender.DeclarationError, match=message):
        declared_request(args_with(labels, annotations))


# --- verdicts (pure) ----------------------------------------------------------------------


def test_verdicts_follow_the_ranking_with_each_failures_reasons() -> None:
    ranking = rank(CLUSTER, Request(9.0, 4 * GIB))
    verdicts = node_verdicts(ALL, ranking)
    assert [n for n in ALL if verdicts[n].eligible] == ["gpu-a", "gpu-b", "gpu-g"]
    failed = {n: v.message for n, v in verdicts.items() if not v.eligible}
    assert failed == {
        "gpu-c": "gpuguard: deadline 9s cannot be met here (saturated)",
        "gpu-f": "gpuguard: deadline 9s cannot be met here (memory)",
        "gpu-d": "gpuguard: deadline 9s cannot be met here (marked)",
        "gpu-e": "gpuguard: deadline 9s cannot be met here (stale)",
        "cpu-only": NO_RECORD,
    }


def test_every_failure_is_one_kube_schedulers_preemption_cannot_resolve(placer: Placer) -> None:
    # Preemption's dry run (preemption.go, DryRunPreemption) judges a node by kube-scheduler's
    # own filters, which every node sent to the extender has passed: on a node in FailedNodes
    # it finds no victim and logs "expected at least one victim pod on node", every cycle.
    # Memory held by lower-priority pods included: the dry run never asks the extender.
    result = extender.Extender(placer).filter(scheduler_body(v1_pod(REAL_TIME), ALL)).doc
    assert result["FailedNodes"] == {}
    assert set(result["FailedAndUnresolvableNodes"]) == set(ALL) - set(result["NodeNames"])
    assert result["FailedAndUnresolvableNodes"]["gpu-f"] == (
        "gpuguard: deadline 9s cannot be met here (memory)"
    )


def test_scores_are_the_ranking_order_from_10_down_to_1() -> None:
    verdicts = node_verdicts(ALL, rank(CLUSTER, Request(9.0, 4 * GIB)))
    scores = {p["Host"]: p["Score"] for p in host_priorities(ALL, verdicts)}
    assert scores == {"gpu-a": 10, "gpu-b": 6, "gpu-g": 1, "gpu-c": 0, "gpu-d": 0, "gpu-e": 0,
                      "gpu-f": 0, "cpu-only": 0}  # fmt: skip
    only = host_priorities(["gpu-b"], verdicts)
    assert only == [{"Host": "gpu-b", "Score": 10}]
    many = [view(f"n{i:02d}", gpu(20, running=i)) for i in range(25)]
    names = [f"n{i:02d}" for i in range(25)]
    spread = host_priorities(names, node_verdicts(names, rank(many, Request(9.0, GIB))))
    assert [p["Score"] for p in spread] == sorted((p["Score"] for p in spread), reverse=True)
    assert spread[0]["Score"] == 10 and spread[-1]["Score"] == 1
    assert all(0 <= p["Score"] <= extender.MAX_EXTENDER_PRIORITY for p in spread)


# --- the verbs over a placer --------------------------------------------------------------


def test_filter_with_node_names(placer: Placer) -> None:
    answer = extender.Extender(placer).filter(scheduler_body(v1_pod(REAL_TIME), ALL))
    assert answer.code == 200
    result = answer.doc
    assert list(result) == [
        "Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error",
    ]  # fmt: skip
    assert result["Nodes"] is None and result["Error"] == ""
    assert result["NodeNames"] == ["gpu-a", "gpu-b", "gpu-g"]  # a subset, in the given order
    assert result["FailedNodes"] == {}
    assert set(result["FailedAndUnresolvableNodes"]) == {
        "gpu-c", "gpu-d", "gpu-e", "gpu-f", "cpu-only",
    }  # fmt: skip


def test_filter_with_whole_nodes_echoes_the_passing_ones(placer: Placer) -> None:
    body = scheduler_body(v1_pod(REAL_TIME), ["gpu-c", "gpu-a", "gpu-b"], cache_capable=False)
    result = extender.Extender(placer).filter(body).doc
    assert result["NodeNames"] is None
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["gpu-a", "gpu-b"]
    assert result["Nodes"]["items"][0] == v1_node("gpu-a")  # as sent, for Go to decode
    assert result["FailedNodes"] == {} and set(result["FailedAndUnresolvableNodes"]) == {"gpu-c"}


def test_a_pod_without_a_deadline_passes_everywhere_unscored(placer: Placer) -> None:
    placer.source.down = True  # type: ignore[attr-defined]  # and needs no records
    verbs = extender.Extender(placer)
    result = verbs.filter(scheduler_body(v1_pod(), ALL)).doc
    assert result["NodeNames"] == ALL and not result["FailedAndUnresolvableNodes"]
    scores = verbs.prioritize(scheduler_body(v1_pod(), ALL)).doc
    assert {p["Score"] for p in scores} == {0}


def test_a_pod_with_a_bad_declaration_is_kept_pending_with_the_reason(placer: Placer) -> None:
    body = scheduler_body(v1_pod({"gpuguard.deadline": "9s"}, {"gpuguard.deadline": "8s"}), ALL)
    result = extender.Extender(placer).filter(body).doc
    assert result["NodeNames"] == []
    assert set(result["FailedAndUnresolvableNodes"]) == set(ALL)
    assert result["FailedAndUnresolvableNodes"]["gpu-a"] == (
        "gpuguard: gpuguard.deadline: pod label '9s' and annotation '8s' differ"
    )


def test_prometheus_down_is_a_503_kube_scheduler_fails_open_on(placer: Placer) -> None:
    placer.source.down = True  # type: ignore[attr-defined]
    verbs = extender.Extender(placer)
    for answer in (
        verbs.filter(scheduler_body(v1_pod(REAL_TIME), ALL)),
        verbs.prioritize(scheduler_body(v1_pod(REAL_TIME), ALL)),
    ):
        assert answer.code == 503 and "prometheus" in answer.doc["error"]
    requests_total = placer.metrics.requests
    assert requests_total.labels("extender_filter", "503")._value.get() == 1
    assert requests_total.labels("extender_prioritize", "503")._value.get() == 1


def test_the_extender_reserves_nothing(placer: Placer) -> None:
    verbs = extender.Extender(placer)
    for _ in range(5):
        assert verbs.filter(scheduler_body(v1_pod(REAL_TIME), ALL)).doc["NodeNames"][0] == "gpu-a"
    assert len(placer.reservations) == 0


# --- over HTTP, as kube-scheduler's HTTPExtender sends it -----------------------------------


def serve(placer: Placer, token: str | None = None, **kw: Any):
    port = free_port()
    server = placer_server(("127.0.0.1", port), placer, token, with_extender=True, **kw)
    server.serve_in_thread()
    return server, port


@pytest.fixture
def plain(placer: Placer) -> Iterator[str]:
    server, port = serve(placer, token="s3cret")
    yield f"http://127.0.0.1:{port}"
    server.shutdown()
    server.server_close()


def post(url: str, body: bytes, **kw: Any) -> requests.Response:
    headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
    return requests.post(url, data=body, headers=headers, timeout=10, **kw)


def test_the_verbs_over_http_need_no_token_which_kube_scheduler_cannot_send(plain: str) -> None:
    body = scheduler_body(v1_pod(REAL_TIME), ALL)
    filtered = post(plain + FILTER, body)
    assert filtered.status_code == 200 and filtered.headers["Content-Type"] == "application/json"
    assert filtered.json()["NodeNames"] == ["gpu-a", "gpu-b", "gpu-g"]
    assert filtered.json()["FailedNodes"] == {}  # preemption could resolve none of them
    assert set(filtered.json()["FailedAndUnresolvableNodes"]) == set(ALL) - {
        "gpu-a",
        "gpu-b",
        "gpu-g",
    }
    scores = post(plain + PRIORITIZE, body).json()
    assert scores[0] == {"Host": "gpu-a", "Score": 10}
    # the placer's own API keeps its token
    assert requests.get(plain + "/api/v1/nodes", timeout=5).status_code == 401
    metrics = requests.get(plain + "/metrics", timeout=5).text
    assert 'gpuguard_placer_requests_total{code="200",endpoint="extender_filter"} 1.0' in metrics


def test_bad_requests_over_http_are_4xx(plain: str) -> None:
    assert post(plain + FILTER, b"{nope").status_code == 400
    assert post(plain + FILTER, b"{}", headers={"Content-Type": "text/plain"}).status_code == 415
    assert requests.get(plain + FILTER, timeout=5).status_code == 405
    assert post(plain + extender.PATH_PREFIX + "/bind", b"{}").status_code == 404
    deep = post(plain + PRIORITIZE, b"[" * 500_000 + b"]" * 500_000)
    assert deep.status_code == 400 and "nested too deep" in deep.json()["error"]


def test_a_huge_body_is_refused_from_its_head(plain: str) -> None:
    port = int(plain.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(
            f"POST {FILTER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {MAX_BODY + 1}\r\n\r\n".encode()
        )
        head = sock.recv(4096).decode("latin-1")  # answered before a body byte was sent
    assert head.startswith("HTTP/1.1 413"), head
    chunks = (b"x" * 65536 for _ in range(MAX_BODY // 65536 + 2))  # no length: streamed
    streamed = requests.post(
        plain + FILTER, data=chunks, headers={"Content-Type": "application/json"}, timeout=30
    )
    assert streamed.status_code == 413
    metrics = requests.get(plain + "/metrics", timeout=5).text
    assert 'gpuguard_placer_requests_total{code="413",endpoint="extender_filter"} 2.0' in metrics


def test_without_the_flag_there_is_no_extender(placer: Placer) -> None:
    port = free_port()
    server = placer_server(("127.0.0.1", port), placer, None)
    server.serve_in_thread()
    try:
        body = scheduler_body(v1_pod(REAL_TIME), ALL)
        assert post(f"http://127.0.0.1:{port}{FILTER}", body).status_code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_kube_schedulers_client_certificate_is_what_admits_it(
    placer: Placer, pki: Pki, tmp_path: Path
) -> None:
    from tests.support.tlscerts import write_web_config

    web_file = write_web_config(tmp_path / "web.yml", pki, client_auth="RequireAndVerifyClientCert")
    web = WebConfigWatcher(load_web_config(web_file), require_auth=True)
    server, port = serve(placer, web=web)
    url = f"https://127.0.0.1:{port}{FILTER}"
    body = scheduler_body(v1_pod(REAL_TIME), ["gpu-a", "gpu-c"])
    try:
        # tlsConfig: caFile verifies the placer, certFile/keyFile present kube-scheduler
        ok = post(url, body, verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key)))
        assert ok.status_code == 200 and ok.json()["NodeNames"] == ["gpu-a"]
        for cert in (None, (str(pki.rogue_cert), str(pki.rogue_key))):
            with pytest.raises((requests.exceptions.SSLError, requests.ConnectionError)):
                post(url, body, verify=str(pki.ca), cert=cert)
    finally:
        server.shutdown()
        server.server_close()


# --- --extender.enabled -------------------------------------------------------------------


def test_the_extender_is_off_by_default_and_free_on_loopback() -> None:
    from tests.unit.test_placer_cli import config

    assert config().extender is False
    on = config("--extender.enabled")
    assert on.extender and not on.extender_needs_certificates


def test_beyond_loopback_the_extender_needs_client_certificates(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuguard.cli import main
    from tests.support.tlscerts import write_web_config
    from tests.unit.test_placer_cli import config

    token = tmp_path / "token"
    token.write_text("abc\n")
    wide = ("--web.listen-address=0.0.0.0:10837", "--extender.enabled")
    # a token guards the placer's API, but kube-scheduler cannot send it
    assert main(["placer", *wide, f"--web.token-file={token}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RequireAndVerifyClientCert" in err
    tls_only = write_web_config(tmp_path / "tls.yml", pki)
    with pytest.raises(ConfigError, match="client certificate"):
        config(*wide, f"--web.config.file={tls_only}")
    users = write_web_config(
        tmp_path / "users.yml", pki, {"ops": "pw"}, "RequireAndVerifyClientCert"
    )
    with pytest.raises(ConfigError, match="no Authorization header"):
        config(*wide, f"--web.config.file={users}")
    certs = write_web_config(tmp_path / "certs.yml", pki, client_auth="RequireAndVerifyClientCert")
    made = config(*wide, f"--web.config.file={certs}")
    assert made.extender and made.extender_needs_certificates and made.token is None
