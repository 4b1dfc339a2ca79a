"""Who may make whom wait, and for how long: ranked tasks, servers, SLO signals, slack. Pure.

Queue order, admission and preemption act only among ranked tasks; a server is frozen for
another's precedence only where its SLO signal says it can afford it, or, both timed by
the launch probe, for another server's request that falls due before any it holds, within
its busy period's slack; no freeze of a real-time container outlasts its slack. Why:
docs/design-notes.md, "Precedence".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuguard.actuator.admission.policy.order import CLASS_RANK
from gpuguard.actuator.admission.policy.requests import (
    Request,
    began_since,
    covers,
    sooner,
    timed_by_launches,
)
from gpuguard.actuator.admission.policy.views import TaskView, own_deadline, skip_for, step_for
from gpuguard.actuator.decision import PAUSE, UNPAUSE, PolicyConfig, Skip, Step
from gpuguard.actuator.state import Container, ExporterState
from gpuguard.contract import Phase, PriorityClass, SkipReason, StepReason, TaskBoundary, TaskMode

#: the share of its deadline a freeze leaves a container that repeats tasks (``spare_s``)
REPEATER_RUN_SHARE = 0.5
#: how much longer a task runs once thawed beside what held it (``spare_s``): two contexts
#: time-slice the device, so a request that waited its slack then runs at half speed
SHARED_SLOWDOWN = 2.0


def servers(
    state: ExporterState,
    serving: frozenset[str] = frozenset(),
    straight_on: frozenset[str] = frozenset(),
    started_idle: frozenset[str] = frozenset(),
) -> frozenset[str]:
    """Burst-mode containers whose busy periods are not tasks: long-lived programs whose
    busy periods merged work (a ``merged`` task, running or recent) and that begin their
    next task already computing right after a drain, their memory cached (``serving``,
    ``Recent.serving``); that sat on the GPU, unpaused, for a second before any kernel
    (``started_idle``: loaded, then waited for requests); or that declare a latency SLO.

    Either sign alone also fits programs that are no server: a light one-shot's own host
    work shows as idle inside its busy period (``merged``), and a repeater that keeps its
    memory begins each run at once (``serving``; it yields, as before). Together they are a
    server's requests, which nothing but idle gaps NVML may not see tell apart. For a
    real-time container going straight on after a drain (``straight_on``, learnt per image
    too, and sooner) stands in for ``serving``: a light real-time one-shot taken for a server
    then shares the device instead of queueing, the side the harm of a wrongly ranked server
    (missed deadlines) is not on."""
    merged = {t.container_id for t in state.tasks if t.boundary == TaskBoundary.MERGED}
    merged |= {t.container_id for t in state.recent if t.boundary == TaskBoundary.MERGED}
    found = set()
    for c in state.containers:
        if c.task_mode != TaskMode.BURST:
            continue
        goes_on = c.id in serving or (
            c.priority_class == PriorityClass.REAL_TIME and c.id in straight_on
        )
        if c.slo_target_s is not None or c.id in started_idle or (c.id in merged and goes_on):
            found.add(c.id)
    return frozenset(found)


def spare_s(container: Container | None, deadline: float, config: PolicyConfig) -> float:
    """How long it may wait: its deadline less its run and the margin.

    A container that has finished a task before runs task after task (a repeater, or a
    server not yet known as one), and what arrives as its freeze begins may be a whole
    request, which then runs beside the holder it waited for: its run is the longest of its
    last tasks shared (``SHARED_SLOWDOWN``), and at least half its deadline
    (``REPEATER_RUN_SHARE``), since a few short tasks say nothing of a heavy tail. Sized by
    the mean run, a freeze on ``bench/traces.py``'s pair left a 1 s request 2.76 s against
    its 2.33 s deadline; sized by the longest run alone, the oneshot's server missed requests
    that waited 0.5 s and then shared the device with the one-shot. A container's first task
    (a one-shot) waits for its deadline less its margin: it is the whole of its work, and a
    thaw before its holder ends would only make both slower (paper B)."""
    if container is None:
        return deadline - config.slack_margin_s
    run = max(container.typical_run_s or 0.0, container.longest_run_s or 0.0)
    if container.longest_run_s is not None:
        run = max(SHARED_SLOWDOWN * run, REPEATER_RUN_SHARE * deadline)
    return deadline - run - config.slack_margin_s


def thaw_at(view: TaskView, now: float, config: PolicyConfig) -> float | None:
    """When a freeze of this task must end (of one starting ``now`` if it is not frozen by
    this actuator yet); None: not real-time, or no deadline to keep."""
    if view.klass != PriorityClass.REAL_TIME:
        return None
    deadline = view.task.deadline_s
    if deadline is None:
        deadline = own_deadline(view.klass, view.container)
    if deadline is None:
        return None
    spare = spare_s(view.container, deadline, config)
    start = view.paused_at if view.ours and view.paused_at is not None else now
    at = start + spare
    absolute = view.order_task.absolute_deadline
    if absolute is not None and on_own_clock(view, start):
        at = min(at, absolute - (deadline - spare))  # its deadline is its task's own
    return at


def on_own_clock(view: TaskView, start: float) -> bool:
    """Whether its deadline counts from its task's start (a ranked task's), not from the
    start of its freeze: not for a burst that merged, or that was past its deadline when
    the freeze began, since it may hold several requests (as ``order.edf_key`` reads it)."""
    absolute = view.order_task.absolute_deadline
    if not view.ranked or absolute is None:
        return False
    late = view.task.boundary == TaskBoundary.MERGED or absolute < start
    return view.task.mode != TaskMode.BURST or not late


def spent(view: TaskView, now: float, config: PolicyConfig) -> bool:
    """A real-time task whose slack is spent: a freeze (or one going on) would outlast it."""
    at = thaw_at(view, now, config)
    return at is not None and at <= now


def waited(
    view: TaskView, holders: Sequence[TaskView], at_risk: frozenset[str], now: float
) -> bool:
    """A task whose deadline counts from its freeze (a server's busy period, or a burst
    that merged or ran late), thawed since ``holders`` began: its wait for them is spent,
    and it is not frozen for them again (unless one is a server at risk and it has run for
    its own deadline since)."""
    if view.admitted_at is None or not holders:
        return False
    return not any(_fresh(h, view, at_risk, now) for h in holders)


def affords(view: TaskView, at_risk: frozenset[str], config: PolicyConfig) -> bool:
    """A server that can afford a bounded wait: real-time, declares an SLO whose alert does
    not fire, and has slack to spare."""
    deadline = own_deadline(view.klass, view.container)
    return (
        not view.ranked
        and view.container is not None
        and view.container.slo_target_s is not None
        and view.cid not in at_risk
        and deadline is not None
        and spare_s(view.container, deadline, config) > 0
    )


def request_window(view: TaskView, config: PolicyConfig) -> tuple[float, float] | None:
    """A server's busy period as a wait's bounds: when the first request it may hold falls
    due (its start plus its deadline: every request it holds came after it began), and when
    a wait for another's request must end (its start plus its slack, ``spare_s``, the same
    for every freeze inside the period, so waits add up to no more than that first
    request's slack). None: a ranked task, not timed by the launch probe (NVML's busy
    periods, and a polled gauge's, may begin late), no deadline, no run learnt yet, or
    draining its output unfrozen (a freeze would only hold its answer)."""
    if view.ranked or view.container is None or not timed_by_launches(view.container):
        return None
    if not view.ours and view.task.phase == Phase.DRAINING:
        return None
    deadline = own_deadline(view.klass, view.container)
    if deadline is None or view.container.longest_run_s is None:
        return None
    start = view.task.started_at
    return start + deadline, start + spare_s(view.container, deadline, config)


@dataclass
class ServerPlan:
    steps: list[Step] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    due: list[float] = field(default_factory=list)


def plan_servers(
    unranked: Sequence[TaskView],
    holders: Sequence[TaskView],
    at_risk: frozenset[str],
    now: float,
    config: PolicyConfig,
    requests: Sequence[Request] = (),
) -> ServerPlan:
    """Servers' busy periods on one device: who waits (frozen, for no longer than its
    slack) while ``holders`` (the ranked tasks kept on the device, and the live busy
    periods of servers at risk) run, or, timed by the launch probe, while another server's
    request that falls due before any it holds runs (``requests``: those running on the
    device), and who shares the device with them."""
    plan = ServerPlan()
    for u in unranked:
        if u.blocker:
            continue
        over = [h for h in holders if _has_precedence(h, u, at_risk)]
        if over and affords(u, at_risk, config):
            at = thaw_at(u, now, config)
            assert at is not None  # it affords a wait: it has a deadline
            fresh = not waited(u, over, at_risk, now)
        else:
            wait = _request_wait(u, requests, now, config, plan)
            if wait is None:
                if u.ours:
                    plan.steps.append(step_for(UNPAUSE, u, StepReason.ADMIT))
                elif over and not u.paused:
                    plan.skips.append(
                        skip_for(u, SkipReason.NOT_RANKED, "a server's busy period, no SLO signal")
                    )
                continue
            at, fresh = wait
        if u.ours:
            if now >= at:
                plan.steps.append(step_for(UNPAUSE, u, StepReason.SLACK))
            else:
                plan.due.append(at)
            continue
        if u.paused:
            continue  # paused by someone else
        if at <= now or not fresh:
            plan.skips.append(skip_for(u, SkipReason.NO_SLACK, "waited its slack for these"))
            continue
        computing = u.task.phase == Phase.COMPUTING
        if computing and not config.preempt:
            plan.skips.append(skip_for(u, SkipReason.KERNEL_RUNNING, "kernel already launched"))
            continue
        reason = StepReason.PREEMPT if computing else StepReason.NEWCOMER
        plan.steps.append(step_for(PAUSE, u, reason))
        plan.due.append(at)
    return plan


def _request_wait(
    view: TaskView,
    requests: Sequence[Request],
    now: float,
    config: PolicyConfig,
    plan: ServerPlan,
) -> tuple[float, bool] | None:
    """A server's wait for other servers' sooner requests: when it ends, and whether one of
    them began since its last thaw. None: none to wait for, or (a skip noted in ``plan``)
    a wait that would end before they do."""
    window = request_window(view, config)
    if window is None or view.cid is None:
        return None
    due, at = window
    first = sooner(requests, view.cid, view.klass, due)
    if not first:
        return None
    if not view.ours and not view.paused and at > now and not covers(at, first, now):
        plan.skips.append(
            skip_for(view, SkipReason.NO_SLACK, "its slack ends before a sooner request's")
        )
        return None
    return at, began_since(first, view.admitted_at)


def _has_precedence(holder: TaskView, server: TaskView, at_risk: frozenset[str]) -> bool:
    """A holder a server waits for, if it can afford to: a ranked task of its class or
    higher, or another server at risk."""
    return (
        holder.cid != server.cid
        and CLASS_RANK[holder.klass] <= CLASS_RANK[server.klass]
        and (holder.ranked or holder.cid in at_risk)
    )


def _fresh(holder: TaskView, server: TaskView, at_risk: frozenset[str], now: float) -> bool:
    """Whether ``server`` may be frozen for ``holder``: not since its last thaw (its wait for
    what held it then is spent), unless the holder began after it, or is at risk and the
    server has run for its own deadline since."""
    thawed = server.admitted_at
    if thawed is None or holder.order_task.started_at > thawed:
        return True
    deadline = own_deadline(server.klass, server.container)
    return holder.cid in at_risk and deadline is not None and now - thawed >= deadline
