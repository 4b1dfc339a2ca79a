"""``gpuguard demo``'s flags. The demo itself is the harness (``gpuguard/demo/``): it loads
only when the demo runs, so no other command (and no service) ever imports it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path(".stack")
MAX_CONTAINERS = 20


def register(sub: Any) -> None:
    """Add ``gpuguard demo`` to ``gpuguard``'s subparsers."""
    parser = sub.add_parser(
        "demo",
        help="run the whole stack on loopback with a demo scenario",
        description="Start a private dockerd, gpusim, the exporter, the actuator, Prometheus "
        "and Alertmanager on 127.0.0.1, run paper B's scenario and an inference server beside "
        "a training job, each unmanaged then managed, and print a report. Needs root. The "
        "stack stays up afterwards (its URLs are printed) until --stop; while it is up, "
        "another demo in the same --dir refuses to start.",
    )
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, metavar="PATH",
        help="state, logs and the report (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--stop", action="store_true", help="stop everything the demo started")
    parser.add_argument(
        "--containers", type=_within(int, 1, MAX_CONTAINERS), default=5, metavar="N",
        help=f"managed workload containers, 1 to {MAX_CONTAINERS} (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--size", type=_within(int, 1), default=13312, metavar="N",
        help="side of each task's square matmul (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--time-scale", type=_within(float, 0.0, exclusive=True), default=0.1, metavar="NUMBER",
        help="gpusim's kernel time scale; copies run at real length (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--order", choices=["fifo", "edf"], default="edf",
        help="the managed runs' admission order (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--down", action="store_true", help="stop the stack after the report")
    parser.set_defaults(func=cmd_demo)


def _within(
    kind: type[int] | type[float], low: float, high: float | None = None, exclusive: bool = False
) -> Callable[[str], float]:
    """An argparse type: a ``kind`` at least ``low`` (above it when ``exclusive``), at most
    ``high``; anything else is one line from argparse."""

    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        too_low = value <= low if exclusive else value < low
        if too_low or (high is not None and value > high):
            if high is not None:
                raise argparse.ArgumentTypeError(f"{text!r}: must be {low:g} to {high:g}")
            raise argparse.ArgumentTypeError(
                f"{text!r}: must be {'above' if exclusive else 'at least'} {low:g}"
            )
        return value

    return convert


def cmd_demo(args: argparse.Namespace) -> int:
    from gpuguard.demo.main import run

    return run(args)
