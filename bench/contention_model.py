"""Does gpusim reproduce paper B's contention table?

Runs n = 1..10 concurrent 13,312 x 13,312 matmul workloads (host processes, no Docker)
against a real ``gpusim serve``, takes each task's kernel time from the workloads' own logs,
rescales it to time scale 1 and prints it beside paper B's. The last line is one JSON object:
``{"max_rel_error": ..., "time_scale": ...}`` (worst task of any row; target <= 0.05).

    python bench/contention_model.py            # time scale 0.1, about 75 s
    python bench/contention_model.py --quick    # time scale 0.02, about 20 s
"""

from __future__ import annotations

import argparse
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

from gpuguard.gpusim.model import PAPER_B_KERNEL_S, PAPER_B_SIZE  # noqa: E402
from gpuguard.stack.gpusim import GpusimService  # noqa: E402
from gpuguard.stack.process import stop_pid  # noqa: E402

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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--quick", action="store_true", help="time scale 0.02")
    parser.add_argument("--max-n", type=int, default=len(PAPER_B_KERNEL_S))
    args = parser.parse_args()
    scale = 0.02 if args.quick else args.time_scale
    directory = Path(tempfile.mkdtemp(prefix="gpusim-bench-"))
    # Copies made nearly instant: the bench measures kernels, and n processes that start a
    # shared copy a few ms apart end it further apart, so their kernels would start apart.
    sim = GpusimService(directory, {"time_scale": scale, "copy_time_scale": COPY_TIME_SCALE})
    rows = []
    try:
        sim.start()
        for n in range(1, args.max_n + 1):
            measured = [t / scale for t in run_concurrent(sim, n, PAPER_B_SIZE)]
            paper = PAPER_B_KERNEL_S[n - 1]
            worst = max(abs(t - paper) / paper for t in measured)
            rows.append((n, paper, sum(measured) / n, max(measured) - min(measured), worst))
    finally:
        sim.stop()
        shutil.rmtree(directory, ignore_errors=True)

    print(f"paper B kernel time per task vs gpusim (time scale {scale}, rescaled to 1)")
    print(
        f"{'n':>3} {'paper (s)':>10} {'gpusim mean (s)':>16} {'spread (s)':>11} {'worst err':>10}"
    )
    for n, paper, mean, spread, worst in rows:
        print(f"{n:>3} {paper:>10.3f} {mean:>16.3f} {spread:>11.3f} {worst:>9.2%}")
    print(json.dumps({"max_rel_error": round(max(r[4] for r in rows), 4), "time_scale": scale}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
