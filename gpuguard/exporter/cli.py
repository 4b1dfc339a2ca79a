"""``gpuguard exporter``."""

from __future__ import annotations

import argparse
from typing import Any

from gpuguard import flags
from gpuguard.exporter.config import add_flags, load_config


def register(sub: Any) -> None:
    """Add ``gpuguard exporter`` to ``gpuguard``'s subparsers."""
    exporter = sub.add_parser(
        "exporter",
        help="run the Prometheus exporter",
        description="Join the GPU's processes (NVML, or gpusim without a GPU) to their Docker "
        "containers, follow each container's GPU tasks against its gpuguard.deadline label, and "
        "serve them on /metrics, /api/v1/state and /api/v1/events.",
    )
    add_flags(exporter)
    exporter.set_defaults(func=cmd_exporter)


def cmd_exporter(args: argparse.Namespace) -> int:
    from gpuguard.exporter.app import run_exporter

    return flags.run_configured("gpuguard exporter", lambda: load_config(args), run_exporter)
