"""Paper B's contention experiments with real containers on gpusim: unmanaged vs managed.

For each case (matrix size x number of containers, all starting together) it runs:
  single     one container alone; the one-after-another ideal is n x its run time
  unmanaged  n containers share the GPU (no admission control)
  fifo       n managed containers, actuator fast path, FIFO admission
  edf        n managed containers, actuator fast path, EDF admission
Every container gets a deadline (a seeded mix of tight and loose ones, multiples of the
single run time), so deadline hit rates compare side by side.

Measured from the workloads' own JSON-lines logs (ground truth): total time (first start to
last finish), mean completion time, deadline hit rate; and pause latency = the workload's
``context_created`` (its task appears on the GPU) -> the actuator's audit record of that
container frozen (its cgroup, or the finished ``docker pause`` with ``--pause.method=docker``).

Light tasks (paper C's Fig. 4: light inference tasks run together at little cost): each of
several containers runs a few tasks of memory input, kernels that keep about 40% of the GPU
busy (short kernels with host work between them) and output, all released together, run
unmanaged, managed one at a time (``--policy.one-at-a-time``: paper B) and managed by
headroom (the default: a task whose container's demand is known is admitted beside others
while their shares fit). A container's demand is learnt from a task that ran alone, so
its first task runs alone either way; later ones run two at a time.

Kernels run at ``--time-scale`` (device time x scale); copies keep their real length so the
memory-input phase the fast path must catch is as long as on paper B's GPU. The exporter
polls every ``--poll-interval``. ``--quick``: only 10 x 13,312; ``--light``: only the light
tasks (``--quick --light``: 4 containers x 2 tasks). The last line printed is one JSON
object with the figures of the 10 x 13,312 case and of the light tasks, as run.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchargs import BenchParser, positive

from gpuguard.actuator.audit import read_audit
from gpuguard.demo.stack.images import python_container_kwargs
from gpuguard.demo.stack.localstack import NodeStack
from gpuguard.demo.stack.process import exit_on_sigterm
from gpuguard.demo.stack.scenario import (
    ScenarioResult,
    WorkloadSpec,
    parse_workload_log,
    run_to_end,
)

OUT = Path(__file__).resolve().parent / "out"
FULL_CASES = [(13312, range(1, 11)), (19456, range(1, 6)), (8192, range(1, 21))]
QUICK_CASES = [(13312, range(10, 11))]
MODES = ("unmanaged", "fifo", "edf")
#: light tasks: containers, tasks each; 20 ms kernels with 30 ms of host work between
LIGHT_FULL, LIGHT_QUICK = (6, 3), (4, 2)
LIGHT_MODES = ("unmanaged", "one_at_a_time", "headroom")
LIGHT_KERNEL_S, LIGHT_GAP_S, LIGHT_KERNELS = 0.02, 0.03, 16


@dataclass
class CaseResult:
    size: int
    n: int
    single_s: float
    runs: dict[str, ScenarioResult]
    pause_ms: list[float]

    @property
    def ideal_s(self) -> float:
        return self.n * self.single_s

    def mean(self, mode: str) -> float:
        run = self.runs[mode]
        return statistics.fmean(t.end - min(x.start for x in run.tasks) for t in run.tasks)

    def hit(self, mode: str) -> float:
        return self.runs[mode].hit_rate or 0.0


def deadlines(n: int, single_s: float, seed: int) -> list[float]:
    """A mix of tight and loose deadlines: (k + 0.6) x single for k = 1..n, shuffled."""
    values = [(k + 0.6) * single_s for k in range(1, n + 1)]
    random.Random(seed).shuffle(values)
    return values


def run_scenario(
    node: NodeStack, name: str, specs: list[WorkloadSpec], timeout: float
) -> ScenarioResult:
    return run_to_end(node, name, specs, 0.5 + 0.12 * len(specs), timeout)


def restart_actuator(node: NodeStack, order: str) -> None:
    node.stop_actuator()
    node.order = order
    node.start_actuator()


def pause_latencies(node: NodeStack, result: ScenarioResult, since: float) -> list[float]:
    """Task appeared (workload's context_created) -> its container frozen (audit), in ms."""
    appeared = {t.container: t.context_created for t in result.tasks if t.context_created}
    out: list[float] = []
    seen: set[str] = set()
    for record in read_audit(node.base_dir / "actuator" / "audit.jsonl"):
        if record.get("ts", 0) < since or record.get("event") != "action":
            continue
        name = record.get("container")
        if record.get("action") != "pause" or record.get("result") != "ok" or name in seen:
            continue
        if name in appeared and appeared[name] is not None:
            seen.add(name)
            # ``frozen``: the kernel confirmed the cgroup frozen (Docker hears of it later);
            # for a plain ``docker pause`` it is when that returned, as ``finished`` is.
            frozen = record.get("frozen") or record["finished"]
            out.append(1000 * (frozen - appeared[name]))
    return out


def run_case(node: NodeStack, size: int, n: int, seed: int) -> CaseResult:
    tag = f"{size}x{n}"
    single = run_scenario(node, f"single-{tag}", [WorkloadSpec(f"single-{tag}-0", size)], 600)
    single_s = single.tasks[0].run_s
    marks = deadlines(n, single_s, seed)
    runs: dict[str, ScenarioResult] = {}
    pause_ms: list[float] = []
    for mode in MODES:
        if mode != "unmanaged":
            restart_actuator(node, mode)
        since = time.time()
        specs = [
            WorkloadSpec(
                f"{mode}-{tag}-{i}", size, deadline=f"{marks[i]:.3f}s", managed=mode != "unmanaged"
            )
            for i in range(n)
        ]
        runs[mode] = run_scenario(node, f"{mode}-{tag}", specs, 60 + 10 * n * single_s)
        if mode != "unmanaged":
            pause_ms += pause_latencies(node, runs[mode], since)
    return CaseResult(size, n, single_s, runs, pause_ms)


def light_specs(mode: str, n: int, tasks: int, scale: float) -> list[WorkloadSpec]:
    """``n`` containers of ``tasks`` light tasks each (about 40% of the GPU while computing)."""
    args = ("--kernels", str(LIGHT_KERNELS), "--host-gap", str(LIGHT_GAP_S))
    args += ("--sleep-between", "0.6")  # each task its own (longer than the idle gap)
    work = LIGHT_KERNEL_S * LIGHT_KERNELS / scale
    return [
        WorkloadSpec(
            f"light-{mode}-{i}",
            size=8192,
            repeat=tasks,
            managed=mode != "unmanaged",
            work_seconds=round(work, 6),
            memory_bytes=1536 * 2**20,
            kind_args=args,
        )
        for i in range(n)
    ]


def run_light(node: NodeStack, n: int, tasks: int) -> dict[str, ScenarioResult]:
    """The light tasks unmanaged, one at a time, and by headroom (the actuator restarted)."""
    runs: dict[str, ScenarioResult] = {}
    for mode in LIGHT_MODES:
        flags = ["--policy.one-at-a-time"] if mode == "one_at_a_time" else []
        if (node.extra_actuator_flags, node.order) != (flags, "fifo"):
            node.extra_actuator_flags = flags
            restart_actuator(node, "fifo")
        specs = light_specs(mode, n, tasks, node.time_scale)
        runs[mode] = run_scenario(node, f"light-{mode}", specs, 120)
    return runs


def light_table(runs: dict[str, ScenarioResult]) -> str:
    base = runs["one_at_a_time"]
    lines = [
        f"{'light tasks':<14} {'total s':>8} {'mean completion s':>18} "
        f"{'vs one at a time':>17} {'computed beside another':>24}"
    ]
    for mode, run in runs.items():
        gain = 1 - run.mean_completion_s / base.mean_completion_s
        lines.append(
            f"{mode:<14} {run.total_s:8.2f} {run.mean_completion_s:18.2f} {gain:16.0%} "
            f"{beside_another(run):>16} of {len(run.tasks)}"
        )
    return "\n".join(lines)


def beside_another(run: ScenarioResult) -> int:
    """Tasks whose kernels ran while another task's did."""
    spans = [(t.kernel_start, t.kernel_end) for t in run.tasks]
    known = [(a, b) for a, b in spans if a is not None and b is not None]
    return sum(
        any(a < d and c < b for j, (c, d) in enumerate(known) if j != i)
        for i, (a, b) in enumerate(known)
    )


def staggered_pause_latency(node: NodeStack, n: int = 5, gap_s: float = 0.25) -> list[float]:
    """Pause latency when tasks arrive one at a time (each while another holds the GPU)."""
    restart_actuator(node, "fifo")
    assert node.gpusim is not None
    log_dir = node.base_dir / "logs" / "stagger"
    log_dir.mkdir(parents=True, exist_ok=True)
    mounts = {
        str(node.gpusim.dir): {"bind": str(node.gpusim.dir), "mode": "rw"},
        str(log_dir): {"bind": str(log_dir), "mode": "rw"},
    }
    env = {"GPUSIM_SOCKET": str(node.gpusim.dir / "gpusim.sock")}
    since = time.time()
    release = since + 0.2 * n + 0.8
    client = node.client()
    containers = []
    tasks = []
    try:
        for i in range(n):
            spec = WorkloadSpec(f"stagger-{i}", 13312, managed=True)
            args = spec.workload_args(log_dir / f"{spec.name}.jsonl", release + gap_s * i)
            kwargs = python_container_kwargs(
                args, labels=spec.labels("stagger"), extra_mounts=mounts, environment=env,
                name=spec.name,
            )  # fmt: skip
            containers.append(client.containers.run(**kwargs))
        for i, container in enumerate(containers):
            container.wait(timeout=120)
            lines = (log_dir / f"stagger-{i}.jsonl").read_text().splitlines()
            tasks += parse_workload_log(f"stagger-{i}", lines, None)
    finally:
        for container in containers:
            container.remove(force=True)
        client.close()
    return pause_latencies(node, ScenarioResult("stagger", release, tuple(tasks)), since)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(results: list[CaseResult]) -> str:
    head = (
        f"{'case':>10} {'single':>7} {'ideal':>7} {'unmgd':>7} {'fifo':>7} {'edf':>7} "
        f"{'mean u/f/e':>17} {'gain':>5} {'hit u/f/e':>14} {'pause p50/p95 ms':>17}"
    )
    lines = [head]
    for r in results:
        gain = 1 - r.mean("fifo") / r.mean("unmanaged")
        lines.append(
            f"{r.size:>6}x{r.n:<3} {r.single_s:7.2f} {r.ideal_s:7.2f} "
            f"{r.runs['unmanaged'].total_s:7.2f} {r.runs['fifo'].total_s:7.2f} "
            f"{r.runs['edf'].total_s:7.2f} "
            f"{r.mean('unmanaged'):5.1f}/{r.mean('fifo'):5.1f}/{r.mean('edf'):5.1f} "
            f"{gain:5.0%} {r.hit('unmanaged'):4.0%}/{r.hit('fifo'):4.0%}/{r.hit('edf'):4.0%} "
            f"{percentile(r.pause_ms, 0.5):8.1f}/{percentile(r.pause_ms, 0.95):7.1f}"
        )
    return "\n".join(lines)


def plot(results: list[CaseResult], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not importable: plot skipped (pip install '.[bench]')"
    sizes = sorted({r.size for r in results})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        rows = [r for r in results if r.size == size]
        ns = [r.n for r in rows]
        ax.plot(ns, [r.ideal_s for r in rows], "kx--", label="one after another (ideal)")
        for mode, style in (("unmanaged", "r-o"), ("fifo", "b-s"), ("edf", "g-^")):
            ax.plot(ns, [r.runs[mode].total_s for r in rows], style, label=mode)
        ax.set_title(f"{size} x {size} matmul")
        ax.set_xlabel("containers")
        ax.set_ylabel("total time (s)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return f"plot: {path}"


def main() -> int:
    parser = BenchParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="only 10 x 13,312 (< 1 minute)")
    parser.add_argument("--light", action="store_true", help="only the light tasks")
    parser.add_argument("--time-scale", type=positive, default=None, help="kernel time scale")
    parser.add_argument("--poll-interval", default="20ms", help="exporter poll interval")
    parser.add_argument("--seed", type=int, default=7, help="deadline mix")
    args = parser.parse_args()
    scale = args.time_scale or (0.03 if args.quick else 0.1)
    OUT.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="ggb-"))
    node = NodeStack(base, "bench", time_scale=scale, poll_interval=args.poll_interval)
    node.actuator_mode = "fast"
    print(
        f"gpusim kernel time scale {scale} (copies real length); exporter poll "
        f"{args.poll_interval}; actuator fast path",
        flush=True,
    )
    line: dict[str, Any] = {}
    try:
        node.start(progress=lambda line: print("  " + line, flush=True))
        if not args.light:
            line |= paper_b(node, QUICK_CASES if args.quick else FULL_CASES, args.seed)
        if args.light or not args.quick:
            n, tasks = LIGHT_QUICK if args.quick else LIGHT_FULL
            line |= light_case(node, n, tasks)
    finally:
        node.stop_actuator()
        node.stop()
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(line))
    return 0


def paper_b(node: NodeStack, cases: list[tuple[int, range]], seed: int) -> dict[str, Any]:
    """Paper B's cases and the pause latencies; their figures for 10 x 13,312."""
    results: list[CaseResult] = []
    for size, ns in cases:
        for n in ns:
            results.append(run_case(node, size, n, seed))
            print(table(results[-1:]).splitlines()[1], flush=True)
    staggered = staggered_pause_latency(node)
    print(table(results))
    print(plot(results, OUT / "contention.png"))
    (OUT / "contention.json").write_text(
        json.dumps([summary(r) | {"size": r.size, "n": r.n} for r in results], indent=1)
    )
    print(
        f"pause latency, tasks arriving one at a time (0.25 s apart): p50 "
        f"{percentile(staggered, 0.5):.1f} ms, p95 {percentile(staggered, 0.95):.1f} ms "
        f"({len(staggered)} pauses); the table's figures are for n tasks starting together"
    )
    key = next(r for r in results if (r.size, r.n) == (13312, 10))
    line = summary(key)
    line["pause_latency_staggered_p95_ms"] = round(percentile(staggered, 0.95), 1)
    return line


def light_case(node: NodeStack, n: int, tasks: int) -> dict[str, Any]:
    """The light tasks in each mode; their total and mean completion times."""
    light = run_light(node, n, tasks)
    print(f"{n} containers x {tasks} light tasks, all released together:")
    print(light_table(light))
    line: dict[str, Any] = {}
    for mode, run in light.items():
        line[f"light_{mode}_total_s"] = round(run.total_s, 3)
        line[f"light_{mode}_mean_completion_s"] = round(run.mean_completion_s, 3)
    return line


def summary(r: CaseResult) -> dict[str, Any]:
    return {
        "unmanaged_total_s": round(r.runs["unmanaged"].total_s, 3),
        "managed_total_s": round(r.runs["fifo"].total_s, 3),
        "ideal_sequential_s": round(r.ideal_s, 3),
        "mean_completion_gain": round(1 - r.mean("fifo") / r.mean("unmanaged"), 3),
        "pause_latency_p95_ms": round(percentile(r.pause_ms, 0.95), 1),
        "edf_hit_rate": round(r.hit("edf"), 3),
        "fifo_hit_rate": round(r.hit("fifo"), 3),
        "unmanaged_hit_rate": round(r.hit("unmanaged"), 3),
    }


if __name__ == "__main__":
    exit_on_sigterm()  # a timeout or kill still stops the stack it started
    sys.exit(main())
