"""The node list: each webhook POST is a snapshot of its alert group."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from gpuguard.actuator.nodemarks.nodelist import NodeList
from gpuguard.actuator.webhook import parse_message
from gpuguard.commands.nodes import format_nodes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager"
MARK = {"GpuguardNodeCannotGuaranteeDeadlines", "GpuguardTaskDeadlineAtRisk"}


def doc(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def alert(
    name: str, fingerprint: str, status: str = "firing", node: str = "host-a"
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": name, "node": node},
        "annotations": {},
        "startsAt": "2025-11-22T01:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": fingerprint,
    }


def payload(group: str, alerts: list[dict[str, Any]], truncated: int = 0) -> Any:
    base = doc("firing.json")
    base.update(groupKey=group, alerts=alerts, truncatedAlerts=truncated)
    return parse_message(base)


def test_firing_mark_alert_marks_and_resolution_unmarks() -> None:
    nodes = NodeList("host-a", since=0)
    assert nodes.apply(parse_message(doc("firing.json")), MARK, now=10)
    assert not nodes.provisionable and nodes.since == 10
    assert [r.alertname for r in nodes.reasons()] == ["GpuguardNodeCannotGuaranteeDeadlines"]
    assert nodes.apply(parse_message(doc("resolved.json")), MARK, now=20)
    assert nodes.provisionable and nodes.since == 20 and nodes.reasons() == []


def test_repeated_delivery_is_idempotent() -> None:
    nodes = NodeList("host-a")
    message = parse_message(doc("firing.json"))
    assert nodes.apply(message, MARK, now=1)
    assert not nodes.apply(message, MARK, now=2)
    assert len(nodes.reasons()) == 1 and nodes.since == 1


def test_alert_absent_from_the_groups_latest_payload_no_longer_holds_the_node() -> None:
    nodes = NodeList("host-a")
    nodes.apply(
        payload(
            "g1",
            [alert("GpuguardTaskDeadlineAtRisk", "f1"), alert("GpuguardTaskDeadlineAtRisk", "f2")],
        ),
        MARK,
        1,
    )
    nodes.apply(payload("g1", [alert("GpuguardTaskDeadlineAtRisk", "f2")]), MARK, 2)
    assert [r.fingerprint for r in nodes.reasons()] == ["f2"]
    assert nodes.apply(payload("g1", []), MARK, 3)
    assert nodes.provisionable


def test_node_stays_marked_until_the_last_reason_of_every_group_resolves() -> None:
    nodes = NodeList("host-a")
    nodes.apply(payload("g1", [alert("GpuguardTaskDeadlineAtRisk", "f1")]), MARK, 1)
    nodes.apply(payload("g2", [alert("GpuguardNodeCannotGuaranteeDeadlines", "f9")]), MARK, 2)
    assert not nodes.apply(
        payload("g1", [alert("GpuguardTaskDeadlineAtRisk", "f1", "resolved")]), MARK, 3
    )
    assert not nodes.provisionable
    assert nodes.apply(
        payload("g2", [alert("GpuguardNodeCannotGuaranteeDeadlines", "f9", "resolved")]), MARK, 4
    )
    assert nodes.provisionable


def test_truncated_payload_clears_only_explicit_resolutions() -> None:
    nodes = NodeList("host-a")
    nodes.apply(
        payload(
            "g1",
            [alert("GpuguardTaskDeadlineAtRisk", "f1"), alert("GpuguardTaskDeadlineAtRisk", "f2")],
        ),
        MARK,
        1,
    )
    nodes.apply(
        payload("g1", [alert("GpuguardTaskDeadlineAtRisk", "f2", "resolved")], truncated=5), MARK, 2
    )
    assert [r.fingerprint for r in nodes.reasons()] == ["f1"]


def test_other_nodes_and_other_alerts_are_ignored() -> None:
    nodes = NodeList("host-a")
    assert not nodes.apply(
        payload("g", [alert("GpuguardTaskDeadlineAtRisk", "f1", node="host-b")]), MARK, 1
    )
    assert not nodes.apply(payload("g", [alert("GpuguardGpuSaturatedContention", "f2")]), MARK, 1)
    assert nodes.provisionable


def test_reason_keeps_its_first_since_and_survives_the_journal() -> None:
    nodes = NodeList("host-a")
    nodes.apply(payload("g1", [alert("GpuguardTaskDeadlineAtRisk", "f1")]), MARK, 5)
    first_since = nodes.reasons()[0].since
    later = alert("GpuguardTaskDeadlineAtRisk", "f1")
    later["startsAt"] = "2025-11-22T02:00:00Z"
    nodes.apply(payload("g1", [later]), MARK, 6)
    assert nodes.reasons()[0].since == first_since
    restored = NodeList.from_doc("host-a", copy.deepcopy(nodes.to_doc()))
    assert restored.to_doc() == nodes.to_doc()
    assert NodeList.from_doc("host-b", nodes.to_doc()).provisionable


def test_format_nodes_table() -> None:
    nodes = NodeList("host-a", since=0)
    nodes.apply(parse_message(doc("firing.json")), MARK, now=10)
    text = format_nodes(
        {"executor": "list_only", "note": "not in a swarm", "nodes": [nodes.to_doc()]}
    )
    lines = text.splitlines()
    assert lines[0].split() == ["NODE", "PROVISIONABLE", "SINCE", "REASONS"]
    assert "host-a" in lines[1] and "NO" in lines[1]
    assert "GpuguardNodeCannotGuaranteeDeadlines(11223344)" in lines[1]
    # in words, not the API's executor names (list_only: ...)
    assert lines[-1].startswith("This engine is in no Swarm: a node marked NO is only listed")
    assert "list_only" not in text
    swarm = format_nodes({"executor": "swarm", "note": "", "nodes": [nodes.to_doc()]})
    assert "gets the Swarm node label gpuguard.provisionable=false" in swarm


def test_a_mark_no_webhook_renews_expires() -> None:
    from gpuguard.actuator.nodemarks.nodelist import NodeList, Reason

    nodes = NodeList("node-a")
    nodes.groups["g"] = {
        "f1": Reason("GpuguardTaskDeadlineAtRisk", "f1", "g", since=100.0, seen=100.0)
    }
    assert not nodes.provisionable
    assert not nodes.expire(now=399.0, ttl=300.0)
    assert not nodes.provisionable
    assert nodes.expire(now=401.0, ttl=300.0)
    assert nodes.provisionable and nodes.since == 401.0


def test_a_late_older_snapshot_does_not_drop_a_newer_reason() -> None:
    # HA peers: the snapshot [f1] arrives after the newer [f1, f2] of the same group.
    nodes = NodeList("host-a")
    first = alert("GpuguardTaskDeadlineAtRisk", "f1")
    second = alert("GpuguardTaskDeadlineAtRisk", "f2")
    second["startsAt"] = "2025-11-22T01:00:30Z"
    nodes.apply(payload("g1", [first, second]), MARK, 2)
    assert not nodes.apply(payload("g1", [first]), MARK, 3)
    assert [r.fingerprint for r in nodes.reasons()] == ["f1", "f2"]
    # An explicit resolution still clears, and a partial message never drops by absence.
    resolved = alert("GpuguardTaskDeadlineAtRisk", "f2", "resolved")
    resolved["startsAt"], resolved["endsAt"] = second["startsAt"], "2025-11-22T01:01:00Z"
    nodes.apply(payload("g1", [first, resolved]), MARK, 4)
    assert [r.fingerprint for r in nodes.reasons()] == ["f1"]
    nodes.apply(payload("g1", []), MARK, 5, partial=True)
    assert [r.fingerprint for r in nodes.reasons()] == ["f1"]


def test_alert_order_drops_stale_deliveries() -> None:
    from gpuguard.actuator.alertorder import AlertOrder

    def one(status: str, starts: str, ends: str = "0001-01-01T00:00:00Z") -> Any:
        raw = alert("GpuguardTaskDeadlineAtRisk", "f1", status)
        raw.update(startsAt=starts, endsAt=ends)
        return payload("g", [raw]).alerts[0]

    order = AlertOrder()
    episode = "2025-11-22T01:00:00Z"
    assert order.fresh(one("firing", episode), 1)
    assert order.fresh(one("firing", episode), 2)  # a repeat
    assert order.fresh(one("resolved", episode, "2025-11-22T01:05:00Z"), 3)
    assert not order.fresh(one("firing", episode), 4)  # the late duplicate
    assert order.fresh(one("resolved", episode, "2025-11-22T01:05:00Z"), 5)
    assert order.fresh(one("firing", "2025-11-22T02:00:00Z"), 6)  # a new episode
    assert not order.fresh(one("resolved", episode, "2025-11-22T01:05:00Z"), 7)  # old one
    small = AlertOrder(keep_s=10, limit=4)
    for i in range(100):
        raw = alert("GpuguardTaskDeadlineAtRisk", f"fp{i}")
        small.fresh(payload("g", [raw]).alerts[0], float(i))
    assert len(small) <= 4
