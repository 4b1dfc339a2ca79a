"""The journal's document, every field checked once, where it is loaded (pure).

Why: docs/design-notes.md, "The journal's document".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

FORMAT_VERSION = 1
MAX_ID = 256
MAX_TEXT = 1024
MAX_GPU = 10**6
_PAUSED_FIELDS = ("container_id", "name", "task_id", "gpu", "paused_at", "reason")
_PAUSED_OPTIONAL = ("paused_boot", "boot_id")
_REASON_FIELDS = ("alertname", "fingerprint", "group_key", "since", "seen")


@dataclass(frozen=True)
class PausedEntry:
    """A container this actuator paused (or is about to pause).

    ``paused_at`` is wall time (for people and the audit log); ``paused_boot`` is the same
    moment on the host's boot clock (``CLOCK_BOOTTIME``), which no NTP step or operator
    moves, and ``boot_id`` the boot it belongs to: ``--max-pause`` is judged by them
    (``pauseclock``). Both are None in journals written before they existed.
    """

    container_id: str
    name: str
    task_id: str | None
    gpu: int | None
    paused_at: float
    reason: str
    paused_boot: float | None = None
    boot_id: str | None = None


@dataclass
class JournalContent:
    """The valid part of a journal document, and what was wrong with the rest."""

    paused: dict[str, PausedEntry] = field(default_factory=dict)
    admitted: dict[str, float] = field(default_factory=dict)
    exempt_tasks: dict[str, float] = field(default_factory=dict)
    nodes: dict[str, Any] = field(default_factory=dict)
    resolved_alerts: dict[str, list[Any]] = field(default_factory=dict)
    fail_open: dict[str, float] = field(default_factory=dict)
    max_pause_s: float | None = None
    lost: str | None = None
    problems: list[str] = field(default_factory=list)

    def summary(self, shown: int = 3) -> str:
        """The problems on one line (the first few, and how many more)."""
        text = "; ".join(self.problems[:shown])
        more = len(self.problems) - shown
        return text + (f" (and {more} more)" if more > 0 else "")


def check(doc: Mapping[str, Any]) -> JournalContent:
    """Every field of a journal document (already known to be a version-1 mapping)."""
    out = JournalContent()
    out.paused = _mapping(doc, "paused", out.problems, _paused_entry)
    out.admitted = _mapping(doc, "admitted", out.problems, _instant)
    out.exempt_tasks = _mapping(doc, "exempt_tasks", out.problems, _instant)
    out.nodes, legacy_resolved = _nodes(doc.get("nodes"), out.problems)
    alerts = doc.get("alerts", {})
    if not isinstance(alerts, dict):
        out.problems.append(f"alerts: must be a mapping, got {_kind(alerts)}")
        alerts = {}
    out.resolved_alerts = _mapping(alerts, "resolved", out.problems, _episode, "alerts.")
    if "resolved" not in alerts:  # written before alerts had a place of their own
        out.resolved_alerts = legacy_resolved
    out.fail_open = _mapping(alerts, "fail_open", out.problems, _instant, "alerts.")
    max_pause = doc.get("max_pause_s")
    if max_pause is not None:
        if _finite(max_pause) and max_pause > 0:
            out.max_pause_s = float(max_pause)
        else:
            out.problems.append(f"max_pause_s: must be a positive number, got {_shown(max_pause)}")
    lost = doc.get("lost")
    if lost is not None:
        if isinstance(lost, str):
            out.lost = lost[:MAX_TEXT]
        else:
            out.problems.append(f"lost: must be text, got {_kind(lost)}")
    return out


def _mapping(
    doc: Mapping[str, Any],
    name: str,
    problems: list[str],
    item: Callable[[str, Any], Any],
    prefix: str = "",
) -> dict[str, Any]:
    """``doc[name]`` as {str: checked item}; a bad item is left out with its problem."""
    value = doc.get(name, {})
    if not isinstance(value, dict):
        problems.append(f"{prefix}{name}: must be a mapping, got {_kind(value)}")
        return {}
    good = {}
    for key, raw in value.items():
        try:
            if not isinstance(key, str) or not 0 < len(key) <= MAX_ID:
                raise ValueError(f"key must be 1 to {MAX_ID} characters")
            good[key] = item(key, raw)
        except (ValueError, TypeError) as exc:
            problems.append(f"{prefix}{name} {str(key)[:64]!r}: {exc}")
    return good


def _paused_entry(key: str, raw: Any) -> PausedEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"must be a mapping, got {_kind(raw)}")
    missing = [f for f in _PAUSED_FIELDS if f not in raw]
    unknown = sorted(set(raw) - set(_PAUSED_FIELDS) - set(_PAUSED_OPTIONAL))
    if missing or unknown:
        raise ValueError(f"missing {missing}, unknown {unknown}")
    if raw["container_id"] != key:
        raise ValueError("container_id is not its key")
    gpu = raw["gpu"]
    if gpu is not None and (type(gpu) is not int or not 0 <= gpu < MAX_GPU):
        raise ValueError(f"gpu must be an index or null, got {_shown(gpu)}")
    if not _finite(raw["paused_at"]):
        raise ValueError(f"paused_at must be a finite number, got {_shown(raw['paused_at'])}")
    boot = raw.get("paused_boot")
    if boot is not None and not _finite(boot):
        raise ValueError(f"paused_boot must be a finite number or null, got {_shown(boot)}")
    return PausedEntry(
        container_id=key,
        name=_text(raw["name"], "name"),
        task_id=None if raw["task_id"] is None else _text(raw["task_id"], "task_id"),
        gpu=gpu,
        paused_at=float(raw["paused_at"]),
        reason=_text(raw["reason"], "reason"),
        paused_boot=None if boot is None else float(boot),
        boot_id=None if raw.get("boot_id") is None else _text(raw["boot_id"], "boot_id"),
    )


def _instant(key: str, raw: Any) -> float:
    if not _finite(raw):
        raise ValueError(f"must be a finite number, got {_shown(raw)}")
    return float(raw)


def _episode(key: str, raw: Any) -> list[Any]:
    """A resolved alert episode: [startsAt (ISO 8601 with its offset), seen (epoch)]."""
    if not isinstance(raw, list) or len(raw) != 2:
        raise ValueError("must be [startsAt, seen]")
    starts, seen = raw
    if not isinstance(starts, str) or len(starts) > 64:
        raise ValueError("startsAt must be an ISO 8601 time")
    parsed = datetime.fromisoformat(starts)  # ValueError when it is not one
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValueError(f"startsAt {starts!r} has no timezone")
    if not _finite(seen):
        raise ValueError(f"seen must be a finite number, got {_shown(seen)}")
    return [starts, float(seen)]


def _nodes(raw: Any, problems: list[str]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The node list (``nodes.NodeList.to_doc``) and, from older journals, the resolved
    alert episodes that were kept in it."""
    if raw is None or raw == {}:
        return {}, {}
    if not isinstance(raw, dict):
        problems.append(f"nodes: must be a mapping, got {_kind(raw)}")
        return {}, {}
    legacy = _mapping(raw, "resolved_alerts", problems, _episode, "nodes.")
    node = raw.get("node")
    if not isinstance(node, str) or not 0 < len(node) <= MAX_ID:
        problems.append(f"nodes.node: must be a node name, got {_shown(node)}")
        return {}, legacy
    clean: dict[str, Any] = {"node": node}
    if "since" in raw:
        if _finite(raw["since"]):
            clean["since"] = float(raw["since"])
        else:
            problems.append(f"nodes.since: must be a finite number, got {_shown(raw['since'])}")
    reasons = raw.get("reasons", [])
    if not isinstance(reasons, list):
        problems.append(f"nodes.reasons: must be a list, got {_kind(reasons)}")
        reasons = []
    clean["reasons"] = []
    for index, reason in enumerate(reasons):
        try:
            clean["reasons"].append(_reason(reason))
        except (ValueError, TypeError) as exc:
            problems.append(f"nodes.reasons[{index}]: {exc}")
    return clean, legacy


def _reason(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict) or set(raw) != set(_REASON_FIELDS):
        raise ValueError(f"must have exactly {', '.join(_REASON_FIELDS)}")
    for name in ("since", "seen"):
        if not _finite(raw[name]):
            raise ValueError(f"{name} must be a finite number, got {_shown(raw[name])}")
    return {
        "alertname": _text(raw["alertname"], "alertname"),
        "fingerprint": _text(raw["fingerprint"], "fingerprint"),
        "group_key": _text(raw["group_key"], "group_key"),
        "since": float(raw["since"]),
        "seen": float(raw["seen"]),
    }


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"{name} must be text, got {_kind(value)}")
    return value


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "text", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
