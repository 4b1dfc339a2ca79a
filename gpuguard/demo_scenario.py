"""The demo's scenario: the same workload unmanaged, then managed, with a live view."""

from __future__ import annotations

import sys
import time
from typing import Any

import requests

from gpuguard.stack.scenario import Scenario, ScenarioResult, WorkloadSpec


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


def run_both(stack: Any, count: int, size: int) -> str:
    """Run the scenario unmanaged, then managed; return the report text."""
    node = stack.nodes[0]
    assert node.gpusim is not None
    client = node.client()
    results: dict[str, ScenarioResult] = {}
    pauses: list[dict[str, Any]] = []
    try:
        for name, managed in (("unmanaged", False), ("managed", True)):
            specs = demo_specs(name, count, size, managed, node.time_scale)
            since = requests.get(node.exporter_url + "/api/v1/state", timeout=5).json()["seq"]
            scenario = Scenario(name, client, node.gpusim.dir, stack.dir / "logs", specs)
            extra = f"1 unmanaged (N={size // 2}, 2 s later)"
            print(f"\n== {name}: {count} equal tasks (N={size}) + {extra}", flush=True)
            scenario.start()
            try:
                live_view(node.exporter_url, scenario, name)
                scenario.wait(timeout=600)
                results[name] = scenario.result()
                if managed:
                    pauses = pauses_from_events(node.exporter_url, since)
            finally:
                scenario.remove()
    finally:
        client.close()
    lines = ["", "gpuguard demo report", "===================="]
    for result in results.values():
        lines += [*format_result(result), ""]
        lines += [f"  error: {e}" for e in result.errors]
    lines.append(
        f"managed run: {sum(p['type'] == 'container_paused' for p in pauses)} pauses, "
        f"{sum(p['type'] == 'container_resumed' for p in pauses)} resumes"
    )
    first = min((p["ts"] for p in pauses), default=0.0)
    for event in pauses:
        lines.append(f"  {event['ts'] - first:7.2f}s  {event['type']:<18} {event.get('container')}")
    lines += ["", *compare(results["unmanaged"], results["managed"])]
    return "\n".join(lines)


def live_view(exporter_url: str, scenario: Scenario, title: str) -> None:
    """Redraw a ps-style table from the exporter's state until the scenario ends."""
    tty = sys.stdout.isatty()
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
    tasks = {t["container_id"]: t for t in state.get("tasks", []) if t.get("container_id")}
    rows = [
        f"{title}  (GPU util {_util(state)})",
        _row("NAME", "DEADLINE", "PHASE", "ELAPSED", "SLACK", "STATE"),
    ]
    for container in sorted(state.get("containers", []), key=lambda c: c["name"]):
        task = tasks.get(container["id"])
        deadline = f"{container['deadline_s']:.1f}s" if container.get("deadline_s") else "-"
        phase = task["phase"] if task else "-"
        elapsed = f"{task['elapsed_s']:.1f}s" if task else "-"
        slack = f"{task['slack_s']:.1f}s" if task and task.get("slack_s") is not None else "-"
        managed = "managed" if container.get("managed") else "unmanaged"
        status = ("PAUSED " if container.get("paused") else "") + managed
        rows.append(_row(container["name"], deadline, phase, elapsed, slack, status))
    return rows


def _row(*cols: str) -> str:
    widths = (18, 10, 11, 10, 10, 16)
    return "  " + "".join(str(c).ljust(w) for c, w in zip(cols, widths, strict=True))


def _util(state: dict[str, Any]) -> str:
    gpus = state.get("gpus", [])
    return " ".join(f"{g.get('utilization_ratio') or 0:.0%}" for g in gpus) or "?"


def pauses_from_events(exporter_url: str, since: int) -> list[dict[str, Any]]:
    reply = requests.get(
        exporter_url + "/api/v1/events", params={"since": since, "timeout": 0}, timeout=5
    ).json()
    return [e for e in reply["events"] if e["type"] in ("container_paused", "container_resumed")]


def format_result(result: ScenarioResult) -> list[str]:
    lines = [f"{result.name}: tasks (times from release)"]
    lines.append(_row("CONTAINER", "START", "END", "RUN", "DEADLINE", "OUTCOME"))
    for task in sorted(result.tasks, key=lambda t: t.end):
        deadline = f"{task.deadline_s:.1f}s" if task.deadline_s else "-"
        outcome = {True: "met", False: "MISSED", None: "-"}[task.met_deadline]
        lines.append(
            _row(
                task.container,
                f"{task.start - result.released_at:.2f}",
                f"{task.end - result.released_at:.2f}",
                f"{task.run_s:.2f}s",
                deadline,
                outcome,
            )
        )
    return lines


def compare(unmanaged: ScenarioResult, managed: ScenarioResult) -> list[str]:
    def rate(r: ScenarioResult) -> str:
        return "-" if r.hit_rate is None else f"{r.hit_rate:.0%}"

    gain = 1 - managed.mean_completion_s / unmanaged.mean_completion_s if unmanaged.tasks else 0
    return [
        "side by side           unmanaged    managed",
        f"  total time           {unmanaged.total_s:8.2f}s  {managed.total_s:8.2f}s",
        f"  mean completion      {unmanaged.mean_completion_s:8.2f}s  "
        f"{managed.mean_completion_s:8.2f}s   ({gain:.0%} lower)",
        f"  deadline hit rate    {rate(unmanaged):>9}  {rate(managed):>9}",
    ]
