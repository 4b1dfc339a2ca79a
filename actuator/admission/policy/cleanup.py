"""Clean-up and limits: release what this actuator paused whose tasks are gone; one action
per container, never a pause of a container that runs a kept task, at most ``max_actions``.
"""

from __future__ import annotations

from gpuguard.actuator.admission.policy.types import (
    PAUSE,
    UNPAUSE,
    Action,
    Decision,
    Ledger,
    PolicyConfig,
    Skip,
)
from gpuguard.actuator.state import ExporterState
from gpuguard.contract import PRE_KERNEL, ActionReason, Phase, SkipReason


def release_gone(
    state: ExporterState, ledger: Ledger, config: PolicyConfig, now: float
) -> list[Action]:
    """Unpause containers we paused that have no running task any more; one that yielded
    between tasks waits until no other task computes or loads on its GPU (its turn)."""
    with_tasks = {t.container_id for t in state.tasks}
    names = {c.id: c.name for c in state.containers}
    busy_gpus = {
        t.gpu
        for t in state.tasks
        if not t.paused
        and t.container_id not in ledger.paused
        and (t.phase == Phase.COMPUTING or t.phase in PRE_KERNEL)
    }
    actions = []
    for cid in sorted(ledger.paused):
        if cid in with_tasks:
            continue
        if cid in ledger.yielded:
            if ledger.yielded[cid] in busy_gpus and now - ledger.paused[cid] < config.max_yield_s:
                continue
            reason = ActionReason.ADMIT
        else:
            reason = ActionReason.TASK_GONE
        actions.append(Action(UNPAUSE, cid, names.get(cid, cid[:12]), reason))
    return actions


def finish(actions: list[Action], skips: list[Skip], protected: set[str], cap: int) -> Decision:
    """One action per container, never pause a protected one, pauses first, then the cap."""
    chosen: list[Action] = []
    seen: set[str] = set()
    ordered = [a for a in actions if a.kind == PAUSE] + [a for a in actions if a.kind == UNPAUSE]
    for action in ordered:
        if action.container_id in seen:
            continue
        if action.kind == PAUSE and action.container_id in protected:
            skips.append(
                Skip(SkipReason.RUNS_ELSEWHERE, "container runs a kept task", action.container_id)
            )
            continue
        seen.add(action.container_id)
        if len(chosen) >= cap:
            skips.append(
                Skip(
                    SkipReason.CAP, f"more than {cap} actions", action.container_id, action.task_id
                )
            )
            continue
        chosen.append(action)
    return Decision(tuple(chosen), tuple(skips))
