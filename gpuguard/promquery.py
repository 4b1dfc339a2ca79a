"""One Prometheus instant query over HTTP: the placer's records and the actuator's SLO signal.

Both read Prometheus the same way (``GET /api/v1/query``, a session that carries the
``--prometheus.http-config-file``'s TLS and basic auth, a timeout), and each turns a failure
into its own error at its boundary; what a reply means is theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests


class QueryFailed(Exception):
    """Prometheus did not answer the query with a result (one line: where, and why)."""


def instant_query(
    session: requests.Session, base_url: str, query: str, timeout_s: float
) -> list[Mapping[str, Any]]:
    """The ``result`` of an instant query (a vector's samples or a matrix's series)."""
    url = base_url.rstrip("/") + "/api/v1/query"
    try:
        reply = session.get(url, params={"query": query}, timeout=timeout_s)
        body = reply.json()
    except (requests.RequestException, ValueError) as exc:
        raise QueryFailed(f"prometheus at {url}: {type(exc).__name__}") from None
    if reply.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error", reply.status_code) if isinstance(body, dict) else "?"
        raise QueryFailed(f"prometheus at {url}: {error}")
    try:
        result = body["data"]["result"]
    except (KeyError, TypeError):
        raise QueryFailed(f"prometheus at {url}: reply without data.result") from None
    if not isinstance(result, list):
        raise QueryFailed(f"prometheus at {url}: data.result is not a list")
    return result


def label_value(text: str) -> str:
    """``text`` as a PromQL string literal (quotes and backslashes escaped)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
