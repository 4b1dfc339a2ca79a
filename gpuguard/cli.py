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

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        return super().parse_known_args(self._glued(args), namespace)

    def _glued(self, args: Sequence[str] | None) -> list[str]:
        """``--flag -1s`` as ``--flag=-1s``: argparse takes a value that starts with ``-`` for
        a flag and says only "expected one argument"; glued, the flag's own check says what
        is wrong with the value (a negative duration, say)."""
        given = list(sys.argv[1:] if args is None else args)
        out: list[str] = []
        i = 0
        while i < len(given):
            action = self._option_string_actions.get(given[i])
            value = given[i + 1] if i + 1 < len(given) else ""
            takes_one = action is not None and action.nargs is None and action.option_strings
            if takes_one and value[:1] == "-" and value[:2] != "--" and len(value) > 1:
                out.append(f"{given[i]}={value}")
                i += 2
            else:
                out.append(given[i])
                i += 1
        return out

    def unknown(self, extra: Sequence[str]) -> NoReturn:
        """Reject arguments this command does not take, suggesting the flag meant."""
        options = [o for o in self._option_string_actions if o.startswith("--")]
        near = difflib.get_close_matches(extra[0].partition("=")[0], options, n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        self.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def build_parser() -> CommandParser:
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
    # not required here: main says which argument was wrong before that a command is missing
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    exporter_cli.register(sub)
    ps.register(sub)
    run.register(sub)
    actuator_cli.register(sub)
    nodes.register(sub)
    placer_cli.register(sub)
    demo.register(sub)
    version = f"gpuguard {__version__}"
    for command in sub.choices.values():
        # `run` takes '+' flags only (its own --version is read by run itself)
        if "-" in command.prefix_chars and "--version" not in command._option_string_actions:
            command.add_argument("--version", action="version", version=version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # argparse reports a subcommand's unknown flag from the top-level parser, with the
    # top-level usage: report it from the subcommand that was given it instead.
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        if extra:  # gpuguard --bogus: name it, rather than "a command is required"
            parser.unknown(extra)
        parser.error("the following arguments are required: COMMAND")
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
