"""The ``gpuguard`` command: one entry point, subcommands registered by each part.

Each service (exporter, actuator, placer) registers the command that runs it; the user's
commands (``ps``, ``run``, ``nodes``) live in ``gpuguard.commands``. Each exposes
``register(subparsers)`` adding its subcommands with ``set_defaults(func=...)``;
``func(args) -> int`` is the exit status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from gpuguard import __version__
    from gpuguard.actuator import cli as actuator_cli
    from gpuguard.commands import demo, nodes, ps, run
    from gpuguard.exporter import cli as exporter_cli
    from gpuguard.placer import cli as placer_cli

    parser = argparse.ArgumentParser(
        prog="gpuguard",
        description="Deadline-aware monitoring and admission control for shared GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"gpuguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    exporter_cli.register(sub)
    ps.register(sub)
    run.register(sub)
    actuator_cli.register(sub)
    nodes.register(sub)
    placer_cli.register(sub)
    demo.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
