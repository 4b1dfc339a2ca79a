"""``gpuguard demo``: the whole stack on loopback, paper B's scenario, and a report.

Brings up a private dockerd, gpusim (no real GPU here), the exporter, the actuator,
Prometheus and Alertmanager, all on 127.0.0.1; runs two scenes (paper B's equal tasks, and
an inference server beside a best-effort training job), each twice (unmanaged sharing, then
managed admission) with live progress; prints each task's start, end, run time and deadline
outcome, the pauses, and both runs side by side, and draws a timeline picture per scene
beside the report. The stack stays up with its URLs printed; ``gpuguard demo --stop``
(``make stop``) ends every process by its PID and removes every demo container.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path(".stack")


def register(sub: Any) -> None:
    parser = sub.add_parser("demo", help="run the whole stack on loopback with a demo scenario")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state and logs (.stack)")
    parser.add_argument("--stop", action="store_true", help="stop everything the demo started")
    parser.add_argument("--containers", type=int, default=5, help="managed workload containers")
    parser.add_argument("--size", type=int, default=13312, help="matmul side N")
    parser.add_argument(
        "--time-scale", type=float, default=0.1, help="gpusim kernel time scale (copies real)"
    )
    parser.add_argument("--order", choices=["fifo", "edf"], default="edf", help="admission")
    parser.add_argument("--down", action="store_true", help="stop the stack after the report")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # The harness loads only when the demo runs: `gpuguard exporter` never imports it.
    from gpuguard.stack.localstack import LocalStack
    from gpuguard.stack.process import ServiceError

    if args.stop:
        stopped = LocalStack.stop_recorded(args.dir)
        print(f"gpuguard demo: stopped {stopped} processes" if stopped else "nothing running")
        return 0
    if os.geteuid() != 0:
        print("gpuguard demo: needs root (it starts a private dockerd)", file=sys.stderr)
        return 2
    if not 1 <= args.containers <= 20 or args.size <= 0 or args.time_scale <= 0:
        print("gpuguard demo: --containers 1..20, --size and --time-scale > 0", file=sys.stderr)
        return 2
    LocalStack.stop_recorded(args.dir)
    LocalStack.clean(args.dir)  # a fresh stack: no journal or node marks of an earlier run
    stack = LocalStack(args.dir.resolve(), time_scale=args.time_scale, order=args.order)
    started = time.monotonic()
    try:
        print("gpuguard demo: starting the stack on 127.0.0.1 ...", flush=True)
        stack.start(progress=lambda line: print("  " + line, flush=True))
        from gpuguard import demo_scenario

        report = demo_scenario.run_both(stack, args.containers, args.size)
        print("  importing gpuguard/workload:local for your own containers ...", flush=True)
        stack.prepare_user_workloads()
    except (ServiceError, TimeoutError) as exc:
        print(f"gpuguard demo: {exc}", file=sys.stderr)
        stack.stop()
        return 1
    except KeyboardInterrupt:
        stack.stop()
        return 130
    print(report)
    print(f"\ndemo took {time.monotonic() - started:.0f}s")
    (args.dir / "report.txt").write_text(report + "\n")
    if args.down:
        stack.stop()
        return 0
    print(stack.urls_text())
    print("Stop it all with: make stop   (or: gpuguard demo --stop)")
    return 0
