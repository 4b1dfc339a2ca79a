"""A real-time inference server beside a best-effort training loop on one GPU (TGS's case).

Real containers on a private dockerd, gpusim, the real exporter and actuator (fast path).
The server (gpusim's ``server`` workload, Poisson arrivals) answers requests that together
use about 30% of the GPU, each with a deadline; the trainer (``train``) would take all of
it. Three runs, each with the same arrivals:

  alone     the server by itself on GPU 0, and the trainer by itself on GPU 1 (another
            engine of the same daemon: they do not meet): latency and steps per second alone
  shared    both on GPU 0, unmanaged: they time-slice the GPU
  managed   both on GPU 0; the trainer labelled ``gpuguard.class=best-effort`` and managed,
            so the actuator freezes it while a request runs and thaws it after

Measured from the workloads' own logs: each request's latency (arrival to answer) against
its deadline, and the steps the device ended within the common window; from the
actuator's audit log, how long after a request's first kernel the trainer was frozen and
after its last kernel thawed. Targets (issue 8): managed p99 within 10% of alone with
every deadline met; the trainer keeps at least 60% of its solo throughput. TGS (NSDI'23)
keeps production jobs near solo speed with an interception layer inside the containers;
gpuguard only pauses and resumes them, so it learns of a request from NVML's next
per-process sample (one every 1/6 s, as gpusim's samples come) and freezes the trainer
about 0.1-0.15 s after it began; its queued kernels then still drain. That cost is fixed
per request, so the default requests are 0.5 s long (``--request-work`` x time scale).

Kernels run at ``--time-scale``; the control loop (samples, polls, pauses) runs at real
speed, so the figures hold for requests of the wall length they have here. The actuator runs
with its defaults plus ``--actuator-arg`` (repeatable: ``--actuator-arg=--policy.best-effort-
control=rate``); its CPU and audit lines per minute in the managed run are printed (each
pause, unpause and hand-over to Docker is a line). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchargs import BenchParser, positive, positive_int

from gpuguard import labels
from gpuguard.actuator.audit import read_audit
from gpuguard.contract import PriorityClass, WorkloadKind
from gpuguard.demo.stack.localstack import NodeStack
from gpuguard.demo.stack.process import exit_on_sigterm, free_port
from gpuguard.demo.stack.prometheus import PrometheusService
from gpuguard.demo.stack.scenario import ScenarioResult, WorkloadSpec, run_to_end
from gpuguard.gpusim.workload.latency_metrics import E2E_LATENCY
from gpuguard.gpusim.workload.server import percentile

RUNS = ("alone", "shared", "managed")


def server_spec(run: str, args: argparse.Namespace, device: str = "0") -> WorkloadSpec:
    flags = ["--rate", f"{args.rate}", "--request-work", f"{args.request_work}"]
    flags += ["--kernels", f"{args.kernels}", "--duration", f"{args.duration}"]
    flags += ["--seed", f"{args.seed}", "--memory-bytes", "1GiB", "--device", device]
    slo: tuple[tuple[str, str], ...] = ()
    if args.slo is not None:  # vLLM's histogram on the host's loopback, for Prometheus
        port = free_port()
        flags += ["--metrics-port", str(port)]
        slo = (
            (labels.SLO_METRIC, E2E_LATENCY),
            (labels.SLO_TARGET, args.slo),
            (labels.SLO_OBJECTIVE, args.slo_objective),
            (labels.SLO_PORT, str(port)),
        )
    return WorkloadSpec(
        f"{run}-server", kind=WorkloadKind.SERVER, kind_args=tuple(flags),
        deadline=f"{args.deadline}s", extra_labels=slo, host_network=bool(slo),
    )  # fmt: skip


def trainer_spec(run: str, args: argparse.Namespace, device: str = "0") -> WorkloadSpec:
    flags = ["--step-work", f"{args.step_work}", "--kernels", "4"]
    flags += ["--sync-every", f"{args.sync_every}", "--duration", f"{args.duration}"]
    flags += ["--memory-bytes", "2GiB", "--device", device]
    return WorkloadSpec(
        f"{run}-trainer", kind=WorkloadKind.TRAIN, kind_args=tuple(flags),
        managed=run == "managed", priority=PriorityClass.BEST_EFFORT,
    )  # fmt: skip


def specs(run: str, args: argparse.Namespace) -> list[WorkloadSpec]:
    """The containers of one run (alone: each on a GPU of its own)."""
    if run == "alone":
        return [server_spec(run, args, "0"), trainer_spec(run, args, "1")]
    return [server_spec(run, args), trainer_spec(run, args)]


def run_one(node: NodeStack, run: str, args: argparse.Namespace) -> ScenarioResult:
    # The server's start-up (context, model in) is a real-time task of its own: released
    # late enough that it has ended (the tracker's idle timeout) before the first request.
    return run_to_end(node, run, specs(run, args), args.lead_in, args.duration + args.lead_in + 60)


def p99_ms(result: ScenarioResult) -> float:
    value = percentile([r.latency_s for r in result.requests], 0.99)
    return float("nan") if value is None else 1000 * value


def steps_per_s(result: ScenarioResult, duration: float) -> float:
    return result.steps_per_s(result.released_at, result.released_at + duration)


def control_latencies(node: NodeStack, result: ScenarioResult) -> dict[str, list[float]]:
    """From the audit log: a request's first kernel -> trainer frozen, its last -> thawed."""
    starts = sorted(r.gpu_start for r in result.requests if r.gpu_start is not None)
    ends = sorted(r.gpu_end for r in result.requests if r.gpu_end is not None)
    out: dict[str, list[float]] = {"freeze_ms": [], "thaw_ms": []}
    for record in read_audit(node.base_dir / "actuator" / "audit.jsonl"):
        if record.get("event") != "action" or record.get("result") != "ok":
            continue
        if record.get("container") != "managed-trainer" or record["ts"] < result.released_at:
            continue
        done = float(record["finished"])
        if record["action"] == "pause":
            before = [t for t in starts if t <= done]
            if before:
                out["freeze_ms"].append(1000 * (done - before[-1]))
        elif record["action"] == "unpause":
            before = [t for t in ends if t <= done]
            if before:
                out["thaw_ms"].append(1000 * (done - before[-1]))
    return out


def start_prometheus(node: NodeStack, base: Path, port: int) -> PrometheusService:
    """The fast profile on this node's exporter, actuator and tenants (no Alertmanager)."""
    assert node.engine is not None
    return PrometheusService(
        base / "prometheus", port=port, profile="fast",
        exporters={f"127.0.0.1:{node.exporter_port}": node.node_name},
        actuators=[f"127.0.0.1:{node.actuator_port}"], alertmanagers=[],
        tenant_engines=[node.engine.url],
    ).start()  # fmt: skip


def run_fractions(node: NodeStack, start: float, end: float) -> list[tuple[float, float]]:
    """Rate control's changes of the run fraction within ``[start, end]``: (s in, fraction)."""
    path = node.base_dir / "actuator" / "audit.jsonl"
    return [
        (r["ts"] - start, float(r["run_fraction"]))
        for r in read_audit(path)
        if r.get("event") == "run_fraction" and start <= r["ts"] <= end
    ]


def audit_lines(node: NodeStack, start: float, end: float) -> int:
    """The audit log's lines written within ``[start, end]``."""
    path = node.base_dir / "actuator" / "audit.jsonl"
    return sum(start <= record["ts"] <= end for record in read_audit(path))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = BenchParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (< 1 minute in all)")
    parser.add_argument("--time-scale", type=positive, default=0.1, help="kernel time scale")
    parser.add_argument("--duration", type=positive, default=None, help="seconds per run")
    parser.add_argument("--rate", type=positive, default=0.6, help="requests per second")
    parser.add_argument("--request-work", type=positive, default=5.0, help="device-s a request")
    parser.add_argument("--kernels", type=positive_int, default=5, help="kernels per request")
    parser.add_argument("--deadline", type=positive, default=3.0, help="each request's, seconds")
    parser.add_argument("--step-work", type=positive, default=0.4, help="device-s a training step")
    parser.add_argument("--sync-every", type=positive_int, default=1, help="steps per sync")
    parser.add_argument("--poll-interval", default="20ms", help="exporter poll interval")
    parser.add_argument("--lead-in", type=positive, default=3.5, help="s before the release")
    parser.add_argument(
        "--seed", type=int, default=8, help="arrivals (8: 30%% of the GPU in 10 s and in 60 s)"
    )
    parser.add_argument("--actuator-arg", action="append", default=[], metavar="FLAG",
                        help="one more actuator flag (repeatable; the = form)")  # fmt: skip
    parser.add_argument(
        "--slo", default=None, metavar="TARGET",
        help="declare the server's latency SLO with this target (a bucket of its histogram: "
             "1.5s) and run Prometheus: rate control's signal",
    )  # fmt: skip
    parser.add_argument("--slo-objective", default="0.99", help="the SLO's objective")
    args = parser.parse_args()
    args.duration = args.duration or (10.0 if args.quick else 60.0)
    share = args.rate * args.request_work * args.time_scale
    base = Path(tempfile.mkdtemp(prefix="ggc-"))
    node = NodeStack(base, "bench", time_scale=args.time_scale, poll_interval=args.poll_interval)
    node.actuator_mode = "fast"
    node.extra_actuator_flags = list(args.actuator_arg)
    node.gpusim_options = {"device": ["name=gpu0", "name=gpu1"]}
    prometheus_port = free_port()
    if args.slo is not None:
        node.extra_actuator_flags.append(f"--prometheus.url=http://127.0.0.1:{prometheus_port}")
    prometheus: PrometheusService | None = None
    print(
        f"gpusim time scale {args.time_scale}; server: {args.rate}/s Poisson, "
        f"{1000 * args.request_work * args.time_scale:.0f} ms of kernels each ({share:.0%} of "
        f"the GPU), deadline {args.deadline}s; trainer: steps of "
        f"{1000 * args.step_work * args.time_scale:.0f} ms, sync every {args.sync_every}; "
        f"{args.duration}s per run; exporter poll {args.poll_interval}; actuator fast path"
        f"{' ' + ' '.join(args.actuator_arg) if args.actuator_arg else ''}",
        flush=True,
    )
    results: dict[str, ScenarioResult] = {}
    actuator_cpu: dict[str, float] = {}
    started = time.time()
    try:
        node.start(progress=lambda line: print("  " + line, flush=True))
        assert node.actuator is not None and node.exporter is not None
        if args.slo is not None:
            prometheus = start_prometheus(node, base, prometheus_port)
            print(f"  prometheus at {prometheus.url}: server SLO {args.slo} at "
                  f"{args.slo_objective}", flush=True)  # fmt: skip
        for run in RUNS:
            cpu = [cpu_seconds(p.pid) for p in (node.actuator, node.exporter)]
            results[run] = run_one(node, run, args)
            cpu = [
                cpu_seconds(p.pid) - c
                for p, c in zip((node.actuator, node.exporter), cpu, strict=True)
            ]
            actuator_cpu[run] = cpu[0]
            print(f"  {run}: done (CPU: actuator {cpu[0]:.2f}s, exporter {cpu[1]:.2f}s)")
        control = control_latencies(node, results["managed"])
        managed = results["managed"].released_at
        lines = audit_lines(node, managed, managed + args.duration)
        fractions = run_fractions(node, managed, managed + args.duration)
    finally:
        if prometheus is not None:
            prometheus.stop()
        node.stop()
        shutil.rmtree(base, ignore_errors=True)
    print(report(results, args.duration))
    print(
        f"managed: trainer frozen {len(control['freeze_ms'])} times; a request's first kernel "
        f"-> frozen: median {_median(control['freeze_ms']):.0f} ms, its last -> thawed: "
        f"median {_median(control['thaw_ms']):.0f} ms; took {time.time() - started:.0f}s"
    )
    line = summary(results, args.duration)
    line["freeze_latency_median_ms"] = round(_median(control["freeze_ms"]), 1)
    line["thaw_latency_median_ms"] = round(_median(control["thaw_ms"]), 1)
    line["audit_lines_per_min_managed"] = round(60 * lines / args.duration, 1)
    line["actuator_cpu_s_managed"] = round(actuator_cpu["managed"], 2)
    print(
        f"managed: actuator CPU {actuator_cpu['managed']:.2f} s, "
        f"{line['audit_lines_per_min_managed']:.0f} audit lines a minute"
    )
    if fractions:
        print("managed: run fraction " + ", ".join(f"{f:.2f} at {t:.0f}s" for t, f in fractions))
    line["run_fraction_end"] = fractions[-1][1] if fractions else None
    print(json.dumps(line))
    return 0


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(results: dict[str, ScenarioResult], duration: float) -> str:
    lines = [f"{'run':<8} {'requests':>8} {'p50 ms':>7} {'p99 ms':>7} {'hit':>5} {'steps/s':>8}"]
    for run, result in results.items():
        latencies = [r.latency_s for r in result.requests]
        p50 = percentile(latencies, 0.5)
        hit = result.hit_rate
        lines.append(
            f"{run:<8} {len(result.requests):>8} "
            f"{'-' if p50 is None else f'{1000 * p50:.0f}':>7} "
            f"{'-' if not latencies else f'{p99_ms(result):.0f}':>7} "
            f"{'-' if hit is None else f'{hit:.0%}':>5} "
            f"{steps_per_s(result, duration):8.1f}"
        )
    return "\n".join(lines)


def summary(results: dict[str, ScenarioResult], duration: float) -> dict[str, Any]:
    alone, managed = results["alone"], results["managed"]
    alone_steps = steps_per_s(alone, duration)
    managed_steps = steps_per_s(managed, duration)
    return {
        "rt_p99_alone_ms": round(p99_ms(alone), 1),
        "rt_p99_shared_ms": round(p99_ms(results["shared"]), 1),
        "rt_p99_managed_ms": round(p99_ms(managed), 1),
        "rt_hit_rate_shared": round(results["shared"].hit_rate or 0.0, 3),
        "rt_hit_rate_managed": round(managed.hit_rate or 0.0, 3),
        "be_steps_per_s_alone": round(alone_steps, 2),
        "be_steps_per_s_managed": round(managed_steps, 2),
        "rt_p99_managed_over_alone": round(p99_ms(managed) / p99_ms(alone), 3),
        "be_share_of_solo": round(managed_steps / alone_steps, 3) if alone_steps else None,
        "requests": len(managed.requests),
    }


if __name__ == "__main__":
    exit_on_sigterm()  # a timeout or kill still stops the stack it started
    sys.exit(main())
