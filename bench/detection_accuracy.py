"""Paper A's experiment: how exactly does the exporter see GPU tasks start and end?

Containers on a private dockerd repeatedly run the matmul workload on gpusim; each workload
logs its own ``task_start`` / ``task_end`` (wall clock, the ground truth, like paper A's
timers compiled into the GPU program). A real exporter subprocess polls at the default
100 ms. Each finished task in ``/api/v1/state``'s ``recent`` is matched to the workload run
of the same container and order, and the errors (measured - truth) are summarised.
Paper A measured +0.22 s (start), +0.21 s (end), +0.22 s (run time); target mean <= 0.05 s.

A second scene measures bursts (the default task mode) of long-lived servers: each server
(gpusim's ``server`` workload) keeps its context and model in memory and answers requests
of three kernels, about 2 s apart; each request logs when the device started its first kernel
and ended its last (``gpu_start``, ``gpu_end``), the truth each burst is matched with.

A third scene finds where request boundaries stop being visible: one server at
a time answers requests of ``GAP_REQUEST_S`` of kernels (the whole device) with a fixed idle
gap between them, for each gap in ``GAPS_S``; each request is classed by the task the
exporter made of it: ``own`` (a task of its own with exact boundaries: judged against its
deadline), ``merged`` (inside a merged burst: busy time, never judged) or ``joined`` (inside
an exact burst with other requests: no idle between them was visible at all, so they were
judged as one task).

gpusim runs at time scale 0.05 (kernel 20 device-seconds -> 1 s); copies at real length.

The last line is one JSON object: ``{"start_err_mean_s": ..., "end_err_mean_s": ...,
"runtime_err_mean_s": ..., "burst_start_err_mean_s": ..., "burst_end_err_mean_s": ...,
"gap_<ms>ms_own": ..., "gap_<ms>ms_merged": ..., "gap_<ms>ms_joined": ...}`` (shares of the
requests at each gap).

    python bench/detection_accuracy.py            # 10 x 5 tasks, 4 servers x 6 requests
    python bench/detection_accuracy.py --quick    # 4 x 3 tasks, 2 servers x 4 requests
    python bench/detection_accuracy.py --smoke    # 2 x 2, 1 server x 3, 3 gaps (CI)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
)

import requests  # noqa: E402

from gpuguard.demo.stack.dockerd import PrivateDockerd  # noqa: E402
from gpuguard.demo.stack.gpusim import GpusimService  # noqa: E402
from gpuguard.demo.stack.images import ensure_base_image, python_container_kwargs  # noqa: E402
from gpuguard.demo.stack.process import ManagedProcess, exit_on_sigterm, free_port  # noqa: E402

TIME_SCALE = 0.05
WORK_S = 20.0  # device-seconds: 1 s at TIME_SCALE when alone
REQUEST_WORK_S = 4.0  # device-seconds: 0.2 s of kernels per request at TIME_SCALE
REQUEST_EVERY_S = 2.037  # not a multiple of the poll: requests fall at every phase of it
# the start-up burst (context, model) ends after --task.idle-timeout (2 s) without activity
FIRST_REQUEST_AFTER_S = 5.0
# the gap sweep: idle between two requests (s), around the sample period (1/6 s) and the
# tracker's idle gap (0.5 s); each request 0.1 s of kernels, the whole device
GAPS_S = (0.004, 0.01, 0.02, 0.05, 0.12, 0.3, 0.45, 0.6, 1.0)
GAP_REQUEST_S = 0.1
GAP_LEAD_IN_S = 3.0  # the start-up (context, model, no kernel) ends after the idle timeout


def summary(errors: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(errors),
        "abs_mean": statistics.fmean(abs(e) for e in errors),
        "min": min(errors),
        "max": max(errors),
    }


def start_workloads(
    client: Any, sim: GpusimService, n: int, repeat: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    containers = {}
    for i in range(n):
        name = f"acc-{i}"
        args = [
            "gpuguard.gpusim.workload", "--socket", str(sim.socket),
            "--log", str(sim.dir / f"{name}.log"),
            "--work-seconds", str(WORK_S), "--memory-bytes", "600MiB", "--repeat", str(repeat),
            # uneven gaps so tasks start at every phase of the exporter's poll
            "--sleep-between", f"{rng.uniform(0.2, 0.6):.3f}",
        ]  # fmt: skip
        containers[name] = run_workload(client, sim, name, args, deadline="30s")
        time.sleep(rng.uniform(0.0, 0.15))
    return containers


def run_workload(client: Any, sim: GpusimService, name: str, args: list[str], deadline: str) -> Any:
    """A workload container with a deadline, logging into the daemon's directory."""
    kwargs = python_container_kwargs(
        args,
        labels={"gpuguard.deadline": deadline},
        extra_mounts={str(sim.dir): {"bind": str(sim.dir), "mode": "rw"}},
        name=name,
    )
    return client.containers.run(**kwargs)


def start_servers(
    client: Any, sim: GpusimService, n: int, requests: int, seed: int
) -> tuple[dict[str, Any], float]:
    """``n`` servers whose requests start ``FIRST_REQUEST_AFTER_S`` from now, staggered."""
    rng = random.Random(seed)
    first = time.time() + FIRST_REQUEST_AFTER_S
    servers = {}
    for i in range(n):
        name = f"srv-{i}"
        args = [
            "gpuguard.gpusim.workload", "server", "--socket", str(sim.socket),
            "--log", str(sim.dir / f"{name}.log"), "--memory-bytes", "512MiB",
            "--arrivals", "fixed", "--rate", f"{1 / REQUEST_EVERY_S:g}",
            "--requests", str(requests), "--request-work", f"{REQUEST_WORK_S:g}",
            # servers apart, at every phase of the exporter's poll
            "--start-at", f"{first + i * REQUEST_EVERY_S / n + rng.uniform(0, 0.1):.3f}",
        ]  # fmt: skip
        servers[name] = run_workload(client, sim, name, args, deadline="1s")
    return servers, first


def burst_errors(
    state: dict[str, Any], sim: GpusimService, name: str, first_request: float
) -> tuple[list[float], list[float]]:
    """Each request's burst: (start errors, end errors) against the device's own times."""
    log = [json.loads(line) for line in (sim.dir / f"{name}.log").read_text().splitlines()]
    requests = [(e["gpu_start"], e["gpu_end"]) for e in log if e["event"] == "request"]
    # The server exits right after its last request, often before NVML's next sample of it
    # is read (then nobody can see that request): that one only closes the server's run.
    last_start = requests.pop()[0]
    bursts = sorted(
        (t for t in state["recent"] if t["container"] == name and t["ended_at"] > first_request
         and t["started_at"] < last_start - 0.05),
        key=lambda t: t["started_at"],
    )  # fmt: skip
    assert len(bursts) == len(requests), (name, len(bursts), len(requests))
    starts = [b["started_at"] - r[0] for b, r in zip(bursts, requests, strict=True)]
    ends = [b["ended_at"] - r[1] for b, r in zip(bursts, requests, strict=True)]
    return starts, ends


def run_gap_server(client: Any, sim: GpusimService, gap: float, requests: int) -> Any:
    """One server whose requests are ``gap`` s apart (end to start), run to its end; returns
    its container (named ``gap-<ms>ms``), not yet removed: the state names it while it is
    there."""
    name = f"gap-{round(gap * 1000)}ms"
    every = GAP_REQUEST_S + gap
    args = [
        "gpuguard.gpusim.workload", "server", "--socket", str(sim.socket),
        "--log", str(sim.dir / f"{name}.log"), "--memory-bytes", "256MiB",
        "--arrivals", "fixed", "--rate", f"{1 / every:.6f}", "--requests", str(requests),
        "--request-work", f"{GAP_REQUEST_S / TIME_SCALE:g}", "--kernels", "1",
        "--io-bytes", "4096", "--start-at", f"{time.time() + GAP_LEAD_IN_S:.3f}",
    ]  # fmt: skip
    container = run_workload(client, sim, name, args, deadline="1s")
    status = container.wait(timeout=300)["StatusCode"]
    assert status == 0, container.logs().decode()[-2000:]
    return container


def classify_requests(
    state: dict[str, Any], sim: GpusimService, name: str
) -> tuple[dict[str, int], float]:
    """How many requests were a task of their own, in a merged burst, or joined unseen;
    and the mean idle the device really had between two requests (s)."""
    log = [json.loads(line) for line in (sim.dir / f"{name}.log").read_text().splitlines()]
    spans = [(e["gpu_start"], e["gpu_end"]) for e in log if e["event"] == "request"]
    idle = statistics.fmean(b[0] - a[1] for a, b in itertools.pairwise(spans))
    spans.pop()  # the server exits right after it, often before NVML's next sample of it
    tasks = [t for t in state["recent"] if t["container"] == name and t["boundary"] != "no_kernel"]
    out = {"own": 0, "merged": 0, "joined": 0, "unseen": 0}

    def holds(task: dict[str, Any], span: tuple[float, float]) -> bool:
        return bool(task["started_at"] < span[1] and span[0] < task["ended_at"])

    for span in spans:
        found = [t for t in tasks if holds(t, span)]
        if not found:
            out["unseen"] += 1
        elif found[0]["boundary"] == "merged":
            out["merged"] += 1
        else:
            out["own" if sum(holds(found[0], s) for s in spans) == 1 else "joined"] += 1
    return out, idle


#: one gap of each kind the full sweep finds (joined, merged, own): the CI smoke run's
SMOKE_GAPS_S = (0.004, 0.05, 0.6)


def gap_sweep(
    client: Any, sim: GpusimService, url: str, requests: int, gaps: tuple[float, ...] = GAPS_S
) -> dict[str, float]:
    """Shares of requests seen as their own task, merged, or joined, at each gap."""
    result: dict[str, float] = {}
    print(f"{'gap (ms)':>9}{'real':>7}{'own':>7}{'merged':>8}{'joined':>8}{'unseen':>8}   "
          f"({requests} requests of {1000 * GAP_REQUEST_S:.0f} ms each; real: the mean "
          f"idle between two, from their logs)")  # fmt: skip
    for gap in gaps:
        container = run_gap_server(client, sim, gap, requests + 1)
        time.sleep(1.0)  # the last burst's end is known after the idle gap
        state = requests_get_state(url)
        counts, idle = classify_requests(state, sim, container.name)
        container.remove(force=True)
        total = sum(counts.values())
        shares = "".join(
            f"{counts[k] / total:>8.0%}" for k in ("own", "merged", "joined", "unseen")
        )
        print(f"{1000 * gap:>9.0f}{1000 * idle:>7.1f}{shares}")
        result[f"gap_{round(gap * 1000)}ms_real_idle_s"] = round(idle, 4)
        for kind in ("own", "merged", "joined"):
            result[f"gap_{round(gap * 1000)}ms_{kind}"] = round(counts[kind] / total, 3)
    return result


def requests_get_state(url: str) -> dict[str, Any]:
    doc: dict[str, Any] = requests.get(url + "/api/v1/state", timeout=5).json()
    return doc


def truth(sim: GpusimService, name: str) -> list[tuple[float, float]]:
    events = [json.loads(line) for line in (sim.dir / f"{name}.log").read_text().splitlines()]
    starts = {e["run"]: e["t"] for e in events if e["event"] == "task_start"}
    ends = {e["run"]: e["t"] for e in events if e["event"] == "task_end"}
    return [(starts[r], ends[r]) for r in sorted(starts)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer containers and tasks")
    parser.add_argument(
        "--smoke", action="store_true", help="fewest, and three gaps: for CI (~40 s)"
    )
    args = parser.parse_args()
    n, repeat = (2, 2) if args.smoke else (4, 3) if args.quick else (10, 5)
    n_servers, n_requests = (1, 3) if args.smoke else (2, 4) if args.quick else (4, 6)
    tmp = Path(tempfile.mkdtemp(prefix="gg-acc-"))
    engine = PrivateDockerd(tmp / "engine")
    sim = GpusimService(tmp / "sim", {"time_scale": TIME_SCALE})
    exporter: ManagedProcess | None = None
    try:
        engine.start()
        sim.start()
        client = engine.client()
        ensure_base_image(client)
        port = free_port()
        argv = [
            sys.executable, "-m", "gpuguard.cli", "exporter", "--gpu.backend=gpusim",
            f"--gpusim.socket={sim.socket}", f"--docker.host={engine.url}",
            f"--web.listen-address=127.0.0.1:{port}", "--history.size=1000",
        ]  # fmt: skip
        exporter = ManagedProcess("exporter", argv, tmp / "exporter.log").start()
        url = f"http://127.0.0.1:{port}"
        exporter.wait_ready(lambda: requests.get(url + "/healthz", timeout=1).ok)
        containers = start_workloads(client, sim, n, repeat, seed=1)
        for container in containers.values():
            status = container.wait(timeout=300)["StatusCode"]
            assert status == 0, container.logs().decode()[-2000:]
        time.sleep(0.5)  # the last task's end is seen on the next poll
        state = requests.get(url + "/api/v1/state", timeout=5).json()
        start_err, end_err, run_err = [], [], []
        for name in containers:
            measured = sorted(
                (t for t in state["recent"] if t["container"] == name),
                key=lambda t: t["started_at"],
            )
            actual = truth(sim, name)
            assert len(measured) == len(actual), (name, len(measured), len(actual))
            for task, (start, end) in zip(measured, actual, strict=True):
                start_err.append(task["started_at"] - start)
                end_err.append(task["ended_at"] - end)
                run_err.append(task["run_s"] - (end - start))
        for container in containers.values():
            container.remove(force=True)
        servers, first_request = start_servers(client, sim, n_servers, n_requests + 1, seed=2)
        for container in servers.values():
            status = container.wait(timeout=300)["StatusCode"]
            assert status == 0, container.logs().decode()[-2000:]
        time.sleep(1.0)  # the last burst's end is known after the idle gap
        state = requests.get(url + "/api/v1/state", timeout=5).json()
        burst_start, burst_end = [], []
        for name in servers:
            starts, ends = burst_errors(state, sim, name, first_request)
            burst_start += starts
            burst_end += ends
        for container in servers.values():
            container.remove(force=True)
        gaps = SMOKE_GAPS_S if args.smoke else GAPS_S
        sweep = gap_sweep(client, sim, url, 5 if args.quick or args.smoke else 8, gaps)
        stats = {"start": summary(start_err), "end": summary(end_err), "runtime": summary(run_err),
                 "burst_start": summary(burst_start), "burst_end": summary(burst_end)}  # fmt: skip
        print(f"{len(start_err)} tasks in {n} containers, {len(burst_start)} requests of "
              f"{n_servers} servers; poll 100 ms, time scale {TIME_SCALE}")  # fmt: skip
        print(f"{'error (s)':<12}{'mean':>9}{'|mean|':>9}{'min':>9}{'max':>9}   paper A mean")
        for key, paper in (("start", 0.22), ("end", 0.21), ("runtime", 0.22),
                           ("burst_start", None), ("burst_end", None)):  # fmt: skip
            s = stats[key]
            print(f"{key:<12}{s['mean']:+9.4f}{s['abs_mean']:9.4f}{s['min']:+9.4f}{s['max']:+9.4f}"
                  f"   {'-' if paper is None else f'+{paper:.2f}'}")  # fmt: skip
        result: dict[str, Any] = {
            "tasks": len(start_err), "bursts": len(burst_start), "time_scale": TIME_SCALE,
        }  # fmt: skip
        for key, s in stats.items():
            for stat, value in s.items():
                result[f"{key}_err_{stat}_s"] = round(value, 4)
        result.update(sweep)
        client.close()
    finally:
        if exporter is not None:
            exporter.stop()
        sim.stop()
        engine.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    exit_on_sigterm()  # a timeout or kill still stops the stack it started
    sys.exit(main())
