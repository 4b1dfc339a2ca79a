"""``gpuguard run``: paper A's ``docker run -dl``, a deadline label instead of a Docker fork.

It execs the docker CLI, so everything else behaves exactly like ``docker run``. With
``--placer.url`` it creates a Swarm service on the node the placer chooses instead
(``placed_run``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from gpuguard import flags
from gpuguard.commands import placed_run
from gpuguard.commands.launch import exec_docker, run_labels, split_run_flags
from gpuguard.flags import ConfigError

RUN_USAGE = (
    "usage: gpuguard run --deadline DURATION [--task MODE] [--managed] [--docker.host URL] "
    "[DOCKER RUN OPTIONS] IMAGE [COMMAND [ARG...]]"
)


def register(sub: Any) -> None:
    """Add ``gpuguard run`` to ``gpuguard``'s subparsers."""
    # '+' as prefix: every '-' argument reaches us untouched, so docker's own options
    # (-d, --name, --gpus ...) pass through; gpuguard's flags must come first.
    run = sub.add_parser(
        "run",
        help="docker run with a deadline label",
        prefix_chars="+",
        add_help=False,
        usage=RUN_USAGE.removeprefix("usage: "),
    )
    run.add_argument("argv", nargs=argparse.REMAINDER)
    run.set_defaults(func=cmd_run)


def docker_run_argv(argv: Sequence[str], docker: str = "docker") -> list[str]:
    """The docker command for ``gpuguard run``'s arguments; ``ConfigError`` when invalid."""
    found, rest = split_run_flags(argv, ("--deadline", "--task", "--docker.host"))
    container_labels = run_labels(found)
    if not rest:
        raise ConfigError("an IMAGE is required")
    cmd = [docker]
    if "--docker.host" in found:
        cmd += ["-H", found["--docker.host"]]
    cmd.append("run")
    for key, value in container_labels.items():
        cmd += ["--label", f"{key}={value}"]
    return cmd + rest


def cmd_run(args: argparse.Namespace) -> int:
    if args.argv[:1] in (["-h"], ["--help"]):
        print(RUN_USAGE)
        print("On a Swarm, placed by gpuguard's placer:")
        print(placed_run.USAGE.replace("usage: ", "       "))
        return 0

    if placed_run.wants_placer(args.argv):
        return placed_run.run_service(args.argv)
    return flags.run_configured("gpuguard run", lambda: docker_run_argv(args.argv), exec_docker)
