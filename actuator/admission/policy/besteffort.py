"""Best-effort containers beside real-time work, by ``--policy.best-effort-control``
(``hold``: freezes, holds and a starvation share; ``rate``: duty cycles). Pure.

Why: docs/design-notes.md, "Best-effort freezes".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuguard.actuator.admission.policy.edges import NVML_SAMPLE_S, Edges, thaw_after_s
from gpuguard.actuator.admission.policy.views import TaskView, skip_for, step_for
from gpuguard.actuator.decision import (
    PAUSE,
    UNPAUSE,
    DutyCycle,
    Ledger,
    PolicyConfig,
    RateLaw,
    Recent,
    Skip,
    Step,
)
from gpuguard.actuator.state import DeviceKey, ExporterState
from gpuguard.contract import StepReason, TaskBoundary


def light_servers(state: ExporterState, coexist_demand: float) -> set[str]:
    """Real-time containers a best-effort neighbour is not frozen for: their busy periods
    merge requests NVML's samples cannot separate (a ``merged`` task, running or in the
    recent history), and they need at most ``coexist_demand`` of the device. gpuguard can only
    schedule such a server as a whole, and freezing the neighbour for all its busy time
    would cost the neighbour far more than time-slicing costs the server (measured:
    ``bench/realtime.py`` scenario (c)); its own latency SLO (``protect_slo``) says when
    the server needs the device to itself after all."""
    merged = {t.container_id for t in state.recent if t.boundary == TaskBoundary.MERGED}
    merged |= {t.container_id for t in state.tasks if t.boundary == TaskBoundary.MERGED}
    return {
        c.id
        for c in state.containers
        if c.id in merged and c.demand_sm_ratio is not None and c.demand_sm_ratio <= coexist_demand
    }


@dataclass
class BestEffortPlan:
    steps: list[Step] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    due: list[float] = field(default_factory=list)
    #: rate control: the duty cycle of each device where one runs
    cycles: dict[DeviceKey, DutyCycle] = field(default_factory=dict)


def _by_container(views: Sequence[TaskView]) -> dict[str, list[TaskView]]:
    by_container: dict[str, list[TaskView]] = {}
    for v in views:
        if v.cid is not None:
            by_container.setdefault(v.cid, []).append(v)
    return by_container


def plan_best_effort(
    views: Sequence[TaskView],
    realtime: frozenset[DeviceKey],
    now: float,
    config: PolicyConfig,
    ledger: Ledger,
    recent: Recent,
    slo_pressure: frozenset[DeviceKey] = frozenset(),
) -> BestEffortPlan:
    """Freeze best-effort containers while real-time work needs one of their devices (or a
    real-time SLO fails on one of them), hold the freeze past its last activity, and keep
    the minimum share of every window."""
    plan = BestEffortPlan()
    window = config.best_effort_window_s
    for cid, mine in _by_container(views).items():
        v = mine[0]
        devices = {m.task.device for m in mine}
        hold = recent.hold_s.get(cid, config.best_effort_hold_s)
        protecting = bool(devices & slo_pressure)
        share = config.slo_best_effort_min_share if protecting else config.best_effort_min_share
        limit = (1 - share) * window  # most frozen time in any window
        if not devices & realtime and not protecting:
            last_seen = max(recent.realtime_seen.get(d, -math.inf) for d in devices)
            if v.ours and now - last_seen < hold:
                plan.due.append(last_seen + hold)  # real-time work paused for a moment
            elif v.ours:
                plan.steps.append(step_for(UNPAUSE, v, StepReason.REALTIME_IDLE))
            continue
        why = StepReason.SLO_PRESSURE if protecting else StepReason.BEST_EFFORT
        if v.blocker:
            if not v.paused:
                plan.skips.append(skip_for(v, v.blocker, "best-effort, but cannot be paused"))
            continue
        if share <= 0:
            if not v.paused:
                plan.steps.append(step_for(PAUSE, v, why))
            continue
        frozen = frozen_in_window(
            recent.frozen_spans.get(cid, ()), ledger.paused.get(cid), now, window
        )
        if v.ours:
            if frozen >= limit:
                plan.steps.append(step_for(UNPAUSE, v, StepReason.BEST_EFFORT_SHARE))
            else:
                plan.due.append(now + (limit - frozen))
        elif not v.paused:
            room = limit - frozen
            if room >= hold:
                plan.steps.append(step_for(PAUSE, v, why))
            else:
                plan.due.append(now + (hold - room))  # the window slides at most 1 s/s
    return plan


def plan_best_effort_rate(
    views: Sequence[TaskView],
    realtime: frozenset[DeviceKey],
    now: float,
    config: PolicyConfig,
    recent: Recent,
    slo_pressure: frozenset[DeviceKey] = frozenset(),
    edges: Edges | None = None,
) -> BestEffortPlan:
    """Freeze each best-effort container while real-time work seen exactly is busy on one of
    its devices (``edges``); elsewhere run it by its devices' duty cycles while real-time work
    seen through NVML is active there (``realtime``, or its SLO alert fires); thaw it once
    both sides are idle: one NVML sample after NVML's, ``thaw_after_s`` after the exact one's.

    A container on several such devices is frozen while any of them says so. A device's
    cycle is ``recent``'s; a device without one starts one here, frozen first.
    """
    plan = BestEffortPlan()
    law = config.rate
    edges = edges or Edges()
    controlled = realtime | slo_pressure
    for mine in _by_container(views).values():
        v = mine[0]
        devices = {m.task.device for m in mine}
        active = devices & controlled
        settled = devices & edges.busy or not active
        if settled and _edge_freeze(plan, v, devices, edges, now, recent):
            continue
        if not active:
            last_seen = max(recent.realtime_seen.get(d, -math.inf) for d in devices)
            if v.ours and now - last_seen < NVML_SAMPLE_S:
                plan.due.append(last_seen + NVML_SAMPLE_S)
            elif v.ours:
                plan.steps.append(step_for(UNPAUSE, v, StepReason.REALTIME_IDLE))
            _keep_idle_cycles(plan, devices, recent, now, law)
            continue
        if v.blocker:
            if not v.paused:
                plan.skips.append(skip_for(v, v.blocker, "best-effort, but cannot be paused"))
            continue
        cycles = [plan.cycles.get(d) or _cycle(d, recent, law, now) for d in sorted(active)]
        plan.cycles.update(zip(sorted(active), cycles, strict=True))
        frozen = any(c.frozen_at(now) for c in cycles)
        if frozen and not v.paused:
            plan.steps.append(step_for(PAUSE, v, StepReason.DUTY_CYCLE))
        elif not frozen and v.ours:
            plan.steps.append(step_for(UNPAUSE, v, StepReason.DUTY_CYCLE))
        plan.due.append(min(c.next_switch(now) for c in cycles))
    return plan


def _edge_freeze(
    plan: BestEffortPlan,
    v: TaskView,
    devices: set[DeviceKey],
    edges: Edges,
    now: float,
    recent: Recent,
) -> bool:
    """Exact real-time work on its devices: frozen while it is busy, held until a gap worth
    a thaw; True when that settles the container (the NVML law has nothing to add)."""
    if devices & edges.busy:
        if v.blocker:
            if not v.paused:
                plan.skips.append(skip_for(v, v.blocker, "best-effort, but cannot be paused"))
        elif not v.paused:
            plan.steps.append(step_for(PAUSE, v, StepReason.BEST_EFFORT))
        return True
    idle = [edges.idle_since[d] for d in devices if d in edges.idle_since]
    if not idle or not v.ours:
        return False
    thaw_at = max(idle) + thaw_after_s(v.container, recent.freeze_s)
    if now < thaw_at:
        plan.due.append(thaw_at)
        return True
    return False


def _keep_idle_cycles(
    plan: BestEffortPlan, devices: set[DeviceKey], recent: Recent, now: float, law: RateLaw
) -> None:
    """Keep the phase of a device's cycle through an idle gap shorter than a period: work
    that comes back at once must not start a new cycle, frozen first, while the last one's
    freeze still holds (that would outlast the floor)."""
    keep_s = max(law.period_s, NVML_SAMPLE_S)
    for device in devices:
        running = recent.duty_cycles.get(device)
        if running is not None and now - recent.realtime_seen.get(device, -math.inf) < keep_s:
            plan.cycles.setdefault(device, running)


def _cycle(device: DeviceKey, recent: Recent, law: RateLaw, now: float) -> DutyCycle:
    """The device's running cycle, or a new one at the controller's fraction that starts
    with its frozen part (a microsecond into it, against rounding)."""
    running = recent.duty_cycles.get(device)
    if running is not None:
        return running
    fraction = recent.run_fractions.get(device, law.initial)
    return DutyCycle(fraction, law.period_s, phase=now - fraction * law.period_s - 1e-6)


def frozen_in_window(
    spans: Iterable[tuple[float, float]], current: float | None, now: float, window: float
) -> float:
    """Seconds frozen within ``[now - window, now]``: finished spans and the current one."""
    start = now - window
    frozen = sum(max(0.0, min(end, now) - max(begin, start)) for begin, end in spans)
    if current is not None:
        frozen += max(0.0, now - max(current, start))
    return frozen
