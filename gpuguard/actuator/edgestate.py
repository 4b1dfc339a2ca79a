"""The last state read with ``gpu_busy`` edges applied: what the fast path decides on before
its fresh read. Pure.

Why: docs/design-notes.md, "From an edge to frozen: one hop, consistent state".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuguard.actuator.state import Activity, Event, ExporterState
from gpuguard.contract import ActivitySource, EventType


def with_busy_edges(state: ExporterState, events: Sequence[Event]) -> ExporterState | None:
    """``state`` with each ``gpu_busy`` event's container busy since the event (a kernel in
    flight, seen by the event's source); None unless every event is a ``gpu_busy`` from the
    probe or a gauge of a container that ``state`` knows, so nothing else is assumed."""
    if not events or any(e.type != EventType.GPU_BUSY for e in events):
        return None
    edges: dict[str, Event] = {}
    for event in events:
        exact = event.source in (ActivitySource.LAUNCH, ActivitySource.GAUGE)
        if not exact or state.container(event.container_id) is None:
            return None
        assert event.container_id is not None
        first = edges.setdefault(event.container_id, event)
        if event.ts < first.ts:
            edges[event.container_id] = event
    containers = []
    for c in state.containers:
        edge = edges.get(c.id)
        seen = c.activity if c.activity is not None and c.activity.exact else None
        if edge is not None and not (seen is not None and seen.busy):
            # a container's first calls come before any state read shows it seen exactly
            seen = seen or Activity(str(edge.source))
            c = replace(c, activity=replace(seen, busy=True, busy_since=edge.ts, in_flight=True))
        containers.append(c)
    return replace(state, containers=tuple(containers))
