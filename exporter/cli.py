"""``gpuguard exporter``, ``gpuguard ps`` and ``gpuguard run``.

``ps`` is paper A's DEADLINES view of ``docker ps`` (and more), read from the exporter's
/api/v1/state. ``run`` is paper A's ``docker run -dl``: a deadline label instead of a Docker
fork; it execs the docker CLI so everything else behaves exactly like ``docker run``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Collection, Sequence
from typing import Any

from gpuguard import flags, labels
from gpuguard.exporter.config import add_flags, load_config
from gpuguard.exporter.errors import ConfigError

DEFAULT_EXPORTER_URL = "http://127.0.0.1:10835"
PS_COLUMNS = (
    "CONTAINER ID", "NAME", "COMMAND", "DEADLINE", "GPU", "PHASE", "ELAPSED", "SLACK", "PAUSED",
)  # fmt: skip
RUN_USAGE = (
    "usage: gpuguard run --deadline DURATION [--task MODE] [--managed] [--docker.host URL] "
    "[DOCKER RUN OPTIONS] IMAGE [COMMAND [ARG...]]"
)


def register(sub: Any) -> None:
    """Add the exporter's subcommands to ``gpuguard``'s subparsers."""
    exporter = sub.add_parser("exporter", help="run the Prometheus exporter")
    add_flags(exporter)
    exporter.set_defaults(func=cmd_exporter)

    ps = sub.add_parser("ps", help="containers with their deadlines and GPU tasks")
    ps.add_argument(
        "--exporter.url",
        dest="exporter_url",
        default=os.environ.get("GPUGUARD_EXPORTER_URL", DEFAULT_EXPORTER_URL),
        help="the exporter (default: $GPUGUARD_EXPORTER_URL or %(default)s)",
    )
    ps.add_argument("--json", action="store_true", help="print the rows as JSON")
    ps.add_argument("--all", "-a", action="store_true", help="also stopped containers")
    ps.set_defaults(func=cmd_ps)

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


# -- exporter ----------------------------------------------------------------------------


def cmd_exporter(args: argparse.Namespace) -> int:
    from gpuguard.exporter.app import run_exporter

    return flags.run_configured("gpuguard exporter", lambda: load_config(args), run_exporter)


# -- ps ----------------------------------------------------------------------------------


def cmd_ps(args: argparse.Namespace) -> int:
    import requests

    url = args.exporter_url.rstrip("/") + "/api/v1/state"
    try:
        reply = requests.get(url, timeout=5)
    except requests.RequestException as exc:
        print(f"gpuguard ps: exporter not reachable at {args.exporter_url} ({type(exc).__name__});"
              " is `gpuguard exporter` running?", file=sys.stderr)  # fmt: skip
        return 1
    if reply.status_code != 200:
        print(
            f"gpuguard ps: {url} answered {reply.status_code}: {reply.text.strip()}",
            file=sys.stderr,
        )
        return 1
    rows = ps_rows(reply.json(), show_all=args.all)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows))
    return 0


def _seconds(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1f}s" if signed else f"{value:.1f}s"


def ps_rows(state: dict[str, Any], show_all: bool = False) -> list[dict[str, str]]:
    """One row per running task, or per container without one (pure)."""
    tasks_by_container: dict[str | None, list[dict[str, Any]]] = {}
    for task in state.get("tasks", []):
        tasks_by_container.setdefault(task.get("container_id"), []).append(task)
    rows = []
    for container in state.get("containers", []):
        if not show_all and container["state"] not in ("running", "paused"):
            continue
        if container.get("deadline_s") is not None:
            deadline = labels.format_duration(container["deadline_s"])
        else:
            deadline = "invalid" if container.get("deadline_error") else "-"
        base = {
            "CONTAINER ID": container["id"][:12],
            "NAME": container["name"],
            "COMMAND": _shorten(container.get("command", ""), 22),
            "DEADLINE": deadline,
            "PAUSED": "yes" if container.get("paused") else "no",
        }
        tasks = tasks_by_container.get(container["id"], [])
        if not tasks:
            gpus = ",".join(container.get("gpus", [])) or "-"
            rows.append({**base, "GPU": gpus, "PHASE": "-", "ELAPSED": "-", "SLACK": "-"})
        for task in tasks:
            rows.append({**base, **_task_cells(task)})
    if show_all:
        for task in tasks_by_container.get(None, []):
            base = {"CONTAINER ID": "-", "NAME": f"(pid {task['pid']})", "COMMAND": "-",
                    "DEADLINE": "-", "PAUSED": "no"}  # fmt: skip
            rows.append({**base, **_task_cells(task)})
    return rows


def _task_cells(task: dict[str, Any]) -> dict[str, str]:
    phase = task["phase"] + (" OVERRUN" if task.get("overrun") else "")
    return {
        "GPU": str(task["gpu"]),
        "PHASE": phase,
        "ELAPSED": _seconds(task.get("elapsed_s")),
        "SLACK": _seconds(task.get("slack_s"), signed=True),
    }


def _shorten(text: str, width: int) -> str:
    text = f'"{text}"' if text else "-"
    return text if len(text) <= width else text[: width - 4] + '..."'


def format_table(rows: list[dict[str, str]]) -> str:
    widths = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in PS_COLUMNS}
    lines = ["   ".join(c.ljust(widths[c]) for c in PS_COLUMNS).rstrip()]
    lines += ["   ".join(r[c].ljust(widths[c]) for c in PS_COLUMNS).rstrip() for r in rows]
    return "\n".join(lines)


# -- run ---------------------------------------------------------------------------------


def split_run_flags(
    argv: Sequence[str], valued: Collection[str], switches: Collection[str] = ("--managed",)
) -> tuple[dict[str, str], list[str]]:
    """gpuguard's leading flags (``--flag value``, ``--flag=value``, switches) and the rest.

    The first argument that is not one of them starts the docker arguments. A switch maps
    to ``"true"``; ``ConfigError`` when a flag lacks its value.
    """
    found: dict[str, str] = {}
    rest = list(argv)
    while rest and rest[0].startswith("--"):
        flag, eq, value = rest[0].partition("=")
        if flag in switches and not eq:
            found[flag] = "true"
            rest.pop(0)
            continue
        if flag not in valued:
            break  # the first docker option: everything from here is docker's
        rest.pop(0)
        if not eq:
            if not rest:
                raise ConfigError(f"{flag} needs a value")
            value = rest.pop(0)
        found[flag] = value
    return found, rest


def run_labels(found: dict[str, str]) -> dict[str, str]:
    """The container labels of ``run``'s flags; ``ConfigError`` when one is bad."""
    deadline = found.get("--deadline")
    if deadline is None:
        raise ConfigError("--deadline is required (e.g. --deadline 9s)")
    try:
        labels.parse_duration(deadline)  # validated here; stored as the user wrote it
    except labels.LabelError as exc:
        raise ConfigError(f"--deadline: {exc}") from exc
    out = {labels.DEADLINE: deadline.strip()}
    task = found.get("--task")
    if task is not None:
        try:
            labels.parse_task_mode(task)
        except labels.LabelError as exc:
            raise ConfigError(f"--task: {exc}") from exc
        out[labels.TASK] = task
    if "--managed" in found:
        out[labels.MANAGED] = "true"
    return out


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
    from gpuguard.placer.swarm import USAGE, run_service, wants_placer

    if args.argv[:1] in (["-h"], ["--help"]):
        print(RUN_USAGE)
        print("On a Swarm, placed by gpuguard's placer:")
        print(USAGE.replace("usage: ", "       "))
        return 0

    if wants_placer(args.argv):
        return run_service(args.argv)
    return flags.run_configured("gpuguard run", lambda: docker_run_argv(args.argv), exec_docker)


def exec_docker(cmd: list[str]) -> int:
    """Replace this process with the docker CLI running ``cmd[1:]``; 1 when it is missing."""
    docker = shutil.which("docker")
    if docker is None:
        print("gpuguard run: the docker CLI is not installed", file=sys.stderr)
        return 1
    os.execv(docker, [docker, *cmd[1:]])
    return 1  # not reached: execv replaces this process
