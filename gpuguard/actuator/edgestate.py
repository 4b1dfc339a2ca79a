"""The last state read with ``gpu_busy`` and ``gpu_idle`` edges applied: what the fast path
decides on before its fresh read. Pure.

Why: docs/design-notes.md, "From an edge to frozen: one hop, consistent state".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from gpuguard.actuator.state import Activity, Container, Event, ExporterState
from gpuguard.contract import ActivitySource, EventType

EDGE_TYPES = frozenset({EventType.GPU_BUSY, EventType.GPU_IDLE})


def with_edges(state: ExporterState, events: Sequence[Event]) -> ExporterState | None:
    """``state`` with each container's edges applied in order: a ``gpu_busy`` makes it busy
    since the edge (a kernel in flight), a ``gpu_idle`` idle since the edge with its task
    ended there (from the event's ``busy_since``, else the busy period the state shows, else
    the edge itself). None unless every event is such an edge, from the probe or a gauge, of
    a container that ``state`` knows, so nothing else is assumed."""
    if not events or any(e.type not in EDGE_TYPES for e in events):
        return None
    known = {c.id for c in state.containers}
    exact = (ActivitySource.LAUNCH, ActivitySource.GAUGE)
    if any(e.source not in exact or e.container_id not in known for e in events):
        return None
    by_container: dict[str | None, list[Event]] = {}
    for event in sorted(events, key=_order):
        by_container.setdefault(event.container_id, []).append(event)
    containers = []
    for c in state.containers:
        for event in by_container.get(c.id, ()):
            c = _applied(c, event)
        containers.append(c)
    return replace(state, containers=tuple(containers))


def _order(event: Event) -> tuple[float, int]:
    return event.ts, event.seq


def _applied(container: Container, edge: Event) -> Container:
    seen = container.activity
    if seen is not None and not seen.exact:
        seen = None
    if edge.type == EventType.GPU_BUSY:
        if seen is not None and seen.busy:
            return container  # already busy: its first launch stands
        # a container's first calls come before any state read shows it seen exactly
        seen = seen or Activity(str(edge.source))
        activity = replace(seen, busy=True, busy_since=edge.ts, in_flight=True)
    else:
        seen = seen or Activity(str(edge.source))
        start = edge.busy_since if edge.busy_since is not None else seen.busy_since
        if start is None or not math.isfinite(start):
            start = edge.ts
        start = min(start, edge.ts)
        activity = replace(
            seen, busy=False, busy_since=None, in_flight=False, last_task=(start, edge.ts)
        )
    return replace(container, activity=activity)
