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

gpusim runs at time scale 0.05 (kernel 20 device-seconds -> 1 s); copies at real length.

The last line is one JSON object: ``{"start_err_mean_s": ..., "end_err_mean_s": ...,
"runtime_err_mean_s": ..., "burst_start_err_mean_s": ..., "burst_end_err_mean_s": ...}``.

    python bench/detection_accuracy.py            # 10 x 5 tasks, 4 servers x 6 requests
    python bench/detection_accuracy.py --quick    # 4 x 3 tasks, 2 servers x 4 requests
"""

from __future__ import annotations

import argparse
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
from gpuguard.demo.stack.process import ManagedProcess, free_port  # noqa: E402

TIME_SCALE = 0.05
WORK_S = 20.0  # device-seconds: 1 s at TIME_SCALE when alone
REQUEST_WORK_S = 4.0  # device-seconds: 0.2 s of kernels per request at TIME_SCALE
REQUEST_EVERY_S = 2.037  # not a multiple of the poll: requests fall at every phase of it
# the start-up burst (context, model) ends after --task.idle-timeout (2 s) without activity
FIRST_REQUEST_AFTER_S = 5.0


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


def truth(sim: GpusimService, name: str) -> list[tuple[float, float]]:
    events = [json.loads(line) for line in (sim.dir / f"{name}.log").read_text().splitlines()]
    starts = {e["run"]: e["t"] for e in events if e["event"] == "task_start"}
    ends = {e["run"]: e["t"] for e in events if e["event"] == "task_end"}
    return [(starts[r], ends[r]) for r in sorted(starts)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer containers and tasks (CI)")
    args = parser.parse_args()
    n, repeat = (4, 3) if args.quick else (10, 5)
    n_servers, n_requests = (2, 4) if args.quick else (4, 6)
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
    sys.exit(main())
