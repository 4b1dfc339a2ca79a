"""What runs on one device: who keeps it, who is admitted in order while it fits, who waits.

The parts of one device's plan (``devices.py``): the tasks admission may not take the device from
(``must_run``: those it may not pause, a holder within its run quantum, one whose
preemption would be futile), admission in queue order while each fits (``admit``: no
overtaking), the pauses of newcomers not admitted (``newcomers``), and the occupancy tests
(a task that holds the device, saturation, memory above the threshold).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuguard.actuator.admission.policy.edges import idle_exactly
from gpuguard.actuator.admission.policy.views import FULL, TaskView, skip_for, step_for
from gpuguard.actuator.decision import PAUSE, Ledger, PolicyConfig, Skip, Step
from gpuguard.actuator.state import Gpu
from gpuguard.contract import PRE_KERNEL, Phase, SkipReason, StepReason, TaskMode


def must_run(
    queue: list[TaskView],
    live: list[TaskView],
    waiting: list[TaskView],
    now: float,
    config: PolicyConfig,
    skips: list[Skip],
) -> tuple[list[TaskView], list[float]]:
    """The live tasks admission may not take the device from, and when a quantum ends."""
    if not config.preempt:
        return [v for v in live if v.task.phase == Phase.COMPUTING or v.blocker], []
    must: list[TaskView] = []
    due: list[float] = []
    position = {v.task.task_id: i for i, v in enumerate(queue)}
    contenders = {v.task.task_id for v in [*live, *waiting] if v.blocker is None}
    for v in live:
        if v.blocker:
            must.append(v)
            continue
        ahead = [w for w in queue[: position[v.task.task_id]] if w.task.task_id in contenders]
        if not ahead:
            if v.task.phase == Phase.COMPUTING:
                must.append(v)  # nobody with precedence waits: a launched task runs on
            continue
        recent = v.admitted_at is not None and now - v.admitted_at < config.preempt_quantum_s
        if recent and not idle_exactly(v.container):  # nothing launched: free to pause
            must.append(v)
            due.append((v.admitted_at or now) + config.preempt_quantum_s)
            skips.append(skip_for(v, SkipReason.RUN_QUANTUM, "admitted within its run quantum"))
        elif v.task.phase == Phase.COMPUTING and all(_futile(w, v, now) for w in ahead):
            must.append(v)
            skips.append(
                skip_for(v, SkipReason.PREEMPT_FUTILE, "the waiters miss anyway; it would not")
            )
    return must, due


def _futile(waiter: TaskView, holder: TaskView, now: float) -> bool:
    """Preempting ``holder`` for ``waiter`` makes the holder miss a deadline it would meet
    left alone, while the waiter misses its own anyway (EDF feasibility)."""
    w_deadline = waiter.task.absolute_deadline
    h_deadline = holder.task.absolute_deadline
    if w_deadline is None or h_deadline is None:
        return False  # no deadline to miss on one side: precedence decides
    if TaskMode.BURST in (waiter.task.mode, holder.task.mode):
        return False  # a busy period's first deadline is not that of the requests it holds
    w_run = _typical(waiter)
    h_run = _typical(holder)
    h_left = None if h_run is None else max(0.0, h_run - holder.task.elapsed_s)
    waiter_misses = now + (w_run or 0.0) > w_deadline
    holder_meets = now + (h_left or 0.0) <= h_deadline
    # Unknown run times: preempting may well make the holder miss (the cautious reading).
    holder_would_miss = w_run is None or h_left is None or now + w_run + h_left > h_deadline
    return waiter_misses and holder_meets and holder_would_miss


def _typical(view: TaskView) -> float | None:
    return view.container.typical_run_s if view.container is not None else None


def admit(
    queue: list[TaskView],
    admissible: list[TaskView],
    must: list[TaskView],
    frozen_kernels: list[TaskView],
    last: TaskView | None,
    pressure: bool,
    one_at_a_time: bool = False,
) -> list[TaskView]:
    """What runs on the device: what must, then candidates in order while they fit."""
    keep = list(must)
    used = sum(v.share for v in [*must, *frozen_kernels])
    # The task admitted last goes first if it is still before its kernel: it was the head.
    candidates = [last] if last is not None and last in admissible and last not in keep else []
    candidates += [v for v in queue if v in admissible and v not in keep and v is not last]
    for v in candidates:
        if v.paused and pressure:
            continue  # never admit a waiting task while memory is high or the GPU saturated
        held = bool(keep or frozen_kernels)  # the first task in order always runs
        if held and (pressure or one_at_a_time or used + v.share > FULL):
            break  # FIFO: nothing behind the first task that does not fit overtakes it
        keep.append(v)
        used += v.share
    return keep


def newcomers(
    live: list[TaskView],
    keep: list[TaskView],
    frozen_kernels: list[TaskView],
    occupied: bool,
    steps: list[Step],
) -> list[Skip]:
    """Pause live tasks that were not admitted; skips for those that cannot be."""
    skips: list[Skip] = []
    kept_ids = {v.task.task_id for v in keep}
    used = sum(v.share for v in frozen_kernels)
    for v in live:
        if v.task.task_id not in kept_ids:
            if occupied and not any(step.container_id == v.cid for step in steps):
                computing = v.task.phase == Phase.COMPUTING
                reason = StepReason.PREEMPT if computing else StepReason.NEWCOMER
                steps.append(step_for(PAUSE, v, reason))
        elif v.task.phase == Phase.COMPUTING:
            used += v.share
            if used > FULL:
                skips.append(skip_for(v, SkipReason.KERNEL_RUNNING, "kernel already launched"))
        elif v.blocker and len(keep) > 1:
            skips.append(skip_for(v, v.blocker, "cannot be paused; counts for occupancy"))
    return skips


def occupies(view: TaskView, now: float, config: PolicyConfig) -> bool:
    """Does this unpaused task hold the GPU (computing, or before its kernel, not idle)?"""
    if view.task.phase == Phase.COMPUTING:
        return True
    return view.task.phase in PRE_KERNEL and now - view.since <= config.input_timeout_s


def saturated(gpu: Gpu, queue: Sequence[TaskView], be_busy: bool, config: PolicyConfig) -> bool:
    """At or above the saturation ratio, counting queued work only when best-effort runs."""
    if be_busy:  # its kernels fill the device, but it yields to queued tasks
        ratio: float | None = sum(v.task.sm_ratio or 0.0 for v in queue if not v.paused)
    else:
        ratio = gpu.utilization_ratio
    return ratio is not None and ratio >= config.saturation_ratio


def memory_above_threshold(gpu: Gpu, config: PolicyConfig) -> bool:
    total = gpu.memory_total_bytes
    return total > 0 and gpu.memory_used_bytes > config.memory_threshold * total


def last_admitted(live: Sequence[TaskView], ledger: Ledger) -> TaskView | None:
    """The live task on this device whose container this actuator admitted most recently."""
    admitted = [v for v in live if v.cid is not None and v.cid in ledger.admitted]
    return max(admitted, key=lambda v: ledger.admitted[v.cid or ""], default=None)
