"""The ``gpuguard`` command: one entry point, subcommands registered by each part.

Each service (exporter, actuator, placer) registers the command that runs it; the user's
commands (``ps``, ``run``, ``nodes``) live in ``gpuguard.commands``. Each exposes
``register(subparsers)`` adding its subcommands with ``set_defaults(func=...)``;
``func(args) -> int`` is the exit status.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import NoReturn


class CommandParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the command and its ``--help``.

    A subcommand's usage runs to a dozen lines for the services; printed above the error,
    it buries the one line that says what was wrong. Subparsers inherit the class.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def unknown(self, extra: Sequence[str]) -> NoReturn:
        """Reject arguments this command does not take, suggesting the flag meant."""
        options = [o for o in self._option_string_actions if o.startswith("--")]
        near = difflib.get_close_matches(extra[0].partition("=")[0], options, n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        self.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def build_parser() -> argparse.ArgumentParser:
    from gpuguard import __version__
    from gpuguard.actuator import cli as actuator_cli
    from gpuguard.commands import demo, nodes, ps, run
    from gpuguard.exporter import cli as exporter_cli
    from gpuguard.placer import cli as placer_cli

    parser = CommandParser(
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
    # argparse reports a subcommand's unknown flag from the top-level parser, with the
    # top-level usage: report it from the subcommand that was given it instead.
    args, extra = parser.parse_known_args(argv)
    if extra:
        _subparser(parser, args.command).unknown(extra)
    status: int = args.func(args)
    return status


def _subparser(parser: argparse.ArgumentParser, command: str) -> CommandParser:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: CommandParser = sub.choices[command]
    return found


if __name__ == "__main__":
    sys.exit(main())
