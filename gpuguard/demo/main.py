"""``gpuguard demo``: the whole stack on loopback, paper B's scenario, and a report.

Brings up a private dockerd, gpusim (no real GPU here), the exporter, the actuator,
Prometheus and Alertmanager, all on 127.0.0.1; runs two scenes (paper B's equal tasks, and
an inference server beside a best-effort training job), each twice (unmanaged sharing, then
managed admission) with live progress; prints each task's start, end, run time and deadline
outcome beside what the exporter saw of it (and why the two differ), the pauses, the node's
marks and how long they lasted, and both runs side by side, and draws a timeline picture
per scene beside the report. The stack stays up with its URLs printed; ``gpuguard demo --stop``
(``make stop``) ends every process by its PID and removes every demo container.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from gpuguard.demo import scenes
from gpuguard.demo.stack.localstack import LocalStack, running_recorded
from gpuguard.demo.stack.process import ServiceError


def run(args: argparse.Namespace) -> int:
    """``gpuguard demo`` with the flags ``gpuguard.commands.demo`` parsed.

    Refuses (exit 1, one line) while a stack it started in ``--dir`` still runs: replacing
    it would move its ports under every shell that sourced its ``env`` file."""
    if args.stop:
        stopped = LocalStack.stop_recorded(args.dir)
        print(f"gpuguard demo: stopped {stopped} processes" if stopped else "nothing running")
        return 0
    if os.geteuid() != 0:
        print("gpuguard demo: needs root, for the private dockerd it starts: run it with sudo "
              "(sudo make demo)", file=sys.stderr)  # fmt: skip
        return 2
    unusable = dir_problem(args.dir)
    if unusable:
        print(f"gpuguard demo: --dir {args.dir}: {unusable}", file=sys.stderr)
        return 2
    up = running_recorded(args.dir)
    if up:
        stop = "make stop (or: gpuguard demo --stop)" if args.dir == Path(".stack") else (
            f"gpuguard demo --stop --dir {args.dir}")  # fmt: skip
        print(f"gpuguard demo: a demo stack is already up in {args.dir} ({len(up)} of its "
              f"processes run; its URLs are in {args.dir / 'env'}): stop it first with "
              f"{stop}, then run the demo again", file=sys.stderr)  # fmt: skip
        return 1
    LocalStack.stop_recorded(args.dir)
    LocalStack.clean(args.dir)  # a fresh stack: no journal or node marks of an earlier run
    stack = LocalStack(args.dir.resolve(), time_scale=args.time_scale, order=args.order)
    started = time.monotonic()
    try:
        node = stack.nodes[0].node_name
        print(f"gpuguard demo: starting the stack on 127.0.0.1; its one node is {node}, this "
              f"machine's hostname (the exporter's default --node.name), so lines about it "
              f"start with [{node}] ...", flush=True)  # fmt: skip
        stack.start(progress=lambda line: print("  " + line, flush=True))
        report = scenes.run_both(stack, args.containers, args.size)
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


def dir_problem(directory: Path) -> str | None:
    """Why the demo cannot keep its state in ``directory`` (made if missing); None: it can."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        return f"cannot make it or write in it ({exc.strerror or exc})"
    return None
