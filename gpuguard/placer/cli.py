"""``gpuguard placer``."""

from __future__ import annotations

import argparse
from typing import Any

from gpuguard import flags
from gpuguard.placer.config import add_flags, load_config


def register(sub: Any) -> None:
    """Add ``gpuguard placer`` to ``gpuguard``'s subparsers."""
    parser = sub.add_parser(
        "placer",
        help="place real-time containers across the cluster (paper C's node list)",
        description="Rank every node's record (read from Prometheus) and answer "
        "GET /api/v1/placement?deadline=...&memory=... with the node and GPU to use.",
    )
    add_flags(parser)
    parser.set_defaults(func=cmd_placer)


def cmd_placer(args: argparse.Namespace) -> int:
    from gpuguard.placer.app import run_placer

    return flags.run_configured("gpuguard placer", lambda: load_config(args), run_placer)
