"""Queue order: real-time before normal, then FIFO by the task's own start or EDF.

FIFO takes the task's first sighting (process start breaks ties, so a PID reused is no
older); EDF the absolute deadline, no deadline last. A busy server's burst counts by the
deadline of a request arriving now (``edf_key``). A device's queue holds ranked tasks only:
a server's busy periods are never queued (``precedence``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuguard.actuator.admission.policy.views import TaskView
from gpuguard.actuator.state import Task
from gpuguard.contract import PriorityClass, TaskBoundary, TaskMode

CLASS_RANK = {PriorityClass.REAL_TIME: 0, PriorityClass.NORMAL: 1, PriorityClass.BEST_EFFORT: 2}


def queue_order(
    tasks: Iterable[Task],
    order: str,
    classes: Mapping[str, PriorityClass] | None = None,
    now: float | None = None,
) -> list[Task]:
    """Tasks in admission order: real-time before normal (``classes``: container id ->
    class; a task not named there is normal), then FIFO by task start (process start breaks
    ties), or EDF (earliest absolute deadline first, no deadline last, FIFO among ties).

    Under EDF a burst past its deadline, or one known to merge several requests (``now``
    given), counts by the deadline of a request arriving now: a server's busy period may
    hold many requests, and the one that began it says nothing of those still waiting
    (deadline-monotonic for busy servers)."""
    fifo = sorted(
        enumerate(tasks), key=lambda it: (it[1].started_at, it[1].proc_start_ticks, it[0])
    )
    if order == "edf":
        fifo.sort(key=lambda it: edf_key(it[1], now))
    if classes:
        normal = PriorityClass.NORMAL
        fifo.sort(key=lambda it: CLASS_RANK[classes.get(it[1].container_id or "", normal)])
    return [task for _, task in fifo]


def edf_key(task: Task, now: float | None) -> tuple[bool, float]:
    deadline = task.absolute_deadline
    if deadline is None:
        return (True, 0.0)
    late = now is not None and (deadline < now or task.boundary == TaskBoundary.MERGED)
    if late and task.mode == TaskMode.BURST and task.deadline_s:
        deadline = (now or 0.0) + task.deadline_s
    return (False, deadline)


def queue_of(views: Sequence[TaskView], order: str, now: float | None = None) -> list[TaskView]:
    by_id = {v.task.task_id: v for v in views}
    classes = {v.cid: v.klass for v in views if v.cid is not None}
    tasks = [v.order_task for v in views]
    return [by_id[t.task_id] for t in queue_order(tasks, order, classes, now)]


def next_waits(
    waiter: TaskView, klass: PriorityClass, deadline_s: float | None, now: float, order: str
) -> bool:
    """Whether a task that a container of ``klass`` and ``deadline_s`` starts now would
    come after ``waiter`` in the queue."""
    if CLASS_RANK[klass] < CLASS_RANK[waiter.klass]:
        return False
    if order == "edf" and deadline_s is not None:
        no_deadline, waiter_deadline = edf_key(waiter.order_task, now)
        return not no_deadline and waiter_deadline <= now + deadline_s
    return True
