"""Best-effort containers beside real-time work: frozen on exact real-time edges, else run
by duty cycles (rate control). Pure.

Why: docs/design-notes.md, "Best-effort freezes".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuguard.actuator.admission.policy.edges import Edges, sample_period, thaw_after_s
from gpuguard.actuator.admission.policy.views import TaskView, skip_for, step_for
from gpuguard.actuator.decision import (
    PAUSE,
    UNPAUSE,
    DutyCycle,
    PolicyConfig,
    RateLaw,
    Recent,
    Skip,
    Step,
)
from gpuguard.actuator.state import DeviceKey
from gpuguard.contract import StepReason


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


def plan_best_effort_rate(
    views: Sequence[TaskView],
    realtime: frozenset[DeviceKey],
    now: float,
    config: PolicyConfig,
    recent: Recent,
    slo_pressure: frozenset[DeviceKey] = frozenset(),
    edges: Edges | None = None,
    periods: Mapping[DeviceKey, float] | None = None,
) -> BestEffortPlan:
    """Freeze each best-effort container while real-time work seen exactly is busy on one of
    its devices (``edges``); elsewhere run it by its devices' duty cycles while real-time work
    seen through NVML is active there (``realtime``, or its SLO alert fires); thaw it once
    both sides are idle: one NVML sample after NVML's, ``thaw_after_s`` after the exact one's.
    A sample lasts its devices' learnt period (``periods``), else 1/6 s.

    A container on several such devices is frozen while any of them says so. A device's
    cycle is ``recent``'s; a device without one starts one here, frozen first.
    """
    plan = BestEffortPlan()
    law = config.rate
    edges = edges or Edges()
    periods = periods or {}
    controlled = realtime | slo_pressure
    for mine in _by_container(views).values():
        v = mine[0]
        devices = {m.task.device for m in mine}
        active = devices & controlled
        settled = devices & edges.busy or not active
        sample_s = sample_period(periods, devices)
        if settled and _edge_freeze(plan, v, devices, edges, now, recent, law, sample_s):
            continue
        if not active:
            last_seen = max(recent.realtime_seen.get(d, -math.inf) for d in devices)
            if v.ours and now - last_seen < sample_s:
                plan.due.append(last_seen + sample_s)
            elif v.ours:
                plan.steps.append(step_for(UNPAUSE, v, StepReason.REALTIME_IDLE))
            _keep_idle_cycles(plan, devices, recent, now, law, sample_s)
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
    law: RateLaw,
    sample_s: float,
) -> bool:
    """Exact real-time work on its devices: frozen while it is busy, held until a gap worth
    a thaw, and run for the floor's share of a period once its floor is due
    (``floor_due_at``); True when that settles the container (the NVML law has nothing to
    add)."""
    if devices & edges.busy:
        if v.blocker:
            if not v.paused:
                plan.skips.append(skip_for(v, v.blocker, "best-effort, but cannot be paused"))
        elif v.paused:
            runs = recent.runs.get(v.cid, ()) if v.cid is not None else ()
            due = floor_due_at(runs, v.paused_at, law)
            if v.ours and due is not None and _due(due, now, plan):
                plan.steps.append(step_for(UNPAUSE, v, StepReason.DUTY_CYCLE))
        elif not _floor_runs(v, law, now, plan):
            plan.steps.append(step_for(PAUSE, v, StepReason.BEST_EFFORT))
        return True
    idle = [edges.idle_since[d] for d in devices if d in edges.idle_since]
    if not idle or not v.ours:
        return False
    slack = [edges.slack_s.get(d) for d in devices if d in edges.idle_since]
    least = None if None in slack else min(slack, default=None)  # type: ignore[type-var]
    step = recent.steps.get(v.cid) if v.cid is not None else None
    thaw_at = max(idle) + thaw_after_s(v.container, recent.freeze_s, least, step, sample_s)
    if now < thaw_at:
        plan.due.append(thaw_at)
        return True
    return False


def floor_due_at(
    runs: Sequence[tuple[float, float]], paused_at: float | None, law: RateLaw
) -> float | None:
    """When the floor's run part falls due for a container frozen on busy edges since
    ``paused_at``: once it has been frozen ``(1 - floor) x period`` and has run less than
    the floor's share of the last ``floor_window_s`` (``runs``: its spans run unfrozen
    before, ``Recent.runs``; time not among them counts as frozen). None: no floor."""
    if law.floor <= 0 or paused_at is None:
        return None
    first = paused_at + (1 - law.floor) * law.period_s
    window, share = law.floor_window_s, law.floor * law.floor_window_s
    start = first - window
    spans = sorted((max(s, start), min(e, paused_at)) for s, e in runs)
    spans = [(s, e) for s, e in spans if e > s]
    ran = sum(e - s for s, e in spans)
    if ran <= share:
        return first
    for s, e in spans:  # the window's start slides over what it ran, oldest first
        if ran - (e - s) <= share:
            return s + (ran - share) + window
        ran -= e - s
    return first  # not reached: the last span leaves nothing


def _due(at: float, now: float, plan: BestEffortPlan) -> bool:
    """Whether ``at`` has come; else it is due."""
    if now >= at:
        return True
    plan.due.append(at)
    return False


def _floor_runs(v: TaskView, law: RateLaw, now: float, plan: BestEffortPlan) -> bool:
    """Whether a container admitted by a duty cycle (the floor's included) is still in the
    run part it was given, the floor's share of a period."""
    if law.floor <= 0 or v.admitted_at is None:
        return False
    end = v.admitted_at + law.floor * law.period_s
    if now < end:
        plan.due.append(end)
        return True
    return False


def _keep_idle_cycles(
    plan: BestEffortPlan,
    devices: set[DeviceKey],
    recent: Recent,
    now: float,
    law: RateLaw,
    sample_s: float,
) -> None:
    """Keep the phase of a device's cycle through an idle gap shorter than a period: work
    that comes back at once must not start a new cycle, frozen first, while the last one's
    freeze still holds (that would outlast the floor)."""
    keep_s = max(law.period_s, sample_s)
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
