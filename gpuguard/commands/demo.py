"""``gpuguard demo``'s flags. The demo itself is the harness (``gpuguard/demo/``): it loads
only when the demo runs, so no other command (and no service) ever imports it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path(".stack")


def register(sub: Any) -> None:
    """Add ``gpuguard demo`` to ``gpuguard``'s subparsers."""
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
    parser.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from gpuguard.demo.main import run

    return run(args)
