"""Strict parsing of Alertmanager webhook payloads (fixtures in tests/fixtures/alertmanager)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpuguard.actuator.errors import PayloadError
from gpuguard.actuator.webhook import parse_body, parse_message, parse_rfc3339

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def test_firing_payload_parses_into_the_message_shape() -> None:
    message = parse_message(load("firing.json"))
    assert message.version == "4"
    assert message.group_key == '{}:{node="host-a"}'
    assert message.status == "firing"
    assert message.truncated_alerts == 0
    assert message.receiver == "gpuguard-actuator"
    assert message.external_url == "http://127.0.0.1:9093"
    assert message.group_labels == {"node": "host-a"}
    first = message.alerts[0]
    assert first.name == "GpuguardGpuSaturatedContention"
    assert first.firing
    assert first.labels["gpu"] == "0"
    assert first.fingerprint == "4a5b6c7d8e9f0a1b"
    assert first.starts_at == datetime(2025, 11, 22, 1, 2, 3, 123456, tzinfo=UTC)
    assert first.ends_at.year == 1  # Go's zero time: still firing


def test_resolved_and_truncated_payloads() -> None:
    resolved = parse_message(load("resolved.json"))
    assert resolved.status == "resolved" and not resolved.alerts[0].firing
    assert parse_message(load("truncated.json")).truncated_alerts == 3


def test_dataclasses_are_frozen() -> None:
    message = parse_message(load("firing.json"))
    with pytest.raises(AttributeError):
        message.status = "resolved"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fixture", "needle"),
    [
        ("wrong_version.json", "unsupported webhook version '3'"),
        ("malformed_missing_fingerprint.json", "payload.alerts[0].fingerprint is required"),
        ("malformed_types.json", "truncatedAlerts must be an integer"),
    ],
)
def test_malformed_fixtures_are_rejected_with_a_clear_message(fixture: str, needle: str) -> None:
    with pytest.raises(PayloadError, match=re.escape(needle)):
        parse_message(load(fixture))


def mutate(path: list[str | int], value: Any, delete: bool = False) -> Any:
    doc = load("firing.json")
    target = doc
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "delete", "needle"),
    [
        (["groupKey"], None, True, "payload.groupKey is required"),
        (["groupKey"], "", False, "payload.groupKey must not be empty"),
        (["status"], "pending", False, "payload.status must be 'firing' or 'resolved'"),
        (["receiver"], 5, False, "payload.receiver must be a string"),
        (["alerts"], {}, False, "payload.alerts must be a list"),
        (["commonLabels"], None, True, "payload.commonLabels is required"),
        (["groupLabels", "node"], 1, False, "payload.groupLabels.node must be a string"),
        (["externalURL"], None, True, "payload.externalURL is required"),
        (["truncatedAlerts"], True, False, "truncatedAlerts must be an integer"),
        (["alerts", 0, "labels", "alertname"], None, True, "labels.alertname is required"),
        (["alerts", 0, "startsAt"], "yesterday", False, "startsAt is not an RFC 3339 time"),
        (["alerts", 0, "endsAt"], None, True, "payload.alerts[0].endsAt is required"),
        (["alerts", 0, "generatorURL"], None, True, "generatorURL is required"),
        (["alerts", 0, "annotations"], [], False, "annotations must be an object"),
        (["alerts", 0, "status"], "FIRING", False, "alerts[0].status must be"),
        (["alerts", 1], "oops", False, "payload.alerts[1] must be a JSON object"),
    ],
)
def test_each_required_field_is_checked(
    path: list[str | int], value: Any, delete: bool, needle: str
) -> None:
    with pytest.raises(PayloadError, match=re.escape(needle)):
        parse_message(mutate(path, value, delete))


def test_payload_must_be_an_object() -> None:
    with pytest.raises(PayloadError, match="payload must be a JSON object"):
        parse_message([load("firing.json")])


def test_unknown_extra_fields_are_ignored() -> None:
    doc = load("firing.json")
    doc["orgId"] = 1
    doc["alerts"][0]["silenceURL"] = "http://x"
    assert parse_message(doc).alerts[0].name == "GpuguardGpuSaturatedContention"


def test_non_json_body_is_told_apart_from_an_invalid_payload() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        parse_body((FIXTURES / "not_json.txt").read_bytes())
    with pytest.raises(ValueError, match="not JSON"):
        parse_body(b"\xff\xfe")
    assert parse_body(b"{}") == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-11-22T01:02:03Z", datetime(2025, 11, 22, 1, 2, 3, tzinfo=UTC)),
        (
            "2025-11-22T03:02:03.5+02:00",
            datetime(2025, 11, 22, 1, 2, 3, 500000, tzinfo=UTC),
        ),
        (
            "2025-11-22T01:02:03.123456789Z",
            datetime(2025, 11, 22, 1, 2, 3, 123456, tzinfo=UTC),
        ),
    ],
)
def test_rfc3339_times(text: str, expected: datetime) -> None:
    assert parse_rfc3339(text) == expected


@pytest.mark.parametrize("text", ["2025-11-22 01:02:03Z", "2025-11-22T01:02:03", "now", ""])
def test_bad_rfc3339_times(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rfc3339(text)


def firing_with(**changes: Any) -> dict[str, Any]:
    doc = load("firing.json")
    alert = doc["alerts"][0]
    for key, value in changes.items():
        if key == "gpu":
            alert["labels"]["gpu"] = value
        else:
            alert[key] = value
    return doc


def test_json_nested_a_thousand_deep_is_an_invalid_payload() -> None:
    with pytest.raises(PayloadError, match="nests too deeply"):
        parse_body(b"[" * 100_000 + b"]" * 100_000)


@pytest.mark.parametrize("moment", ["9999-12-31T23:59:59-23:59", "9999-12-31T23:59:59.5-00:01"])
def test_times_past_the_representable_range_are_invalid(moment: str) -> None:
    with pytest.raises(PayloadError, match="startsAt"):
        parse_message(firing_with(startsAt=moment))


@pytest.mark.parametrize("label", ["²", "1" * 5000, "GPU-0", "-1", "0:x"])
def test_gpu_label_must_be_an_index(label: str) -> None:
    with pytest.raises(PayloadError, match=r"labels\.gpu"):
        parse_message(firing_with(gpu=label))


def test_gpu_label_of_a_mig_device_names_its_gpu() -> None:
    assert parse_message(firing_with(gpu="1:2")).alerts[0].gpu == 1
    assert parse_message(firing_with(gpu="3")).alerts[0].gpu == 3
    doc = firing_with()
    del doc["alerts"][0]["labels"]["gpu"]
    assert parse_message(doc).alerts[0].gpu is None
