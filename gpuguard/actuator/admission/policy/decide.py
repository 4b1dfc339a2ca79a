"""``decide``: one fresh exporter snapshot in, the admission's steps and skips out. Pure.

It composes the parts: each task's view (``views``), every device's plan and the gangs
(``devices``), the best-effort freezes (``besteffort``), then clean-up and the cap
(``cleanup``). The package's doc says what the policy does.
"""

from __future__ import annotations

from dataclasses import replace

from gpuguard.actuator.admission.policy.besteffort import plan_best_effort_rate
from gpuguard.actuator.admission.policy.cleanup import finish, release_gone
from gpuguard.actuator.admission.policy.devices import plan_devices
from gpuguard.actuator.admission.policy.edges import devices_of, edges_of, sample_periods
from gpuguard.actuator.admission.policy.precedence import servers
from gpuguard.actuator.admission.policy.requests import running_requests
from gpuguard.actuator.admission.policy.views import view_of
from gpuguard.actuator.admission.policy.yields import between_tasks
from gpuguard.actuator.decision import (
    Decision,
    Ledger,
    PolicyConfig,
    Recent,
    Skip,
    Trigger,
)
from gpuguard.actuator.state import DeviceKey, ExporterState
from gpuguard.contract import PriorityClass, SkipReason


def decide(
    state: ExporterState,
    trigger: Trigger,
    config: PolicyConfig,
    ledger: Ledger | None = None,
    recent: Recent | None = None,
    slo_pressure: frozenset[DeviceKey] = frozenset(),
    slo_at_risk: frozenset[str] = frozenset(),
) -> Decision:
    """The steps for one fresh snapshot; never raises on well-formed input.

    ``slo_pressure``: devices where a real-time container's SLO alert fires (best-effort
    containers there are frozen sooner and longer); ``slo_at_risk``: those containers (a
    server at risk takes precedence over one that can afford a wait, ``precedence``); the
    best-effort duty cycle runs between requests too.
    """
    ledger = ledger or Ledger()
    recent = recent or Recent()
    if trigger.node is not None and trigger.node != state.node:
        return Decision(
            skips=(Skip(SkipReason.IRRELEVANT_ALERT, f"node {trigger.node} is not ours"),)
        )
    stale = _stale_reason(state, trigger, config)
    if stale:
        return Decision(skips=(Skip(SkipReason.STALE_STATE, stale),))
    skips: list[Skip] = []
    if trigger.gpu is not None and not any(g.index == trigger.gpu for g in state.gpus):
        skips.append(Skip(SkipReason.IRRELEVANT_ALERT, f"gpu {trigger.gpu} not in state"))
    unranked = servers(state, recent.serving, recent.straight_on, recent.started_idle)
    views = [view_of(task, state, ledger, trigger.now, unranked) for task in state.tasks]
    queued = [v for v in views if v.klass != PriorityClass.BEST_EFFORT]
    best_effort = [v for v in views if v.klass == PriorityClass.BEST_EFFORT]
    straight_on = recent.straight_on - unranked  # a server never yields between requests
    between = between_tasks(state, straight_on, ledger, trigger.now)
    devices = devices_of(state)
    requests = running_requests(state, devices, unranked, ledger.paused)
    plans = plan_devices(
        state.gpus, queued, best_effort, trigger.now, config, ledger, straight_on, between,
        slo_at_risk, requests,
    )  # fmt: skip
    steps = [step for plan in plans.values() for step in plan.steps]
    skips += [s for plan in plans.values() for s in plan.skips]
    due = [t for plan in plans.values() for t in plan.due]
    edges = edges_of(state, devices)
    # real-time work seen exactly is followed on its edges, not by the NVML law
    realtime = frozenset(k for k, plan in plans.items() if plan.realtime_busy - edges.containers)
    be = plan_best_effort_rate(
        best_effort, realtime, trigger.now, config, recent, slo_pressure, edges,
        sample_periods(state),
    )  # fmt: skip
    steps += be.steps
    skips += be.skips
    due += be.due
    if trigger.gpu is not None:
        on_gpu = {t.container_id for t in state.tasks if t.gpu == trigger.gpu}
        steps = [step for step in steps if step.container_id in on_gpu]
        skips = [s for s in skips if s.gpu in (None, trigger.gpu)]
    gone, gone_due = release_gone(state, ledger, config, trigger.now)
    steps += gone
    due += gone_due
    protected = {cid for plan in plans.values() for cid in plan.kept}
    decision = finish(steps, skips, protected, config.max_actions)
    return replace(
        decision,
        realtime_devices=realtime,
        next_due=min(due, default=None),
        duty_cycles=be.cycles,
    )


def _stale_reason(state: ExporterState, trigger: Trigger, config: PolicyConfig) -> str:
    failed = sorted(name for name, ok in state.sources.items() if not ok)
    if failed:
        return f"exporter source(s) failing: {', '.join(failed)}"
    age = trigger.now - state.timestamp
    if age > config.stale_after_s:
        return f"snapshot is {age:.1f}s old"
    return ""
