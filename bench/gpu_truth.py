"""The real-GPU truth kit: gpuguard's code paths measured on an NVIDIA GPU.

Runs on a machine with an NVIDIA GPU, torch (or cupy) and nvidia-ml-py, and no Docker:
workloads are host processes and the exporter's poll loop runs in this process. Measures

1. NVML semantics: when a process enters the compute-process list, what ``usedGpuMemory``
   shows under a caching allocator, per-process utilization samples and their update
   interval, the cost of one sample, MIG devices;
2. detection accuracy of task start and end against the workload's own timestamps, per task
   mode, at 100 ms and 20 ms polls (paper A measured +0.22 s);
3. freeze semantics: a training loop frozen like ``docker pause``; time until its queued
   kernels drain and until it runs again after the thaw;
4. contention: n concurrent 13,312² matmuls, kernel time vs n beside paper B's Table 1 and
   gpusim's model, and a gpusim profile fitted to this GPU;
5. the launch probe on the driver's libcuda.so.1 (root): launches and waits it counts for a
   torch one-shot, and its busy spans against the workload's log and CUDA events.

Without a GPU, ``--quick`` runs the same code on gpusim (the JSON says ``"backend":
"gpusim"``), so CI covers the kit. The last line printed is the JSON result; ``--out-dir``
writes it to a file too (``make gpu-truth`` writes ``bench/results/gpu-truth-<gpu>.json``
and the fitted ``profile-<gpu>.json`` beside it).

    python bench/gpu_truth.py --quick                      # gpusim, under a minute
    python bench/gpu_truth.py --out-dir bench/results      # on a GPU: a few minutes
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO_ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(REPO_ROOT)]
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(BENCH), str(REPO_ROOT), os.environ.get("PYTHONPATH")])
)

from benchargs import BenchParser, positive  # noqa: E402
from gputruth import contention, detection, freeze, launchprobe, semantics  # noqa: E402
from gputruth.rig import Rig, open_rig  # noqa: E402

from gpuguard.contract import TaskMode  # noqa: E402

PAPER_A = {"start": 0.22, "end": 0.21}


def plan(rig: Rig, quick: bool) -> dict[str, Any]:
    """Sizes of each experiment for this rig (gpusim runs scaled; a GPU runs real sizes)."""
    on_gpu = rig.kind == "nvml"
    return {
        "compute_s": 1.0 if quick else 3.0,
        "polls": [0.1] if quick and not on_gpu else [0.1, 0.02],
        "oneshot": ["--size", "8192", "--repeat", "3" if quick else "8", "--sleep-between", "0.6"]
        + ([] if on_gpu else ["--work-seconds", "10"]),
        "server": [
            "--rate",
            "1.0",
            "--arrivals",
            "fixed",
            "--requests",
            "4" if quick else "12",
            "--kernels",
            "4",
            "--memory-bytes",
            "512MiB",
            "--request-work",
            "0.2" if on_gpu else "4",
        ],
        "freeze_rounds": 2 if quick else 10,
        "freeze_hold_s": 0.5,
        "step_work_s": 0.02 if on_gpu else 0.4,
        "contention_counts": list(range(1, 4 if quick else 11)),
        "contention_size": 13312,
        # the processes start and wait for --start-at (each imports torch after it): a few
        # seconds cover an interpreter's start even ten at once
        "contention_lead_s": 5.0 if on_gpu else 1.5,
        # each level's processes overlap this long (a GPU's kernel is short beside the
        # seconds its processes take to import torch, in no fixed order)
        "contention_span_s": 8.0 if on_gpu and not quick else 0.0,
    }


def run(rig: Rig, workdir: Path, quick: bool, skip: set[str]) -> dict[str, Any]:
    sizes = plan(rig, quick)
    result: dict[str, Any] = {"backend": rig.kind, "gpu_name": rig.gpu_name, "quick": quick}
    result["time_scale"] = rig.time_scale
    result["notes"] = rig.notes
    if "semantics" not in skip:
        result["nvml"] = semantics.run(rig, sizes["compute_s"])
    if "detection" not in skip:
        found = {}
        for poll in sizes["polls"]:
            ms = int(poll * 1000)
            for mode in (TaskMode.PROCESS, TaskMode.MEMORY, TaskMode.BURST):
                found[f"oneshot_{mode.value}_{ms}ms"] = detection.measure(
                    rig, workdir, "oneshot", sizes["oneshot"], mode, poll
                )
            found[f"server_burst_{ms}ms"] = detection.measure(
                rig, workdir, "server", sizes["server"], TaskMode.BURST, poll
            )
        result["detection"] = found
        result["start_err_mean_s"] = found["oneshot_memory_100ms"]["start_err_mean_s"]
        result["end_err_mean_s"] = found["oneshot_memory_100ms"]["end_err_mean_s"]
        result["burst_start_err_mean_s"] = found["server_burst_100ms"]["start_err_mean_s"]
        result["burst_end_err_mean_s"] = found["server_burst_100ms"]["end_err_mean_s"]
    if "freeze" not in skip:
        frozen = freeze.measure(
            rig, workdir, sizes["freeze_rounds"], sizes["freeze_hold_s"], sizes["step_work_s"]
        )
        result["freeze"] = frozen
        result["freeze_drain_ms_p95"] = frozen["freeze_drain_ms_p95"]
    if "contention" not in skip:
        measured = contention.measure(
            rig,
            workdir,
            sizes["contention_counts"],
            sizes["contention_size"],
            sizes["contention_lead_s"],
            sizes["contention_span_s"],
        )
        result["contention"] = {k: v for k, v in measured.items() if k != "kernel_s"}
        result["contention_max_rel_error_vs_gpusim"] = measured["max_rel_error_vs_gpusim"]
        result["profile"] = _profile(rig, result, measured)
    if "launchprobe" not in skip:
        result["launch_probe"] = launchprobe.measure(rig, workdir, sizes["oneshot"])
    return result


def _profile(rig: Rig, result: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any] | None:
    nvml = result.get("nvml", {})
    memory = rig.backend.sample().devices[0].memory_total_bytes
    after_context = nvml.get("memory_after", {}).get("context")
    try:
        profile = contention.fit_profile(
            _slug(rig.gpu_name), rig.gpu_name, measured,
            nvml.get("process_sample_interval_s"), memory, after_context,
        )  # fmt: skip
    except ValueError as exc:
        return {"error": str(exc)}
    return profile.to_json()


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def report(result: dict[str, Any]) -> None:
    print(f"gpu-truth on {result['gpu_name']} ({result['backend']}, time scale "
          f"{result['time_scale']:g})")  # fmt: skip
    for note in result["notes"]:
        print(f"  note: {note}")
    if "nvml" in result:
        n = result["nvml"]
        print(f"  process listed from: {n['process_listed_from']}; freed memory stays listed: "
              f"{n['freed_memory_stays_listed']}; per-process samples: "
              f"{n['process_samples_seen']} (every {n['process_sample_interval_s']} s); "
              f"one sample: p50 {n['sample_call_ms_p50']} ms")  # fmt: skip
    for key, d in result.get("detection", {}).items():
        context = d.get("start_err_from_context_mean_s")
        after = "" if context is None else f" ({context:+} s from its context)"
        print(f"  {key:<24} {d['matched']}/{d['tasks']} tasks  start {d['start_err_mean_s']:+} s"
              f"{after}  end {d['end_err_mean_s']:+} s")  # fmt: skip
    if "detection" in result:
        print(f"  paper A: start +{PAPER_A['start']} s, end +{PAPER_A['end']} s")
    if "freeze" in result:
        f = result["freeze"]
        print(f"  freeze ({f['method']}): drain p50 {f['freeze_drain_ms_p50']} ms, p95 "
              f"{f['freeze_drain_ms_p95']} ms; first step after thaw p50 "
              f"{f['thaw_first_step_ms_p50']} ms (step {f['step_ms_median']} ms)")  # fmt: skip
    if "launch_probe" in result:
        p = result["launch_probe"]
        if p["attached"]:
            print(f"  launch probe on {p['library']}: {p['launches_seen']} launches for "
                  f"{p['kernels_logged']} logged kernels; {p['runs_matched']}/{p['runs']} runs in "
                  f"{p['tasks_seen']} tasks seen; "
                  f"start {p['start_err_ms_mean']} ms, end {p['end_err_ms_mean']} ms")  # fmt: skip
            print(f"  a probed cuStreamQuery: {p['query_ns_probed']} ns against "
                  f"{p['query_ns_unprobed']} ns unprobed (entry and return probes: "
                  f"{p['probe_ns_per_query']} ns)")  # fmt: skip
        else:
            print(f"  launch probe not attached ({p.get('reason')}): {p['detail']}")
    if "contention" in result:
        print(f"  {'n':>3} {'kernel s':>9} {'ratio':>7} {'paper B':>8} {'gpusim':>7}")
        for row in result["contention"]["rows"]:
            print(f"  {row['n']:>3} {row['kernel_s']:>9.3f} {row['ratio']:>7} "
                  f"{row['paper_b']!s:>8} {row['gpusim']!s:>7}")  # fmt: skip


def main() -> int:
    parser = BenchParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer and smaller runs")
    parser.add_argument("--backend", choices=["auto", "nvml", "gpusim"], default="auto")
    parser.add_argument("--time-scale", type=positive, default=0.05, help="gpusim kernel scale")
    parser.add_argument(
        "--out-dir", type=Path,
        help="also write gpu-truth-<gpu>.json and the fitted profile-<gpu>.json here",
    )  # fmt: skip
    parser.add_argument(
        "--skip", action="append", default=[],
        choices=["semantics", "detection", "freeze", "contention", "launchprobe"],
    )  # fmt: skip
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gg-truth-"))
    started = time.monotonic()
    rig = open_rig(args.backend, workdir, args.time_scale)
    try:
        result = run(rig, workdir, args.quick, set(args.skip))
    finally:
        rig.close()
        shutil.rmtree(workdir, ignore_errors=True)
    result["seconds"] = round(time.monotonic() - started, 1)
    report(result)
    if args.out_dir is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        slug = _slug(result["gpu_name"])
        (args.out_dir / f"gpu-truth-{slug}.json").write_text(json.dumps(result, indent=2) + "\n")
        if isinstance(result.get("profile"), dict) and "name" in result["profile"]:
            profile = json.dumps(result["profile"], indent=2) + "\n"
            (args.out_dir / f"profile-{slug}.json").write_text(profile)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
