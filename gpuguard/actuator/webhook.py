"""Strict parsing of Alertmanager's webhook message (version 4) into frozen dataclasses.

The shape mirrors Alertmanager's ``notify/webhook.Message`` (``template.Data`` plus
``version``, ``groupKey``, ``truncatedAlerts``). Every field Alertmanager always sends is
required with its JSON type; nothing gets a lenient default, so a malformed or foreign payload
is a 400 with a message naming the field, never an action taken on guessed data. Unknown extra
keys are ignored: newer Alertmanagers may add fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuguard.actuator.errors import PayloadError
from gpuguard.labels import LabelError, parse_gpu

SUPPORTED_VERSION = "4"
STATUSES = ("firing", "resolved")

# Go's time.Time marshals as RFC 3339 with up to nanoseconds; Python keeps microseconds.
_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$")


@dataclass(frozen=True)
class Alert:
    """One alert of a group, as Alertmanager sends it."""

    status: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: datetime
    ends_at: datetime
    generator_url: str
    fingerprint: str
    #: the ``gpu`` label as a GPU index (a MIG device's parent), None without the label
    gpu: int | None = None

    @property
    def name(self) -> str:
        """The ``alertname`` label (required by the parser)."""
        return self.labels["alertname"]

    @property
    def firing(self) -> bool:
        return self.status == "firing"


@dataclass(frozen=True)
class WebhookMessage:
    """One POST from Alertmanager: the latest snapshot of one alert group (``group_key``)."""

    version: str
    group_key: str
    truncated_alerts: int
    status: str
    receiver: str
    group_labels: Mapping[str, str]
    common_labels: Mapping[str, str]
    common_annotations: Mapping[str, str]
    external_url: str
    alerts: tuple[Alert, ...]


def parse_body(body: bytes) -> Any:
    """Decode a request body as JSON; ``ValueError`` when it is not JSON (HTTP 415),
    ``PayloadError`` when it nests deeper than the parser's recursion allows (HTTP 400)."""
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise PayloadError("payload nests too deeply") from None


def parse_message(doc: Any) -> WebhookMessage:
    """Validate a decoded webhook document; raises ``PayloadError`` naming the bad field."""
    obj = _object(doc, "payload")
    version = _str(obj, "version", "payload")
    if version != SUPPORTED_VERSION:
        raise PayloadError(f"unsupported webhook version {version!r} (want {SUPPORTED_VERSION!r})")
    truncated = _field(obj, "truncatedAlerts", "payload")
    if not isinstance(truncated, int) or isinstance(truncated, bool) or truncated < 0:
        raise PayloadError("payload.truncatedAlerts must be an integer >= 0")
    alerts_doc = _field(obj, "alerts", "payload")
    if not isinstance(alerts_doc, list):
        raise PayloadError("payload.alerts must be a list")
    return WebhookMessage(
        version=version,
        group_key=_str(obj, "groupKey", "payload", nonempty=True),
        truncated_alerts=truncated,
        status=_status(obj, "payload"),
        receiver=_str(obj, "receiver", "payload"),
        group_labels=_labels(obj, "groupLabels", "payload"),
        common_labels=_labels(obj, "commonLabels", "payload"),
        common_annotations=_labels(obj, "commonAnnotations", "payload"),
        external_url=_str(obj, "externalURL", "payload"),
        alerts=tuple(_alert(item, f"payload.alerts[{i}]") for i, item in enumerate(alerts_doc)),
    )


def _alert(doc: Any, where: str) -> Alert:
    obj = _object(doc, where)
    labels = _labels(obj, "labels", where)
    if not labels.get("alertname"):
        raise PayloadError(f"{where}.labels.alertname is required")
    return Alert(
        status=_status(obj, where),
        labels=labels,
        annotations=_labels(obj, "annotations", where),
        starts_at=_time(obj, "startsAt", where),
        ends_at=_time(obj, "endsAt", where),
        generator_url=_str(obj, "generatorURL", where),
        fingerprint=_str(obj, "fingerprint", where, nonempty=True),
        gpu=_gpu(labels, where),
    )


def _gpu(labels: Mapping[str, str], where: str) -> int | None:
    text = labels.get("gpu")
    if text is None:
        return None
    try:
        return parse_gpu(text)
    except LabelError as exc:
        raise PayloadError(f"{where}.labels.gpu: {exc}") from None


def _object(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise PayloadError(f"{where} must be a JSON object, got {type(doc).__name__}")
    return doc


def _field(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise PayloadError(f"{where}.{key} is required")
    return obj[key]


def _str(obj: dict[str, Any], key: str, where: str, nonempty: bool = False) -> str:
    value = _field(obj, key, where)
    if not isinstance(value, str):
        raise PayloadError(f"{where}.{key} must be a string, got {type(value).__name__}")
    if nonempty and not value:
        raise PayloadError(f"{where}.{key} must not be empty")
    return value


def _status(obj: dict[str, Any], where: str) -> str:
    status = _str(obj, "status", where)
    if status not in STATUSES:
        raise PayloadError(f"{where}.status must be 'firing' or 'resolved', got {status!r}")
    return status


def _labels(obj: dict[str, Any], key: str, where: str) -> Mapping[str, str]:
    value = _field(obj, key, where)
    if not isinstance(value, dict):
        raise PayloadError(f"{where}.{key} must be an object of strings")
    for name, text in value.items():
        if not isinstance(text, str):
            raise PayloadError(f"{where}.{key}.{name} must be a string")
    return dict(value)


def _time(obj: dict[str, Any], key: str, where: str) -> datetime:
    text = _str(obj, key, where)
    try:
        return parse_rfc3339(text)
    except ValueError:
        raise PayloadError(f"{where}.{key} is not an RFC 3339 time: {text!r}") from None


def parse_rfc3339(text: str) -> datetime:
    """Parse Go's RFC 3339 (nanosecond) times; Go's zero time is year 1, which is valid."""
    match = _RFC3339.match(text)
    if match is None:
        raise ValueError(text)
    base, fraction, zone = match.groups()
    micro = (fraction or "").ljust(6, "0")[:6]
    offset = "+00:00" if zone == "Z" else zone
    try:
        parsed = datetime.fromisoformat(f"{base}.{micro}{offset}")
        return parsed.astimezone(UTC) if parsed.year > 1 else parsed
    except OverflowError:  # e.g. year 9999 with a negative offset: past datetime.max in UTC
        raise ValueError(text) from None
