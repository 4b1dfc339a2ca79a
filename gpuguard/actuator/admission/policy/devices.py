"""Devices and gangs: each device's plan, and containers on several devices admitted on all
or none.

Each device (a whole GPU, or a MIG instance: its own queue) is decided on its own
(``_plan_device``); a container wanted on several devices but kept on only some is held
back from all of them and the devices decided again, the latest in queue order first, so
the earliest always progresses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuguard.actuator.admission.policy.admit import (
    admit,
    last_admitted,
    memory_above_threshold,
    must_run,
    newcomers,
    occupies,
    saturated,
)
from gpuguard.actuator.admission.policy.order import queue_of
from gpuguard.actuator.admission.policy.precedence import (
    on_own_clock,
    plan_servers,
    thaw_at,
    waited,
)
from gpuguard.actuator.admission.policy.requests import Request
from gpuguard.actuator.admission.policy.views import FULL, TaskView, skip_for, step_for
from gpuguard.actuator.admission.policy.yields import yields, yields_between
from gpuguard.actuator.decision import (
    PAUSE,
    UNPAUSE,
    Ledger,
    PolicyConfig,
    Skip,
    Step,
)
from gpuguard.actuator.state import Container, DeviceKey, Gpu
from gpuguard.contract import PRE_KERNEL, Phase, PriorityClass, SkipReason, StepReason


@dataclass(frozen=True)
class Gangs:
    """Containers on several devices held back from all of them, and the global order.

    A held-back gang keeps its place: on its other devices nothing later in the global
    order is admitted past it, or it would starve behind tasks that came after it.
    """

    held_back: set[str]
    rank: Mapping[str, int]  # container -> position of its first task in queue order

    def not_behind(
        self, reserving: Sequence[TaskView], views: Sequence[TaskView]
    ) -> list[TaskView]:
        """``views`` that may be admitted past the held-back gangs ``reserving`` a place."""
        if not reserving:
            return list(views)
        barrier = min(self.rank.get(v.cid or "", 0) for v in reserving)
        return [v for v in views if v.blocker or self.rank.get(v.cid or "", 0) < barrier]


@dataclass
class DevicePlan:
    """One device's decision."""

    steps: list[Step]
    skips: list[Skip]
    kept: set[str]  # containers that run on this device
    wanted: set[str]  # containers whose task here runs or waits (needs admission)
    realtime_busy: set[str]  # real-time containers whose tasks run or wait here
    due: list[float] = field(default_factory=list)  # when a quantum here falls due


def plan_devices(
    gpus: Sequence[Gpu],
    queued: Sequence[TaskView],
    best_effort: Sequence[TaskView],
    now: float,
    config: PolicyConfig,
    ledger: Ledger,
    straight_on: frozenset[str] = frozenset(),
    between: Mapping[DeviceKey, Sequence[Container]] | None = None,
    at_risk: frozenset[str] = frozenset(),
    requests: Mapping[DeviceKey, Sequence[Request]] | None = None,
) -> dict[DeviceKey, DevicePlan]:
    """Decide every device; then hold back, one at a time, gangs not admitted everywhere.

    ``at_risk``: real-time containers whose SLO alert fires (``precedence``); ``requests``:
    servers' requests running on each device, seen exactly (``requests``)."""
    queues = {
        g.key: queue_of([v for v in queued if v.task.device == g.key], config.order, now)
        for g in gpus
    }
    be_busy = {v.task.device for v in best_effort if not v.paused and (v.task.sm_ratio or 0) > 0}
    rank: dict[str, int] = {}
    for position, view in enumerate(queue_of(queued, config.order, now)):
        if view.cid is not None:
            rank.setdefault(view.cid, position)
    held_back: set[str] = set()
    while True:
        plans = {
            g.key: _plan_device(
                g,
                queues[g.key],
                now,
                config,
                ledger,
                Gangs(held_back, rank),
                g.key in be_busy,
                straight_on,
                (between or {}).get(g.key, ()),
                at_risk,
                (requests or {}).get(g.key, ()),
            )
            for g in gpus
        }
        split = _split_gangs(plans) - held_back
        if not split:
            return plans
        held_back.add(max(split, key=lambda cid: rank.get(cid, 0)))


def _split_gangs(plans: Mapping[DeviceKey, DevicePlan]) -> set[str]:
    """Containers that need several devices and are kept on some of them only."""
    devices: dict[str, set[DeviceKey]] = {}
    for key, plan in plans.items():
        for cid in plan.wanted:
            devices.setdefault(cid, set()).add(key)
    split = set()
    for cid, keys in devices.items():
        kept = {key for key in keys if cid in plans[key].kept}
        if len(keys) > 1 and kept and kept != keys:
            split.add(cid)
    return split


def _plan_device(
    gpu: Gpu,
    queue: list[TaskView],
    now: float,
    config: PolicyConfig,
    ledger: Ledger,
    gangs: Gangs,
    be_busy: bool,
    straight_on: frozenset[str] = frozenset(),
    between: Sequence[Container] = (),
    at_risk: frozenset[str] = frozenset(),
    requests: Sequence[Request] = (),
) -> DevicePlan:
    """One device: what runs (in queue order, while it fits), what waits, and why.

    Admission acts among ranked tasks only; servers' busy periods wait or share as their SLO
    signals say (``precedence.plan_servers``), and no real-time task waits past its slack.
    """
    unranked = [v for v in queue if not v.ranked]
    queue = [v for v in queue if v.ranked]
    # a server's kernels fill the device beside the queue, as a best-effort one's do
    be_busy = be_busy or any(not v.paused and (v.task.sm_ratio or 0) > 0 for v in unranked)
    steps: list[Step] = []
    skips: list[Skip] = []
    due: list[float] = []
    counting = [v for v in queue if not v.paused and occupies(v, now, config)]
    for v in queue:
        if not v.paused and v.task.phase in PRE_KERNEL and v not in counting:
            skips.append(
                skip_for(v, SkipReason.INPUT_TIMEOUT, "no SM activity past --policy.input-timeout")
            )
    # Real-time tasks whose slack is spent run, whatever the queue says; the others' freezes
    # are decided again when their slack would be.
    spent = _out_of_slack(queue, counting, now, config)
    thaws = (thaw_at(v, now, config) for v in queue if v.ours and v not in spent)
    due += [at for at in thaws if at is not None]
    gang = [
        v for v in counting if v.cid in gangs.held_back and v.blocker is None and v not in spent
    ]
    steps += [step_for(PAUSE, v, StepReason.GANG) for v in gang]
    live = [v for v in counting if v not in gang]
    frozen_kernels = [
        v
        for v in queue
        if (v.paused or v in gang) and v.task.phase == Phase.COMPUTING and v not in spent
    ]
    memory_high = memory_above_threshold(gpu, config)
    last = last_admitted(live, ledger)
    if (
        memory_high
        and last is not None
        and last.task.phase in PRE_KERNEL
        and not last.blocker
        and last not in spent
    ):
        steps.append(step_for(PAUSE, last, StepReason.MEMORY_PRESSURE))
        live.remove(last)
        last = None
    waiting = [
        v
        for v in queue
        if v.ours and v.blocker is None and (v.cid not in gangs.held_back or v in spent)
    ]
    # Tasks that run whatever we do: those we may not pause, and (unless preempting)
    # launched kernels; with preemption, the first in the queue, those admitted within
    # their quantum and those whose preemption would be futile; and those out of slack.
    must, quanta = must_run(queue, live, waiting, now, config, skips)
    due += quanta
    skips += _no_slack(queue, spent, live, waiting, must)
    must += [v for v in spent if v not in must]
    # Saturation keeps waiters out only while what fills the device stays: with
    # preemption, a holder that yields to a waiter does not.
    staying = (
        [*must, *(v for v in queue if not v.paused and v not in live)]
        if config.preempt
        else [v for v in queue if not v.paused]
    )
    busy = saturated(gpu, queue, be_busy, config) and any(
        v.task.phase != Phase.DRAINING for v in staying
    )
    if last is not None and last.task.phase not in PRE_KERNEL:
        last = None  # computing: its run quantum, not its admission, protects it
    reserving = [v for v in queue if v.cid in gangs.held_back and (v in gang or v.ours)]
    admissible = gangs.not_behind(reserving, [*live, *waiting])
    pressure = memory_high or busy
    keep = admit(queue, admissible, must, frozen_kernels, last, pressure, config.one_at_a_time)
    preempted = [v for v in live if v not in keep and v.task.phase == Phase.COMPUTING]
    if preempted:
        # What a preempted holder already launched drains frozen: it occupies like any
        # frozen kernel, so the waiters queue behind it instead of time-slicing beside it
        # (one after another finishes both sooner, paper B).
        frozen_kernels += preempted
        admissible = [v for v in admissible if v not in preempted]
        keep = admit(queue, admissible, must, frozen_kernels, last, pressure, config.one_at_a_time)
    admitted = [v for v in keep if v.paused]
    steps += [
        step_for(UNPAUSE, v, StepReason.SLACK if v in spent else StepReason.ADMIT) for v in admitted
    ]
    # The first task admitted now, or still waiting (behind a frozen kernel, say): the one a
    # holder that goes straight on makes way for as it drains (not one thawed for its
    # slack: it shares the device, it does not take it).
    waiter = next(
        (
            v
            for v in queue
            if v not in spent and (v in admitted or (v in waiting and v not in keep))
        ),
        None,
    )
    if config.preempt and waiter is not None:
        used = sum(v.share for v in [*keep, *frozen_kernels])
        used += 0.0 if waiter in keep else waiter.share
        room = 0.0 if config.one_at_a_time else FULL - used
        fresh = now - config.preempt_quantum_s
        steps += yields(queue, keep, waiter, straight_on, room, now, fresh, config.order)
        steps += yields_between(between, waiter, gpu.index, room, now, config.order)
    if waiting and memory_high and not any(step.verb == UNPAUSE for step in steps):
        skips.append(Skip(SkipReason.MEMORY_PRESSURE, "GPU memory above threshold", gpu=gpu.index))
    occupied = bool(keep or frozen_kernels or reserving) or busy
    skips += newcomers(live, keep, [v for v in frozen_kernels if v not in preempted],
                       occupied, steps)  # fmt: skip
    due += _slack_of_pauses(queue, steps, now, config)
    serving = [v for v in unranked if v.ours or (not v.paused and occupies(v, now, config))]
    at_risk_live = [v for v in serving if v.cid in at_risk and not v.paused]
    served = plan_servers(unranked, [*keep, *at_risk_live], at_risk, now, config, requests)
    steps += served.steps
    skips += served.skips
    due += served.due
    needing = [*counting, *waiting, *frozen_kernels, *reserving, *serving]
    return DevicePlan(
        steps,
        skips,
        kept={v.cid for v in keep if v.cid is not None},
        wanted={v.cid for v in [*counting, *waiting] if v.cid is not None and v.blocker is None},
        realtime_busy={v.cid or "" for v in needing if v.klass == PriorityClass.REAL_TIME},
        due=due,
    )


def _out_of_slack(
    queue: Sequence[TaskView], counting: Sequence[TaskView], now: float, config: PolicyConfig
) -> list[TaskView]:
    """Real-time tasks that may not be frozen (or must be thawed): their slack is spent, or
    they were thawed for it since what is ahead of them began (``precedence.waited``)."""
    contending = [v for v in queue if v.blocker is None and (v in counting or v.ours)]
    out = []
    for v in contending:
        at = thaw_at(v, now, config)
        if at is None:
            continue
        ahead = contending[: contending.index(v)]
        # counted from its freeze, it was thawed within this task (for its slack) since
        # what is ahead began: its wait for that is spent
        thawed = v.admitted_at is not None and v.admitted_at > v.task.started_at
        if at <= now or (
            thawed
            and not v.ours
            and not on_own_clock(v, now)
            and waited(v, ahead, frozenset(), now)
        ):
            out.append(v)
    return out


def _no_slack(
    queue: Sequence[TaskView],
    spent: Sequence[TaskView],
    live: Sequence[TaskView],
    waiting: Sequence[TaskView],
    must: Sequence[TaskView],
) -> list[Skip]:
    """Skips for running tasks out of slack that a task ahead of them would have made wait."""
    contenders = {v.task.task_id for v in [*live, *waiting] if v.blocker is None}
    skips = []
    for i, v in enumerate(queue):
        ahead = any(w.task.task_id in contenders for w in queue[:i])
        if ahead and v in spent and v in live and v not in must:
            skips.append(skip_for(v, SkipReason.NO_SLACK, "its slack is spent"))
    return skips


def _slack_of_pauses(
    queue: Sequence[TaskView], steps: Sequence[Step], now: float, config: PolicyConfig
) -> list[float]:
    """When the freezes begun now must end (real-time tasks' slack): decide again then."""
    paused = {s.task_id for s in steps if s.verb == PAUSE}
    found = (thaw_at(v, now, config) for v in queue if v.task.task_id in paused)
    return [at for at in found if at is not None]
