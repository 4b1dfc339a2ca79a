"""One Prometheus instant query over HTTP: the placer's records and the actuator's SLO signal.

Both read Prometheus the same way (``GET /api/v1/query``, a session that carries the
``--prometheus.http-config-file``'s TLS and basic auth, a timeout that bounds the whole
answer), and each turns a failure into its own error at its boundary; what a reply means is
theirs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import requests
import urllib3

#: A reply larger than this is refused (a 1,000-node cluster's records are about 10 MB).
MAX_REPLY_BYTES = 256 * 2**20
_CHUNK = 65536


class QueryFailed(Exception):
    """Prometheus did not answer the query with a result (one line: where, and why)."""


def instant_query(
    session: requests.Session,
    base_url: str,
    query: str,
    timeout_s: float,
    max_bytes: int = MAX_REPLY_BYTES,
) -> list[Mapping[str, Any]]:
    """The ``result`` of an instant query (a vector's samples or a matrix's series).

    ``timeout_s`` is a deadline on the whole answer: connecting, the head and the body. A
    reply still arriving then is cut (checked between reads, each of which waits at most
    ``timeout_s``), as is one beyond ``max_bytes``: QueryFailed."""
    url = base_url.rstrip("/") + "/api/v1/query"
    deadline = time.monotonic() + timeout_s
    try:
        with session.get(url, params={"query": query}, timeout=timeout_s, stream=True) as reply:
            raw = _body(reply, deadline, max_bytes, url, timeout_s)
        body = json.loads(raw)
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
        raise QueryFailed(f"prometheus at {url}: {type(exc).__name__}") from None
    if reply.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error", reply.status_code) if isinstance(body, dict) else "?"
        raise QueryFailed(f"prometheus at {url}: {str(error)[:200]}")
    try:
        result = body["data"]["result"]
    except (KeyError, TypeError):
        raise QueryFailed(f"prometheus at {url}: reply without data.result") from None
    if not isinstance(result, list):
        raise QueryFailed(f"prometheus at {url}: data.result is not a list")
    return result


def _body(
    reply: requests.Response, deadline: float, max_bytes: int, url: str, timeout_s: float
) -> bytes:
    """The reply's body, decoded (gzip), read one socket read at a time until the deadline."""
    raw = reply.raw
    # urllib3 2's read1 returns after one read of the socket; read(n) waits for n bytes
    read = getattr(raw, "read1", None) or raw.read
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise QueryFailed(f"prometheus at {url}: no whole answer within {timeout_s:g}s")
        chunk = read(_CHUNK, decode_content=True)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise QueryFailed(f"prometheus at {url}: reply larger than {max_bytes} bytes")
        chunks.append(chunk)


def label_value(text: str) -> str:
    """``text`` as a PromQL string literal (quotes and backslashes escaped)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
