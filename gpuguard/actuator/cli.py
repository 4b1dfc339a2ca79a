"""``gpuguard actuator`` and ``gpuguard guard``."""

from __future__ import annotations

import argparse
from typing import Any

from gpuguard import flags
from gpuguard.actuator.config import add_flags, load_config
from gpuguard.actuator.guard import program as guard


def register(subparsers: Any) -> None:
    """Add the actuator's subcommands to ``gpuguard``'s parser."""
    run_parser = subparsers.add_parser(
        "actuator",
        help="admission control and node list, driven by alerts and exporter events",
        description="Admit GPU tasks by pausing and resuming managed containers: in "
        "--policy.order, as many at once as fit beside each other on a device (headroom), "
        "a task with precedence preempting one that holds its device (--policy.preempt); "
        "best-effort containers frozen while real-time work runs. Keeps the node list "
        "(Swarm label gpuguard.provisionable) from the alerts Alertmanager sends.",
    )
    add_flags(run_parser)
    run_parser.set_defaults(func=run_actuator)
    guard.register(subparsers)


def run_actuator(args: argparse.Namespace) -> int:
    from gpuguard.actuator.app import run

    return flags.run_configured("gpuguard actuator", lambda: load_config(args), run)
