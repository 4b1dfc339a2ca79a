"""The exporter's view of a run beside the workloads' own logs, for the demo's report.

The workloads log their truth (a task's start and end, a request's arrival and answer, a
training step's end); the exporter sees only what NVML's samples show every poll. The report
sets each task's two accounts side by side and says, in a line, why they differ. Pure: the
demo passes the exporter's finished tasks (``/api/v1/state``'s ``recent``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuguard.contract import TaskBoundary
from gpuguard.demo.stack.scenario import RequestResult, ScenarioResult, StepResult, TaskResult

#: closer than this (a 0.1 s poll and a sample's lag), the two accounts agree
AGREE_S = 0.15
#: What a verdict other than met or MISSED means where the report shows one: a finished task's
#: boundary (docs/interfaces.md section 3; design-notes.md, what NVML's samples can see)
BOUNDARY_MEANS = {
    TaskBoundary.MERGED: (
        "merged: a busy span that showed an idle inside it and went on (or began before the "
        "exporter's first poll), so it may hold several requests; the exporter counts it as "
        "busy time and never judges it against the deadline: neither a hit nor a miss"
    ),
}


@dataclass(frozen=True)
class SeenTask:
    """One finished task as the exporter saw it."""

    container: str
    started_at: float
    ended_at: float
    met: bool | None  # None: not judged (no deadline, or not an exact task)
    boundary: str

    @property
    def run_s(self) -> float:
        return self.ended_at - self.started_at


def seen_tasks(recent: Iterable[Mapping[str, Any]], names: Collection[str]) -> list[SeenTask]:
    """The exporter's finished tasks of these containers, by start."""
    out = [
        SeenTask(
            str(t["container"]),
            float(t["started_at"]),
            float(t["ended_at"]),
            t.get("met_deadline"),
            str(t.get("boundary")),
        )
        for t in recent
        if t.get("container") in names and t.get("ended_at") is not None
    ]
    return sorted(out, key=lambda t: (t.started_at, t.container))


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return min(a[1], b[1]) - max(a[0], b[0])


def match(task: TaskResult, seen: Sequence[SeenTask]) -> SeenTask | None:
    """The exporter's task that overlaps the workload's task most (None: none does)."""
    best: SeenTask | None = None
    best_overlap = 0.0
    for candidate in seen:
        if candidate.container != task.container or candidate.boundary == TaskBoundary.NO_KERNEL:
            continue
        shared = _overlap((task.start, task.end), (candidate.started_at, candidate.ended_at))
        if shared > best_overlap or (best is None and shared >= 0):
            best, best_overlap = candidate, shared
    return best


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "-"}[met]


def verdict_legend() -> list[str]:
    """What each verdict the report shows means: said once, at its top, before any table."""
    lines = textwrap.wrap(
        "Verdicts (OUTCOME, VERDICT, and the last column of an exporter row): met or MISSED, "
        "judged against the container's deadline; - not judged (no deadline); and, shown by "
        "the exporter in place of a verdict (or of the deadline in scene 1):",
        96,
    )
    return lines + [line for means in BOUNDARY_MEANS.values() for line in wrap(means, "  ")]


def explain(task: TaskResult, seen: SeenTask | None) -> str:
    """Why the exporter's account of a task differs from the workload's, in a line."""
    if seen is None:
        return "why: the exporter saw no task of it (shorter than a poll, or never on the GPU)"
    parts = []
    late = seen.started_at - task.start
    if late > AGREE_S:
        parts.append(f"seen {late:.2f} s after it started (its first sample came later)")
    elif late < -AGREE_S:
        parts.append(f"seen {-late:.2f} s before it logged its start")
    early = task.end - seen.ended_at
    out = task.output_start
    if early > AGREE_S and out is not None and abs(seen.ended_at - out) < early:
        parts.append(
            f"ended {early:.2f} s before the workload, with its last kernel: its "
            f"{task.end - out:.2f} s output copy after that shows no SM activity to NVML"
        )
    elif early > AGREE_S:
        parts.append(f"ended {early:.2f} s before the workload's own end")
    elif early < -AGREE_S:
        parts.append(
            f"ended {-early:.2f} s after it: a task ends when its process or memory goes, "
            "seen at the next poll"
        )
    if seen.met is not None and task.met_deadline is not None and seen.met != task.met_deadline:
        parts.append(
            f"so it counted a {'hit' if seen.met else 'miss'} where the workload "
            f"{'met' if task.met_deadline else 'missed'} its {task.deadline_s:g} s deadline"
        )
    elif seen.met is None and task.met_deadline is not None:
        parts.append(f"not judged: its boundary is {seen.boundary}")
    if not parts:
        return f"why: start and end agree within {AGREE_S:g} s (a poll and a sample's lag)"
    return "why: " + "; ".join(parts)


def _span(request: RequestResult) -> tuple[float, float]:
    # on the GPU (what NVML can see), else from its start to its answer
    if request.gpu_start is not None and request.gpu_end is not None:
        return request.gpu_start, request.gpu_end
    return request.start, request.end


def requests_by_task(
    requests: Sequence[RequestResult], seen: Sequence[SeenTask]
) -> tuple[dict[int, list[RequestResult]], list[RequestResult]]:
    """Each exporter task (by its index in ``seen``) with the requests it overlaps most,
    and the requests that fall in none."""
    held: dict[int, list[RequestResult]] = {i: [] for i in range(len(seen))}
    outside = []
    for request in requests:
        shares = [
            (_overlap(_span(request), (t.started_at, t.ended_at)), i)
            for i, t in enumerate(seen)
            if t.container == request.container
        ]
        best = max(shares, default=(0.0, -1))
        if best[0] > 0:
            held[best[1]].append(request)
        else:
            outside.append(request)
    return held, outside


def _ids(requests: Sequence[RequestResult]) -> str:
    ids = [r.id + 1 for r in requests]  # numbered from 1, as the timeline labels them
    if not ids:
        return "none"
    if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"#{ids[0]}-#{ids[-1]}"
    return ", ".join(f"#{i}" for i in ids)


def request_lines(
    server: str,
    requests: Sequence[RequestResult],
    seen: Sequence[SeenTask],
    origin: float,
    row: Any,
) -> list[str]:
    """A server's requests beside the exporter's tasks of it (``row`` formats a row)."""
    mine = [r for r in requests if r.container == server]
    tasks = [t for t in seen if t.container == server and t.boundary != TaskBoundary.NO_KERNEL]
    startup = sum(t.container == server and t.boundary == TaskBoundary.NO_KERNEL for t in seen)
    met = sum(r.met_deadline is True for r in mine)
    lines = [
        *wrap(
            f"{server}: {len(mine)} requests logged, {met} met their deadline; the exporter "
            f"saw {len(tasks)} tasks (t from release):",
            "",
        ),
        row("EXPORTER TASK", "START", "END", "RUN", "VERDICT", "REQUESTS IN IT"),
    ]
    held, outside = requests_by_task(mine, tasks)
    for i, task in enumerate(tasks):
        inside = held[i]
        own = f", {sum(r.met_deadline is True for r in inside)} met" if inside else ""
        verdict = _verdict(task.met) if task.boundary == TaskBoundary.EXACT else task.boundary
        lines.append(
            row(
                f"  task {i + 1}",
                f"t={task.started_at - origin:.2f}s",
                f"t={task.ended_at - origin:.2f}s",
                f"{task.run_s:.2f}s",
                verdict,
                f"{_ids(inside)}{own}",
            )
        )
    if outside:
        lines.append(f"  in no exporter task: {_ids(outside)}")
    if startup:
        lines.append(f"  (and {startup} start-up context: memory in, no kernel, not a task)")
    lines += wrap(_why_requests(tasks, held))
    return lines


def _why_requests(tasks: Sequence[SeenTask], held: Mapping[int, list[RequestResult]]) -> str:
    several = [i for i, inside in held.items() if len(inside) > 1]
    if not several:
        return "why: each request the exporter saw was a task of its own"
    judged = [i for i in several if tasks[i].met is not None]
    wrong = [i for i in judged if tasks[i].met is False and all(r.met_deadline for r in held[i])]
    line = (
        f"why: {len(several)} of its tasks hold several requests: requests served back to "
        "back leave no idle sample between them, so NVML's sampling shows one busy span"
    )
    if judged:
        line += f"; {len(judged)} such span(s) judged as one task against one deadline"
    if wrong:
        line += f", {len(wrong)} a miss though each of its requests met its own"
    return line


def step_lines(
    trainer: str, steps: Sequence[StepResult], seen: Sequence[SeenTask], origin: float
) -> list[str]:
    """A training loop's steps beside the exporter's tasks of it."""
    mine = [s for s in steps if s.container == trainer]
    tasks = [t for t in seen if t.container == trainer and t.boundary != TaskBoundary.NO_KERNEL]
    spans = ", ".join(
        f"t={t.started_at - origin:.2f}s to t={t.ended_at - origin:.2f}s ({t.boundary})"
        for t in tasks
    )
    lines = wrap(
        f"{trainer}: {len(mine)} steps logged; the exporter saw {len(tasks)} "
        f"task(s): {spans or 'none'}",
        "",
    )
    counts = [sum(t.started_at <= s.end <= t.ended_at for s in mine) for t in tasks]
    if counts and max(counts) > 1:
        lines += wrap(
            f"why: its steps follow each other with no idle a poll could see: up to "
            f"{max(counts)} steps in one busy span (no deadline, so not judged)"
        )
    return lines


@dataclass(frozen=True)
class Agreement:
    """How the exporter's verdicts of a run compare with the workloads' own (counts).

    ``judged``: tasks and requests of the workloads with a deadline that an exporter task
    judged on its own; ``differ``: those whose verdict differs (a met against a MISSED), and
    the requests of an exporter task judged as one though it holds several; ``merged``:
    requests in a task the exporter did not judge because it may hold several (its
    ``merged`` boundary); ``unseen``: ones no exporter task judged otherwise (none seen, or
    not judged)."""

    judged: int = 0
    differ: int = 0
    merged: int = 0
    unseen: int = 0

    @property
    def agree(self) -> bool:
        """No verdict differs and none went unseen (``merged`` ones are never judged)."""
        return self.differ == 0 and self.unseen == 0

    def __add__(self, other: Agreement) -> Agreement:
        return Agreement(
            self.judged + other.judged,
            self.differ + other.differ,
            self.merged + other.merged,
            self.unseen + other.unseen,
        )


def agreement(result: ScenarioResult, seen: Sequence[SeenTask]) -> Agreement:
    """The exporter's verdicts beside the workloads' own for one run: each one-shot task with
    a deadline against its matching exporter task, each request against the exporter task
    that holds it (a request's own verdict counts from its arrival, as its client waits)."""
    out = Agreement()
    for task in result.tasks:
        if task.met_deadline is None:
            continue
        mine = match(task, seen)
        if mine is None or mine.met is None:
            merged = mine is not None and mine.boundary == TaskBoundary.MERGED
            out += Agreement(merged=int(merged), unseen=int(not merged))
        else:
            out += Agreement(judged=1, differ=int(mine.met != task.met_deadline))
    judged_requests = [r for r in result.requests if r.met_deadline is not None]
    for server in sorted({r.container for r in judged_requests}):
        served = [r for r in judged_requests if r.container == server]
        tasks = [t for t in seen if t.container == server and t.boundary != TaskBoundary.NO_KERNEL]
        held, outside = requests_by_task(served, tasks)
        out += Agreement(unseen=len(outside))
        for i, inside in held.items():
            if not inside:
                continue
            verdict = tasks[i].met
            if verdict is None:
                merged = tasks[i].boundary == TaskBoundary.MERGED
                out += Agreement(merged=len(inside) * merged, unseen=len(inside) * (not merged))
            elif len(inside) > 1:
                out += Agreement(judged=len(inside), differ=len(inside))
            else:
                out += Agreement(judged=1, differ=int(verdict != inside[0].met_deadline))
    return out


def wrap(text: str, indent: str = "  ", width: int = 96) -> list[str]:
    """A report line folded at ``width``, continuation lines indented further."""
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "     ")
