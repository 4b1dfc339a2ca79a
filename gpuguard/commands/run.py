"""``gpuguard run``: paper A's ``docker run -dl``, a deadline label instead of a Docker fork.

It execs the docker CLI, so everything else behaves exactly like ``docker run``. With
``--placer.url`` it creates a Swarm service on the node the placer chooses instead
(``placed_run``).
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from typing import Any

from gpuguard import flags, labels
from gpuguard.commands import placed_run
from gpuguard.commands.launch import exec_docker, run_labels, split_run_flags
from gpuguard.contract import TaskMode
from gpuguard.flags import ConfigError
from gpuguard.web import client

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


def help_text() -> str:
    """``gpuguard run --help``: both forms, what each flag does, and an example."""
    about = (
        "docker run with gpuguard's labels: the exporter judges each GPU task of the container "
        "against its deadline, and with --managed the actuator may pause the container to "
        "admit others. gpuguard's flags come first; from the first other argument on, "
        "everything goes to `docker run` untouched."
    )
    swarm = (
        "On a Swarm, placed by gpuguard's placer (a `docker service create` pinned to the "
        "node and GPU it chooses):"
    )
    parser = argparse.ArgumentParser(
        prog="gpuguard run",
        usage=RUN_USAGE.removeprefix("usage: "),
        description=textwrap.fill(about, 79),
        epilog=f"{textwrap.fill(swarm, 79)}\n  {placed_run.USAGE.removeprefix('usage: ')}"
        "\n\nexample:\n  gpuguard run --deadline 9s --managed -d --name rt-1 "
        "my/cuda-image python infer.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    parser.add_argument(
        "--deadline", metavar="DURATION", required=True,
        help=f"each GPU task's deadline, e.g. 9s or 500ms (required; label {labels.DEADLINE})",
    )  # fmt: skip
    parser.add_argument(
        "--task", metavar="MODE",
        help=f"what one task is: {', '.join(TaskMode)} (label {labels.TASK}; "
        "default: the exporter's --task.default-mode)",
    )  # fmt: skip
    parser.add_argument(
        "--managed", action="store_true",
        help=f"let the actuator pause and resume this container (label {labels.MANAGED}=true)",
    )  # fmt: skip
    parser.add_argument(
        "--docker.host", metavar="URL", help="the Docker engine (default: $DOCKER_HOST or local)"
    )
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    parser.add_argument("--version", action="store_true", help="show gpuguard's version and exit")
    placed = parser.add_argument_group("with --placer.url (a Swarm service)")
    placed.add_argument(
        "--placer.url", metavar="URL", help="the placer, e.g. http://127.0.0.1:10837"
    )
    placed.add_argument(
        "--memory", metavar="BYTES", help="GPU memory the container needs (required)"
    )
    placed.add_argument("--runtime", metavar="DURATION", help="a task's run time on an idle GPU")
    placed.add_argument("--gpu-model", metavar="NAME", help="only GPUs of this model")
    placed.add_argument("--placer.token-file", metavar="PATH", help="the placer's bearer token")
    placed.add_argument(
        "--placer.http-config-file", metavar="PATH", help=client.flag_help("--placer.url")
    )
    return parser.format_help()


def cmd_run(args: argparse.Namespace) -> int:
    if args.argv[:1] in (["-h"], ["--help"]):
        print(help_text(), end="")
        return 0
    if args.argv[:1] == ["--version"]:
        from gpuguard import __version__

        print(f"gpuguard {__version__}")
        return 0
    if placed_run.wants_placer(args.argv):
        return placed_run.run_service(args.argv)
    return flags.run_configured("gpuguard run", lambda: docker_run_argv(args.argv), exec_docker)
