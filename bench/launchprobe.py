"""What the launch probe costs and how closely it times tasks (gpusim's driver stand-in).

1. Cost per probed call: gpusim's ``gpusim_launch_loop``
   (``gpuguard/gpusim/native/cudastub.c``) calls
   ``cuLaunchKernel`` back to back, once on the probed copy of the library and once on an
   unprobed copy (uprobes attach to one file), in alternate rounds; the difference per call
   of each side's fastest round, in the loop thread's CPU time (user + kernel: the trap).
2. A launch-bound loop at 10,000 and 100,000 launches a second (100 us and 10 us of host
   work before each launch): its time with the probe over its time without, minus 1, each
   side's fastest of alternate rounds. The default probes: every launch entry point (uprobe), the
   asynchronous copies (uprobe), the waits (uprobe + uretprobe; see docs/design-notes.md).
3. The exporter's CPU (its process and the probe's, as a share of one core) with the probe
   attached while a loop launches at 10,000 a second, and idle.
4. Task start and end error against the workloads' own logs: one-shots (first launch to
   the return of the last wait, logged as ``kernel_start`` and ``output_end``) and a
   server's requests (``start``/``end``), timed by the probe's busy/idle edges.
5. Verdicts: each of those tasks judged against deadlines 10% either side of its own run
   time, by its own log and by the probe's edges; and the demo's two scenes (paper B's
   equal tasks, a server beside a trainer; each unmanaged, then managed) through the whole
   stack with the probe attached, each one-shot's and each request's own verdict beside the
   exporter's (``scenes_judged``, ``scenes_differ``, ``scenes_merged``: requests served
   back to back, never judged; ``scenes_unseen``). ``verdicts_agree`` when all agree.
6. A pushed launch: one ``cuLaunchKernel`` after 25 ms without calls (more than the task
   gap, so the probe pushes it through its ring buffer), in the thread's CPU time, under a
   probe that pushes and, on a copy of the library, one that does not, in turn
   (``wake_extra_us``: the difference of the medians).

The last line is one JSON object: ``probe_attached`` (true only when the uprobes really
ran), ``probe_ns_per_call``, ``loop_slowdown_10k``, ``loop_slowdown_100k``,
``exporter_cpu_share``, ``task_error_ms_p99``, ``verdicts_agree`` and more. Without the
probe (no root, no clang) it still prints the line, with ``probe_attached: false``.

    python bench/launchprobe.py            # about four minutes
    python bench/launchprobe.py --quick    # about two minutes (3 tasks, 8 s of serving)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO_ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(REPO_ROOT)]
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
)

from gputruth.launchprobe import PidTracker  # noqa: E402

from gpuguard.demo.stack.gpusim import GpusimService  # noqa: E402
from gpuguard.demo.stack.process import ManagedProcess, exit_on_sigterm, free_port  # noqa: E402
from gpuguard.exporter.launchprobe import LaunchProbe  # noqa: E402
from gpuguard.exporter.probe.build import probe_binary  # noqa: E402
from gpuguard.gpusim.driver import LIBRARY_NAME  # noqa: E402
from gpuguard.native import NativeBuildError  # noqa: E402

SCALE = 0.1  # gpusim's time scale: a kernel of W device-seconds lasts W * 0.1 s


def loop_seconds(lib: ctypes.CDLL, n: int, spin_ns: int) -> float:
    """CPU seconds of the calling thread (user + kernel, where a uprobe's trap is spent) for
    ``n`` launches: a CPU-bound loop's time when nothing else runs, and unmoved when other
    work on the machine preempts it."""
    before = time.thread_time()
    lib.gpusim_launch_loop(ctypes.c_ulonglong(n), ctypes.c_ulonglong(spin_ns))
    return time.thread_time() - before


def paired(probed: ctypes.CDLL, plain: ctypes.CDLL, n: int, spin_ns: int, rounds: int) -> list:
    """(probed s, plain s) for ``rounds`` alternate rounds."""
    pairs = []
    for _ in range(rounds):
        pairs.append((loop_seconds(probed, n, spin_ns), loop_seconds(plain, n, spin_ns)))
    return pairs


def measure_cost(probed: ctypes.CDLL, plain: ctypes.CDLL, quick: bool) -> dict[str, float]:
    """Each side's fastest of alternate rounds (thread CPU time)."""
    rounds = 5 if quick else 9
    n = 20_000 if quick else 200_000
    pairs = paired(probed, plain, n, 0, rounds)
    fastest_probed, fastest_plain = min(p for p, _ in pairs), min(u for _, u in pairs)
    result = {
        "probe_ns_per_call": (fastest_probed - fastest_plain) / n * 1e9,
        "call_ns": fastest_plain / n * 1e9,
    }
    for rate, spin in ((10_000, 100_000), (100_000, 10_000)):
        count = rate // (4 if quick else 1)  # a quarter of a second, or one second
        pairs = paired(probed, plain, count, spin, rounds)
        slowdown = min(p for p, _ in pairs) / min(u for _, u in pairs) - 1
        result[f"loop_slowdown_{rate // 1000}k"] = slowdown
    return result


def measure_wake(binary: Path, library: Path, tmp: Path, quick: bool) -> dict[str, float]:
    """A launch after a quiet longer than the task gap (``measure_cost``'s clock): on
    ``library`` under a probe that pushes it, and on a copy under one that does not, in
    turn; the difference of the medians."""
    copy = tmp / "unpushed" / LIBRARY_NAME
    copy.parent.mkdir()
    shutil.copy(library, copy)
    woken: list[object] = []
    probes = [
        LaunchProbe(lambda: binary, library, 0.01, lambda _s: None, woken.append, 0.02),
        LaunchProbe(lambda: binary, copy, 0.01, lambda _s: None),
    ]
    try:
        if not all(p.start().attached for p in probes):
            return {}
        pushed, unpushed = ctypes.CDLL(str(library)), ctypes.CDLL(str(copy))
        took: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(60 if quick else 200):
            for push, lib in ((True, pushed), (False, unpushed)):
                time.sleep(0.025)
                took[push].append(loop_seconds(lib, 1, 0))
    finally:
        for probe in probes:
            probe.stop()
    if not woken:
        return {}  # nothing pushed: not what this measures
    extra = statistics.median(took[True]) - statistics.median(took[False])
    return {"wake_extra_us": extra * 1e6}


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def measure_exporter(sim: GpusimService, probed: ctypes.CDLL, tmp: Path, window_s: float) -> dict:
    """CPU share of one core: the exporter and its probe, idle and under 10,000 launches/s."""
    import requests

    port = free_port()
    argv = [
        sys.executable, "-m", "gpuguard.cli", "exporter", "--gpu.backend=gpusim",
        f"--gpusim.socket={sim.socket}", f"--docker.host=unix://{tmp}/no-docker.sock",
        f"--web.listen-address=127.0.0.1:{port}",
    ]  # fmt: skip
    proc = ManagedProcess("exporter", argv, tmp / "exporter.log").start()
    try:
        proc.wait_ready(lambda: requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok)
        up = "gpuguard_exporter_launch_probe_up" in requests.get(
            f"http://127.0.0.1:{port}/metrics", timeout=5
        ).text.replace('gpuguard_exporter_launch_probe_up{node="', "")
        time.sleep(1.0)
        ticks = os.sysconf("SC_CLK_TCK")

        def share() -> float:
            pids = [proc.pid, *_children(proc.pid)]
            cpu0, wall0 = sum(_cpu_ticks(p) for p in pids), time.monotonic()
            time.sleep(window_s)
            cpu1, wall1 = sum(_cpu_ticks(p) for p in pids), time.monotonic()
            return (cpu1 - cpu0) / ticks / (wall1 - wall0)

        idle = share()
        n = int(10_000 * (window_s + 0.5))
        loop = threading.Thread(target=loop_seconds, args=(probed, n, 100_000), daemon=True)
        loop.start()
        busy = share()
        loop.join()
        attached = "launch probe attached" in (tmp / "exporter.log").read_text()
        return {"exporter_cpu_share": busy, "exporter_idle_cpu_share": idle,
                "exporter_probe_attached": attached and up}  # fmt: skip
    finally:
        proc.stop()


def run_workload(sim: GpusimService, name: str, *args: str) -> list[dict[str, Any]]:
    log = sim.dir / f"{name}.log"
    argv = [sys.executable, "-m", "gpuguard.gpusim.workload", *args[:1]]
    argv += ["--socket", str(sim.socket), "--log", str(log), *args[1:]]
    subprocess.run(argv, check=True, timeout=120, capture_output=True)
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]


def measure_tasks(sim: GpusimService, tracker: PidTracker, quick: bool) -> dict[str, Any]:
    """Start/end errors (ms) of one-shots and a server's requests, and verdict agreement."""
    runs = 4 if quick else 20
    oneshot = run_workload(
        sim, "oneshot", "oneshot", "--work-seconds", "1", "--kernels", "3",
        "--memory-bytes", "64MiB", "--repeat", str(runs), "--sleep-between", "0.1",
    )  # fmt: skip
    requests_n = 6 if quick else 40
    server = run_workload(
        sim, "server", "server", "--arrivals", "fixed", "--rate", "5", "--requests",
        str(requests_n), "--request-work", "0.5", "--kernels", "2", "--memory-bytes", "64MiB",
        "--start-at", f"{time.time() + 1.0:.3f}",
    )  # fmt: skip
    time.sleep(0.6)  # the last idle edge (task gap) and the exit seen
    own: list[tuple[float, float]] = []
    starts = [e["t"] for e in oneshot if e["event"] == "kernel_start"]
    ends = [e["t"] for e in oneshot if e["event"] == "output_end"]
    own += list(zip(starts, ends, strict=True))
    own += [(e["start"], e["end"]) for e in server if e["event"] == "request"]
    seen = tracker.tasks(oneshot[0]["pid"]) + tracker.tasks(server[0]["pid"])
    seen = [t for t in seen if t[1] - t[0] > 0.01]  # the server's model upload is no request
    errors: list[float] = []
    agree = len(seen) == len(own)
    for (own_start, own_end), (start, end) in zip(own, seen, strict=False):
        errors += [abs(start - own_start) * 1000, abs(end - own_end) * 1000]
        run = own_end - own_start
        for deadline in (0.9 * run, 1.1 * run):
            agree = agree and ((run <= deadline) == (end - start <= deadline))
    errors.sort()
    p99 = errors[min(len(errors) - 1, math.ceil(0.99 * len(errors)) - 1)] if errors else None
    return {
        "tasks_own": len(own), "tasks_seen": len(seen), "task_error_ms_p99": p99,
        "task_error_ms_max": max(errors, default=None), "verdicts_agree": agree,
    }  # fmt: skip


def measure_scenes(tmp: Path, quick: bool) -> dict[str, Any]:
    """The demo's two scenes, each unmanaged then managed, through the whole stack (private
    dockerd, gpusim, the exporter with its probe, the actuator, Prometheus, Alertmanager):
    the exporter's verdicts beside every workload's own (``demo.compare.agreement``)."""
    import requests

    from gpuguard.demo import scenes
    from gpuguard.demo.compare import Agreement, agreement
    from gpuguard.demo.stack.localstack import LocalStack

    count, size, colocation_s = (3, 8192, 8.0) if quick else (5, 13312, scenes.COLOCATION_S)
    stack = LocalStack(tmp / "stack", order="edf", default_ports=False)
    try:
        stack.start()
        node = stack.nodes[0]
        first, second = scenes.run_scenes(node, stack.dir, count, size, colocation_s)
        runs = [*first.values(), *second.values()]
        recent = requests.get(node.exporter_url + "/api/v1/state", timeout=5).json()["recent"]
        attached = "launch probe attached" in (node.base_dir / "exporter.log").read_text()
    finally:
        stack.stop()
    total = Agreement()
    for run in runs:
        found = agreement(run.result, run.seen or [])
        print(
            f"scene {run.result.name}: {found.judged} verdicts judged, {found.differ} differ, "
            f"{found.merged} requests merged (not judged), {found.unseen} unseen"
        )
        total += found
    names = {t.container for run in runs for t in run.result.tasks}
    names |= {r.container for run in runs for r in run.result.requests}
    ours = [t for t in recent if t.get("container") in names and t.get("met_deadline") is not None]
    return {
        "scenes_probe_attached": attached, "scenes_judged": total.judged,
        "scenes_differ": total.differ, "scenes_merged": total.merged,
        "scenes_unseen": total.unseen, "scenes_verdicts_agree": total.agree,
        "scenes_judged_timed_by_launch": sum(t.get("timed_by") == "launch" for t in ours),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (CI)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gg-probe-"))
    result: dict[str, Any] = {"probe_attached": False}
    sim = GpusimService(tmp / "sim", {"time_scale": SCALE}).start()
    probe: LaunchProbe | None = None
    try:
        library = sim.dir / LIBRARY_NAME
        plain_path = tmp / "plain" / LIBRARY_NAME
        plain_path.parent.mkdir()
        shutil.copy(library, plain_path)
        probed, plain = ctypes.CDLL(str(library)), ctypes.CDLL(str(plain_path))
        for lib in (probed, plain):
            lib.gpusim_launch_loop.restype = ctypes.c_ulonglong
        tracker = PidTracker()
        try:
            binary = probe_binary()
        except NativeBuildError as exc:
            print(f"no probe: {exc}")
            binary = None
        if binary is not None:
            # wakes on, as the exporter runs it (--probe.task-gap's default)
            probe = LaunchProbe(
                lambda: binary, library, 0.01, tracker.on_tick, lambda _w: None, 0.02
            )
            status = probe.start()
            result["probe_attached"] = status.attached
            print(f"probe: {'attached: ' if status.attached else 'not attached: '}{status.detail}")
        if result["probe_attached"]:
            result.update(measure_tasks(sim, tracker, args.quick))
            print(
                f"tasks: {result['tasks_seen']} seen of {result['tasks_own']}; start/end error "
                f"p99 {result['task_error_ms_p99']:.2f} ms; verdicts agree: "
                f"{result['verdicts_agree']}"
            )
            result.update(measure_cost(probed, plain, args.quick))
            print(
                f"probe: {result['probe_ns_per_call']:.0f} ns per probed call "
                f"(unprobed call {result['call_ns']:.0f} ns); launch-bound loop slower by "
                f"{100 * result['loop_slowdown_10k']:.1f}% at 10k/s, "
                f"{100 * result['loop_slowdown_100k']:.1f}% at 100k/s"
            )
            probe.stop()
            probe = None
            result.update(measure_wake(binary, library, tmp, args.quick))
            if "wake_extra_us" in result:
                print(f"a pushed launch: {result['wake_extra_us']:.1f} us more")
            result.update(measure_exporter(sim, probed, tmp, 1.0 if args.quick else 3.0))
            print(
                f"exporter + probe: {100 * result['exporter_cpu_share']:.1f}% of a core at "
                f"10k launches/s, {100 * result['exporter_idle_cpu_share']:.1f}% idle"
            )
            result.update(measure_scenes(tmp, args.quick))
            result["verdicts_agree"] = bool(
                result["verdicts_agree"] and result["scenes_verdicts_agree"]
                and result["scenes_probe_attached"]
            )  # fmt: skip
            print(
                f"demo scenes: {result['scenes_judged']} verdicts judged "
                f"({result['scenes_judged_timed_by_launch']} timed by the probe), "
                f"{result['scenes_differ']} differ from the workloads' own, "
                f"{result['scenes_merged']} requests merged, {result['scenes_unseen']} unseen"
            )
    finally:
        if probe is not None:
            probe.stop()
        sim.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    for key in ("probe_ns_per_call", "loop_slowdown_10k", "loop_slowdown_100k",
                "exporter_cpu_share", "task_error_ms_p99", "verdicts_agree"):  # fmt: skip
        result.setdefault(key, None)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
