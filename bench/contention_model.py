"""Does gpusim reproduce paper B's contention table (or another device profile's)?

Runs n = 1..10 concurrent 13,312 x 13,312 matmul workloads (host processes, no Docker)
against a real ``gpusim serve``, takes each task's kernel time from the workloads' own logs,
rescales it to time scale 1 and prints it beside paper B's. The last line is one JSON object:
``{"max_rel_error": ..., "time_scale": ..., "profile": ...}`` (worst task of any row; target
<= 0.05). ``--profile`` runs gpusim with another device profile (a JSON file fitted to a
real GPU) and compares with that profile's own measured curve and reference size.

    python bench/contention_model.py            # time scale 0.1, about 75 s
    python bench/contention_model.py --quick    # time scale 0.02, about 20 s
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script from anywhere: this process and the daemon and workloads it starts must all
# import the repository's packages.
REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
)

from benchargs import BenchParser, positive, positive_int  # noqa: E402

from gpuguard.demo.stack.gpusim import GpusimService  # noqa: E402
from gpuguard.demo.stack.process import exit_on_sigterm, stop_pid  # noqa: E402
from gpuguard.gpusim.profile import DEFAULT_PROFILE, load_profile  # noqa: E402

COPY_TIME_SCALE = 0.001


def run_concurrent(sim: GpusimService, n: int, size: int) -> list[float]:
    """Start ``n`` workloads together; returns each one's kernel seconds (wall)."""
    # Python start-up of n processes on a small machine takes a while; all sleep until
    # start_at so that they begin together, as in paper B.
    start_at = time.time() + 0.3 + 0.1 * n
    logs = [sim.dir / f"n{n}-{i}.log" for i in range(n)]
    procs = []
    for log in logs:
        argv = [sys.executable, "-m", "gpuguard.gpusim.workload", "--socket", str(sim.socket)]
        argv += ["--size", str(size), "--log", str(log), "--start-at", str(start_at)]
        # One copy request per phase, as paper B's program did: with many small chunks, n
        # processes on a small machine end their input phases apart (CPU scheduling), and
        # that skew, not the model, would dominate the kernel times at small time scales.
        argv += ["--chunk-bytes", str(4 * 2**30)]
        procs.append(subprocess.Popen(argv))
    try:
        for proc in procs:
            if proc.wait(timeout=600) != 0:
                raise RuntimeError(f"workload {proc.pid} exited with {proc.returncode}")
    finally:
        for proc in procs:
            stop_pid(proc.pid, timeout=5, popen=proc)
    kernel_times = []
    for log in logs:
        events = {e["event"]: e["t"] for e in map(json.loads, log.read_text().splitlines())}
        kernel_times.append(events["kernel_end"] - events["kernel_start"])
    return kernel_times


def main() -> int:
    parser = BenchParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time-scale", type=positive, default=0.1, help="kernel time scale")
    parser.add_argument("--quick", action="store_true", help="time scale 0.02")
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="device profile: name or file")
    parser.add_argument(
        "--max-n", type=positive_int, default=None, help="default: the profile's curve"
    )
    args = parser.parse_args()
    profile = load_profile(args.profile)
    curve = profile.concurrent_kernel_s
    max_n = min(args.max_n or len(curve), len(curve))
    scale = 0.02 if args.quick else args.time_scale
    directory = Path(tempfile.mkdtemp(prefix="gpusim-bench-"))
    # Copies made nearly instant: the bench measures kernels, and n processes that start a
    # shared copy a few ms apart end it further apart, so their kernels would start apart.
    options = {"time_scale": scale, "copy_time_scale": COPY_TIME_SCALE, "profile": args.profile}
    options["device"] = f"memory={max(profile.memory_bytes, 64 * 2**30)}"  # room for n tasks
    sim = GpusimService(directory, options)
    rows = []
    try:
        sim.start()
        for n in range(1, max_n + 1):
            measured = [t / scale for t in run_concurrent(sim, n, profile.reference_matmul_size)]
            paper = curve[n - 1]
            worst = max(abs(t - paper) / paper for t in measured)
            rows.append((n, paper, sum(measured) / n, max(measured) - min(measured), worst))
    finally:
        sim.stop()
        shutil.rmtree(directory, ignore_errors=True)

    source = "paper B" if profile.name == DEFAULT_PROFILE else f"profile {profile.name}"
    print(f"{source} kernel time per task vs gpusim (time scale {scale}, rescaled to 1)")
    print(
        f"{'n':>3} {'measured (s)':>12} {'gpusim mean (s)':>16} {'spread (s)':>11} "
        f"{'worst err':>10}"
    )
    for n, paper, mean, spread, worst in rows:
        print(f"{n:>3} {paper:>12.3f} {mean:>16.3f} {spread:>11.3f} {worst:>9.2%}")
    worst_error = max(r[4] for r in rows)
    print(f"max error {worst_error:.2%}")
    print(
        json.dumps(
            {"max_rel_error": round(worst_error, 4), "time_scale": scale, "profile": profile.name}
        )
    )
    return 0


if __name__ == "__main__":
    exit_on_sigterm()  # a timeout or kill still stops the stack it started
    sys.exit(main())
