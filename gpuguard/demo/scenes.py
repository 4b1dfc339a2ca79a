"""The demo's two scenes, each unmanaged then managed, with a live view, a report and a
timeline picture: paper B's equal tasks with mixed deadlines, and an inference server
beside a best-effort training job."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import requests

from gpuguard import labels
from gpuguard.actuator.audit import AUDIT_FILE
from gpuguard.contract import EventType, PriorityClass, TaskBoundary, WorkloadKind
from gpuguard.demo.compare import (
    SeenTask,
    explain,
    match,
    request_lines,
    seen_tasks,
    step_lines,
    verdict_legend,
    wrap,
)
from gpuguard.demo.marks import mark_lines, marked_by, node_marks
from gpuguard.demo.stack.process import free_port
from gpuguard.demo.stack.scenario import Scenario, ScenarioResult, TaskResult, WorkloadSpec
from gpuguard.demo.timeline import Panel, Span, draw, frozen_spans, lanes
from gpuguard.gpusim.workload.server import percentile

#: how long scene 2's server and trainer run, seconds
COLOCATION_S = 20.0
PAUSES_LISTED = 20
#: the report's one clock, said once at its top and named in every header with times
CLOCK = [
    "Times (t) are seconds from each run's release: t = 0 when its workloads were released",
    "together. Tasks as the workloads logged them, each followed by the exporter's account",
    "of it (what NVML's samples showed) and why the two differ; pauses as the exporter saw",
    "them.",
]


def demo_specs(
    prefix: str, count: int, size: int, managed: bool, time_scale: float
) -> list[WorkloadSpec]:
    """``count`` equal tasks with mixed deadlines, plus one unmanaged small task.

    Deadlines are multiples of one task's run alone, shuffled against start order, so that
    FIFO, EDF and unmanaged sharing give different outcomes.
    """
    alone = 10.795 * (size / 13312) ** 3 * time_scale + 0.6
    step = 3 if count % 3 else 1
    specs = []
    for i in range(count):
        factor = 1.3 + 1.25 * ((i * step) % count)
        specs.append(
            WorkloadSpec(
                f"{prefix}-rt-{i + 1}",
                size=size,
                deadline=f"{alone * factor:.1f}s",
                managed=managed,
            )
        )
    # An unmanaged tenant arriving later: it shares the GPU and is never paused.
    specs.append(
        WorkloadSpec(f"{prefix}-batch", size=max(size // 2, 256), managed=False, delay_s=2.0)
    )
    return specs


@dataclass
class Run:
    """One run of a scene: what the workloads logged, the exporter's pause events and its
    finished tasks of the run's containers."""

    result: ScenarioResult
    pauses: list[dict[str, Any]]
    seen: list[SeenTask] | None = None  # None: not asked


def run_scenes(
    node: Any, out_dir: Path, count: int, size: int, colocation_s: float = COLOCATION_S
) -> tuple[dict[str, Run], dict[str, Run]]:
    """Scene 1 (paper B's ``count`` equal tasks of side ``size``) and scene 2 (a server
    beside a trainer for ``colocation_s``), each unmanaged then managed, on ``node``."""
    first = run_scene(
        node, out_dir, "paper-b",
        lambda name, managed: demo_specs(name, count, size, managed, node.time_scale),
        f"{count} equal tasks (N={size}) + 1 unmanaged (N={size // 2}, 2 s later)",
    )  # fmt: skip
    second = run_scene(
        node, out_dir, "colocation",
        lambda name, managed: colocation_specs(name, managed, node.time_scale, colocation_s),
        "an inference server (deadline per request) + a best-effort training job",
    )  # fmt: skip
    return first, second


def run_both(stack: Any, count: int, size: int) -> str:
    """Both scenes, each unmanaged then managed; the report text (timelines beside it)."""
    node = stack.nodes[0]
    lines = report_header()
    first, second = run_scenes(node, stack.dir, count, size)
    lines += ["", "Scene 1: paper B, equal tasks with mixed deadlines", ""]
    lines += paper_b_report(first)
    lines += ["", "Scene 2: an inference server beside a training job", ""]
    lines += colocation_report(second)
    releases = [(r.result.name, r.result.released_at) for r in (*first.values(), *second.values())]
    audit = read_audit(node.state_dir / AUDIT_FILE)
    try:
        still = marked_by(requests.get(node.actuator_url + "/api/v1/nodes", timeout=5).json())
    except (requests.RequestException, ValueError):
        still = []
    marks = node_marks(audit, still)
    misses = [
        (run.result.name, task.ended_at)
        for run in (*first.values(), *second.values())
        for task in run.seen or []
        if task.met is False
    ]
    lines += ["", *mark_lines(marks, releases, time.time(), misses), ""]
    frozen = frozen_spans(audit, time.time())
    for scene, runs, title in (
        ("paper-b", first, "Scene 1: paper B's equal tasks, unmanaged vs managed"),
        ("colocation", second, "Scene 2: inference server + training job, unmanaged vs managed"),
    ):
        lines.append(draw_scene(stack.dir / f"timeline-{scene}.png", title, runs, frozen))
    return "\n".join(lines)


def report_header() -> list[str]:
    """The report's title, its one clock and what its verdicts mean, before any table."""
    return ["", "gpuguard demo report", "====================", *CLOCK, "", *verdict_legend()]


def read_audit(path: Path) -> list[dict[str, Any]]:
    """The actuator's audit log (a line cut short, or none at all, is left out)."""
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def run_scene(
    node: Any,
    out_dir: Path,
    scene: str,
    specs: Callable[[str, bool], list[WorkloadSpec]],
    what: str,
) -> dict[str, Run]:
    """The scene unmanaged, then managed, each with its live view."""
    assert node.gpusim is not None
    client = node.client()
    runs: dict[str, Run] = {}
    try:
        for name, managed in (("unmanaged", False), ("managed", True)):
            since = requests.get(node.exporter_url + "/api/v1/state", timeout=5).json()["seq"]
            title = f"{scene} {name}"
            run_specs = specs(name, managed)
            scenario = Scenario(
                f"{scene}-{name}", client, node.gpusim.dir, out_dir / "logs", run_specs,
                _lead_in(run_specs),
            )  # fmt: skip
            print(f"\n== {title}: {what}", flush=True)
            scenario.start()
            try:
                live_view(node.exporter_url, scenario, title)
                scenario.wait(timeout=600)
                result = scenario.result()
                seen = exporter_tasks(node.exporter_url, [s.name for s in run_specs])
                runs[name] = Run(result, pauses_from_events(node.exporter_url, since), seen)
            finally:
                scenario.remove()
    finally:
        client.close()
    return runs


def _lead_in(specs: list[WorkloadSpec]) -> float:
    # a server's start-up (context, model in) is a task of its own: let it end first
    return 3.5 if any(s.kind is WorkloadKind.SERVER for s in specs) else 1.0


def colocation_specs(
    prefix: str, managed: bool, time_scale: float, duration_s: float = COLOCATION_S
) -> list[WorkloadSpec]:
    """An inference server (0.5 s requests, 0.6 a second: 30% of the GPU, a 3 s deadline
    each) and a training loop (40 ms steps) that is best-effort, and managed when asked;
    both run ``duration_s``.

    The server serves its latency histogram as vLLM does and declares a latency SLO on it
    (90% within 2.5 s): the stack's Prometheus scrapes it, and the SLO rules and dashboard
    panel show its attainment beside what NVML shows."""
    port = free_port()
    server = (
        "--rate", "0.6", "--request-work", f"{0.5 / time_scale:g}", "--kernels", "5",
        "--duration", f"{duration_s:g}", "--seed", "1", "--memory-bytes", "1GiB",
        "--metrics-port", str(port),
    )  # fmt: skip
    slo = (
        (labels.SLO_METRIC, "vllm_e2e_request_latency_seconds"),  # vllm:..., `:` as `_`
        (labels.SLO_TARGET, "2500ms"),
        (labels.SLO_OBJECTIVE, "0.9"),
        (labels.SLO_PORT, str(port)),
    )
    trainer = (
        "--step-work", f"{0.04 / time_scale:g}", "--kernels", "4", "--sync-every", "1",
        "--duration", f"{duration_s:g}", "--memory-bytes", "2GiB",
    )  # fmt: skip
    return [
        WorkloadSpec(f"{prefix}-server", kind=WorkloadKind.SERVER, kind_args=server,
                     deadline="3s", extra_labels=slo, host_network=True),
        WorkloadSpec(f"{prefix}-trainer", kind=WorkloadKind.TRAIN, kind_args=trainer,
                     managed=managed, priority=PriorityClass.BEST_EFFORT),
    ]  # fmt: skip


def exporter_tasks(exporter_url: str, names: list[str], wait_s: float = 2.0) -> list[SeenTask]:
    """The exporter's finished tasks of these containers, once none of them runs (it sees
    an exited process go at its next poll)."""
    give_up = time.monotonic() + wait_s
    while True:
        state = requests.get(exporter_url + "/api/v1/state", timeout=5).json()
        running = [t for t in state.get("tasks", []) if t.get("container") in names]
        if not running or time.monotonic() > give_up:
            return seen_tasks(state.get("recent", []), names)
        time.sleep(0.2)


def paper_b_report(runs: dict[str, Run]) -> list[str]:
    lines: list[str] = []
    for run in runs.values():
        lines += [*format_result(run.result, run.seen), ""]
        lines += [f"  error: {e}" for e in run.result.errors]
    lines += pause_lines(runs["managed"])
    lines += ["", *compare(runs["unmanaged"].result, runs["managed"].result)]
    return lines


def pause_lines(run: Run) -> list[str]:
    """The managed run's pauses and resumes, on the report's clock (t from its release)."""
    pauses = run.pauses
    lines = [
        f"managed run: {sum(p['type'] == 'container_paused' for p in pauses)} pauses, "
        f"{sum(p['type'] == 'container_resumed' for p in pauses)} resumes (t from release)"
    ]
    for event in pauses[:PAUSES_LISTED]:
        t = float(event["ts"]) - run.result.released_at
        lines.append(f"  t={t:6.2f}s  {event['type']:<18} {event.get('container')}")
    if len(pauses) > PAUSES_LISTED:
        lines.append(f"  ... {len(pauses) - PAUSES_LISTED} more (see the timeline)")
    if any(float(e["ts"]) < run.result.released_at for e in pauses):
        lines += wrap(
            "t < 0: before the release, while the containers started: a server loading its "
            "model or a trainer its memory is GPU work the exporter sees like any task, and "
            "the actuator admits it the same way, so a managed container may wait for it"
        )
    return lines


def colocation_report(runs: dict[str, Run]) -> list[str]:
    """Requests against their deadline and the trainer's pace, both runs side by side."""
    rows = {name: _colocation_figures(run.result) for name, run in runs.items()}
    u, m = rows["unmanaged"], rows["managed"]
    lines = []
    for run in runs.values():
        lines += [f"  error: {e}" for e in run.result.errors]
        lines += exporter_view(run) if run.seen is not None else []
    lines += pause_lines(runs["managed"])
    lines += [
        "",
        "side by side                    unmanaged    managed",
        f"  requests answered             {u['n']:>9}  {m['n']:>9}",
        f"  request latency p50           {u['p50']:>8.2f}s  {m['p50']:>8.2f}s",
        f"  request latency p99           {u['p99']:>8.2f}s  {m['p99']:>8.2f}s",
        f"  deadline hit rate             {u['hit']:>9}  {m['hit']:>9}",
        f"  trainer steps per second      {u['steps']:>9.1f}  {m['steps']:>9.1f}",
    ]
    return lines


def exporter_view(run: Run) -> list[str]:
    """Scene 2's run as the exporter saw it: the server's tasks with the requests in each,
    the trainer's busy spans."""
    result, seen, t0 = run.result, run.seen or [], run.result.released_at
    lines = [f"{result.name}: its workloads' own logs beside the exporter's tasks", ""]
    for server in sorted({r.container for r in result.requests}):
        lines += [*request_lines(server, result.requests, seen, t0, _row), ""]
    for trainer in sorted({s.container for s in result.steps}):
        lines += [*step_lines(trainer, result.steps, seen, t0), ""]
    return lines


def _colocation_figures(result: ScenarioResult) -> dict[str, Any]:
    latencies = [r.latency_s for r in result.requests]
    hit = result.hit_rate
    return {
        "n": len(latencies),
        "p50": percentile(latencies, 0.5) or 0.0,
        "p99": percentile(latencies, 0.99) or 0.0,
        "hit": "-" if hit is None else f"{hit:.0%}",
        "steps": result.steps_per_s(result.released_at, result.released_at + COLOCATION_S),
    }


def draw_scene(path: Path, title: str, runs: dict[str, Run], frozen: dict[str, list[Span]]) -> str:
    """The scene's timeline picture, unmanaged above managed; ``frozen``: each container's
    frozen spans (the actuator's audit log), cut at its run's last end."""
    panels = []
    for name, run in runs.items():
        result = run.result
        names = sorted({t.container for t in result.tasks} | {r.container for r in result.requests}
                       | {s.container for s in result.steps})  # fmt: skip
        ends = [t.end for t in result.tasks] + [r.end for r in result.requests]
        last = max([*ends, *(s.end for s in result.steps)], default=result.released_at)
        spans = {
            n: [(start, min(end, last)) for start, end in frozen.get(n, []) if start < last]
            for n in names
        }
        panel = lanes(result, names, spans)
        short = tuple(
            replace(lane, name=lane.name.removeprefix(f"{name}-")) for lane in panel.lanes
        )
        panels.append(Panel(name, panel.origin, short))
    return draw(path, title, panels)


def live_view(exporter_url: str, scenario: Scenario, title: str) -> None:
    """Redraw a ps-style table from the exporter's state until the scenario ends."""
    tty = sys.stdout.isatty()
    if not tty:
        print(
            f"  ({title}: output is not a terminal, so no live table: a line every 2 s; "
            "run it in a terminal to watch each container's deadline, phase and slack)",
            flush=True,
        )
    drawn = 0
    last_line = 0.0
    while scenario.running():
        try:
            state = requests.get(exporter_url + "/api/v1/state", timeout=2).json()
        except (requests.RequestException, ValueError):
            time.sleep(0.5)
            continue
        lines = _table(state, title)
        if tty:
            if drawn:
                sys.stdout.write(f"\x1b[{drawn}F\x1b[J")
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()
            drawn = len(lines)
        elif time.monotonic() - last_line > 2:
            tasks = state.get("tasks", [])
            paused = sum(1 for t in tasks if t.get("paused"))
            print(f"  {title}: {len(tasks)} GPU tasks running, {paused} paused", flush=True)
            last_line = time.monotonic()
        time.sleep(0.3)


def _table(state: dict[str, Any], title: str) -> list[str]:
    """The live table: each container's running task, else its last finished one with its
    verdict; STATE says whether the actuator may pause the container at all."""
    tasks = {t["container_id"]: t for t in state.get("tasks", []) if t.get("container_id")}
    ended = {
        t["container_id"]: t
        for t in sorted(state.get("recent", []), key=lambda t: t.get("ended_at") or 0.0)
        if t.get("container_id") and t.get("boundary") != TaskBoundary.NO_KERNEL
    }
    rows = [
        f"{title}  (GPU util {_util(state)}; STATE: managed, the actuator may pause it, or "
        "never paused)",
        _live_row("NAME", "DEADLINE", "PHASE", "ELAPSED", "SLACK", "STATE"),
    ]
    for container in sorted(state.get("containers", []), key=lambda c: c["name"]):
        deadline = f"{container['deadline_s']:.1f}s" if container.get("deadline_s") else "-"
        task = tasks.get(container["id"])
        if task is not None:
            phase, elapsed = task["phase"], _tenths(task.get("elapsed_s"))
        elif container["id"] in ended:
            task = ended[container["id"]]
            phase, elapsed = f"ended, {_verdict_of(task)}", _tenths(task.get("run_s"))
        else:
            phase, elapsed = "-", "-"
        slack = _tenths(task.get("slack_s")) if task is not None else "-"
        managed = "managed" if container.get("managed") else "never paused"
        status = ("PAUSED, " if container.get("paused") else "") + managed
        rows.append(_live_row(container["name"], deadline, phase, elapsed, slack, status))
    return rows


def _verdict_of(task: dict[str, Any]) -> str:
    """A finished task's verdict: met, MISSED, merged (never judged), or - (no deadline)."""
    met = task.get("met_deadline")
    if met is not None:
        return "met" if met else "MISSED"
    boundary = str(task.get("boundary"))
    return boundary if boundary != TaskBoundary.EXACT else "-"


def _tenths(seconds: float | None) -> str:
    """Seconds to a tenth, ``-`` for none; never ``-0.0s``."""
    if seconds is None:
        return "-"
    return f"{round(seconds, 1) or 0.0:.1f}s"


def _live_row(*cols: str) -> str:
    widths = (18, 10, 15, 10, 10, 16)
    return ("  " + "".join(str(c).ljust(w) for c, w in zip(cols, widths, strict=True))).rstrip()


def _row(*cols: str) -> str:
    widths = (18, 10, 11, 10, 10, 16)
    return ("  " + "".join(str(c).ljust(w) for c, w in zip(cols, widths, strict=True))).rstrip()


def _util(state: dict[str, Any]) -> str:
    gpus = state.get("gpus", [])
    return " ".join(f"{g.get('utilization_ratio') or 0:.0%}" for g in gpus) or "?"


def pauses_from_events(exporter_url: str, since: int) -> list[dict[str, Any]]:
    reply = requests.get(
        exporter_url + "/api/v1/events", params={"since": since, "timeout": 0}, timeout=5
    ).json()
    kinds = (EventType.CONTAINER_PAUSED, EventType.CONTAINER_RESUMED)
    return [e for e in reply["events"] if e["type"] in kinds]


def format_result(result: ScenarioResult, seen: list[SeenTask] | None = None) -> list[str]:
    """Each task as its workload logged it; under it, given ``seen``, the exporter's
    account of it and why the two differ."""
    lines = [f"{result.name}: tasks (START and END: t from release)"]
    lines.append(_row("CONTAINER", "START", "END", "RUN", "DEADLINE", "OUTCOME"))
    t0 = result.released_at
    for task in sorted(result.tasks, key=lambda t: t.end):
        deadline = f"{task.deadline_s:.1f}s" if task.deadline_s else "-"
        outcome = {True: "met", False: "MISSED", None: "-"}[task.met_deadline]
        lines.append(
            _row(
                task.container,
                f"t={task.start - t0:.2f}s",
                f"t={task.end - t0:.2f}s",
                f"{task.run_s:.2f}s",
                deadline,
                outcome,
            )
        )
        if seen is None:
            continue
        theirs = match(task, seen)
        if theirs is not None:
            verdict = {True: "met", False: "MISSED", None: "-"}[theirs.met]
            lines.append(
                _row(
                    "  exporter",
                    f"t={theirs.started_at - t0:.2f}s",
                    f"t={theirs.ended_at - t0:.2f}s",
                    f"{theirs.run_s:.2f}s",
                    deadline if theirs.boundary == TaskBoundary.EXACT else theirs.boundary,
                    verdict,
                )
            )
        lines += wrap(explain(task, theirs), "    ")
    return lines


def compare(unmanaged: ScenarioResult, managed: ScenarioResult) -> list[str]:
    """Both runs side by side. Mean completion and the hit rate are of the tasks with a
    deadline (the ones the actuator orders); a task without one (the unmanaged batch
    tenant) counts in the total time only, and a line under the table says so."""

    def rate(r: ScenarioResult) -> str:
        return "-" if r.hit_rate is None else f"{r.hit_rate:.0%}"

    def judged(r: ScenarioResult) -> list[TaskResult]:
        return [t for t in r.tasks if t.deadline_s is not None]

    def mean(r: ScenarioResult) -> float:
        ends = [t.end - r.released_at for t in judged(r)]
        return sum(ends) / len(ends) if ends else 0.0

    gain = 1 - mean(managed) / mean(unmanaged) if mean(unmanaged) else 0.0
    change = f"({gain:.0%} lower)" if gain >= 0 else f"({-gain:.0%} higher)"
    n, others = len(judged(managed)), len(managed.tasks) - len(judged(managed))
    rows = [
        (f"total time (all {len(managed.tasks)} tasks)", f"{unmanaged.total_s:.2f}s",
         f"{managed.total_s:.2f}s", ""),
        (f"mean completion ({n} with deadlines)", f"{mean(unmanaged):.2f}s",
         f"{mean(managed):.2f}s", f"   {change}"),
        (f"deadline hit rate ({n} with deadlines)", rate(unmanaged), rate(managed), ""),
    ]  # fmt: skip
    width = max(len(label) for label, *_ in rows) + 2
    lines = [f"{'side by side':<{width + 2}}{'unmanaged':>9}  {'managed':>9}"]
    lines += [f"  {label:<{width}}{u:>9}  {m:>9}{gain_text}" for label, u, m, gain_text in rows]
    if others:
        lines.append(f"  (no deadline: the batch container's {others} task(s), in the total only)")
    return lines
