"""Judging a replay from the workloads' own logs and the actuator's audit log (pure).

Real-time side: each request's latency (arrival to answer, the server's own log) against its
alone run and its deadline. Best-effort side: training steps the device ended per second,
against the ideal: its alone rate x (1 - the real-time servers' GPU share alone), the share
measured from the alone servers' own kernel spans. Freezes: the actuator's pause and
unpause records for each container.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Answered(Protocol):
    """A request as a server logged it (``RequestResult``)."""

    @property
    def arrival(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def gpu_start(self) -> float | None: ...
    @property
    def gpu_end(self) -> float | None: ...
    @property
    def met_deadline(self) -> bool | None: ...
    @property
    def id(self) -> int: ...


Span = tuple[float, float]


def merged(spans: Iterable[Span]) -> list[Span]:
    """Spans joined where they touch or overlap, in time order."""
    out: list[Span] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def covered(spans: Iterable[Span], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` that the spans cover."""
    return sum(max(0.0, min(e, end) - max(s, start)) for s, e in merged(spans))


def busy_share(requests: Iterable[Answered], start: float, end: float) -> float:
    """Share of ``[start, end]`` during which the servers' kernels ran (the device's own first
    and last kernel of each request): their GPU share when alone."""
    spans: list[Span] = []
    for r in requests:
        if r.gpu_start is not None and r.gpu_end is not None:
            spans.append((r.gpu_start, r.gpu_end))
    return covered(spans, start, end) / (end - start) if end > start else 0.0


def frozen_spans(audit: Iterable[dict[str, Any]], container: str, until: float) -> list[Span]:
    """When the actuator held ``container`` frozen: from each pause (the cgroup's freeze, or
    the action's end) to the unpause after it (its end); a pause never undone runs to
    ``until``."""
    actions = sorted(
        (float(r.get("frozen") or r.get("finished") or r["ts"]), r["action"])
        if r.get("action") == "pause"
        else (float(r.get("finished") or r["ts"]), r["action"])
        for r in audit
        if r.get("event") == "action" and r.get("container") == container
        and r.get("result") == "ok" and r.get("action") in ("pause", "unpause")
    )  # fmt: skip
    spans: list[Span] = []
    since: float | None = None
    for t, action in actions:
        if action == "pause" and since is None:
            since = t
        elif action == "unpause" and since is not None:
            spans.append((since, t))
            since = None
    if since is not None:
        spans.append((since, max(since, until)))
    return spans


def misses_from_freeze(
    requests: Iterable[Answered], frozen: Sequence[Span], shared: Iterable[Answered] | None = None
) -> int:
    """Requests that missed their deadline while their server was frozen during them; with
    ``shared`` (the same schedule's requests, unmanaged), only those that met it there: a
    request that misses shared as well is not the freeze's."""
    met_shared = None if shared is None else {r.id for r in shared if r.met_deadline}
    return sum(
        r.met_deadline is False
        and any(s < r.end and e > r.arrival for s, e in frozen)
        and (met_shared is None or r.id in met_shared)
        for r in requests
    )


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base <= 0:
        return None
    return round(value / base, 3)


@dataclass(frozen=True)
class Spread:
    """A figure over the windows: its median and its worst window."""

    median: float | None
    worst: float | None
    windows: int


def spread(values: Iterable[float | None], higher_is_worse: bool) -> Spread:
    """Median and worst of the windows that have the figure."""
    have = [v for v in values if v is not None and not math.isnan(v)]
    if not have:
        return Spread(None, None, 0)
    worst = max(have) if higher_is_worse else min(have)
    return Spread(round(statistics.median(have), 3), round(worst, 3), len(have))
