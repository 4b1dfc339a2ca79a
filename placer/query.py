"""Strict parsing of the placer's query parameters (pure; docs/interfaces.md §9).

Every value is ASCII, bounded in length and finite; an unknown, repeated or empty parameter
is an error. A duration is gpuguard's one spelling (``gpuguard/units.py``: a Go duration,
``9s``, ``1500ms``, ``0.5s``, ``1m30s``); ``9``, ``9 s``, ``.5s`` and ``1e3s`` are refused, so
what a client sent means one thing. A deadline is at least ``MIN_DEADLINE_S``. Memory is a
byte size, Kubernetes quantities included (``2GiB``, ``20Gi``, ``20G``, ``1073741824``).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import parse_qsl

from gpuguard import units
from gpuguard.placer.errors import BadRequest
from gpuguard.placer.ranking import Policy, Request

MAX_QUERY = 1024
MAX_VALUE = 64
MAX_DURATION_S = 86_400.0  # a day: no real-time task waits longer
#: The exporter's shortest --poll.interval: a deadline shorter than one poll can never be seen
#: met, so it only ranks a request as no GPU can serve it (1e-13 s was taken before).
MIN_DEADLINE_S = 0.01
MAX_MEMORY = 2**50  # 1 PiB
_MODEL = re.compile(r"^[A-Za-z0-9 ._()/+-]{1,64}$")
PLACEMENT_PARAMS = ("deadline", "memory", "runtime", "gpu_model", "policy")


@dataclass(frozen=True, slots=True)
class Query:
    request: Request
    policy: Policy | None  # None: the placer's --placement.policy


def parse_query(
    text: str,
    required: Collection[str] = ("deadline", "memory"),
    allowed: Collection[str] = PLACEMENT_PARAMS,
) -> Query:
    """The request a query string asks for; BadRequest with one line when it is invalid."""
    if len(text) > MAX_QUERY:
        raise BadRequest(f"query longer than {MAX_QUERY} characters")
    if not text.isascii():
        raise BadRequest("query must be ASCII")
    try:
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text))
    except ValueError:
        raise BadRequest("malformed query string") from None
    params: dict[str, str] = {}
    for key, value in pairs:
        if key not in allowed:
            raise BadRequest(f"unknown parameter {key[:MAX_VALUE]!r}")
        if key in params:
            raise BadRequest(f"parameter {key} given twice")
        if not value or len(value) > MAX_VALUE or not value.isascii():
            raise BadRequest(f"{key}: must be 1 to {MAX_VALUE} ASCII characters")
        params[key] = value
    missing = [name for name in required if name not in params]
    if missing:
        raise BadRequest(f"missing parameter {missing[0]} (e.g. deadline=9s&memory=2GiB)")
    request = Request(
        deadline_s=(
            query_duration("deadline", params["deadline"], MIN_DEADLINE_S)
            if "deadline" in params
            else 0.0
        ),
        memory_bytes=parse_memory(params["memory"]) if "memory" in params else 0,
        runtime_s=query_duration("runtime", params["runtime"]) if "runtime" in params else None,
        gpu_model=_model(params["gpu_model"]) if "gpu_model" in params else None,
    )
    return Query(request, _policy(params["policy"]) if "policy" in params else None)


def parse_duration(name: str, text: str) -> float:
    """Seconds from a duration as container labels write it (a bare number is seconds), at
    most a day; BadRequest naming ``name`` when invalid."""
    try:
        seconds = units.parse_duration(text, bare_seconds=True)
    except units.UnitError as exc:
        raise BadRequest(f"{name}: {exc}") from None
    if seconds > MAX_DURATION_S:
        raise BadRequest(f"{name}: at most {MAX_DURATION_S:g}s")
    return seconds


def query_duration(name: str, text: str, minimum: float = 0.0) -> float:
    """Seconds from a duration with its unit (``9s``, ``1500ms``, ``1m30s``), more than 0 and
    at least ``minimum``, at most a day; BadRequest naming ``name`` otherwise."""
    try:
        seconds = units.parse_duration(text)
    except units.NotPositive:
        seconds = 0.0
    except units.UnitError as exc:
        raise BadRequest(f"{name} {text[:MAX_VALUE]!r}: {exc.why}") from None
    if seconds <= 0 or seconds < minimum:
        floor = f"at least {minimum * 1000:g}ms" if minimum else "more than 0"
        raise BadRequest(f"{name} {text!r}: must be {floor}")
    if seconds > MAX_DURATION_S:
        raise BadRequest(f"{name} {text!r}: at most {MAX_DURATION_S:g}s")
    return seconds


def parse_memory(text: str, name: str = "memory") -> int:
    """Bytes from a byte size (``2GiB``, ``20Gi``, ``20G``, ``1073741824``), more than 0 and
    at most 1 PiB; BadRequest naming ``name`` when invalid."""
    try:
        value = units.parse_bytes(text)
    except units.UnitError as exc:
        raise BadRequest(f"{name}: {exc}") from None
    if not 0 < value <= MAX_MEMORY:
        raise BadRequest(f"{name} {text!r}: must be more than 0 and at most 1 PiB")
    return value


def _model(text: str) -> str:
    if not _MODEL.match(text):
        raise BadRequest("gpu_model: letters, digits, spaces and ._()/+- only")
    return text


def _policy(text: str) -> Policy:
    try:
        return Policy(text)
    except ValueError:
        choices = ", ".join(p.value for p in Policy)
        raise BadRequest(f"policy {text!r}: must be one of {choices}") from None
