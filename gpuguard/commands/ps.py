"""``gpuguard ps``: paper A's DEADLINES view of ``docker ps`` (and more).

Read from the exporter's /api/v1/state (by the reader the actuator uses too,
``gpuguard/statedoc.py``): one row per running GPU task, or per container without one.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpuguard import labels
from gpuguard.commands.errors import ServiceUnreachable
from gpuguard.commands.service import EXPORTER, add_service_flags, get_json, http_config
from gpuguard.flags import ConfigError
from gpuguard.statedoc import Container, ExporterState, StateError, Task, parse_state

DEFAULT_EXPORTER_URL = "http://127.0.0.1:10835"
PS_COLUMNS = (
    "CONTAINER ID", "NAME", "COMMAND", "DEADLINE", "GPU", "PHASE", "ELAPSED", "SLACK", "PAUSED",
)  # fmt: skip


def register(sub: Any) -> None:
    """Add ``gpuguard ps`` to ``gpuguard``'s subparsers."""
    ps = sub.add_parser(
        "ps",
        help="containers with their deadlines and GPU tasks",
        description="One row per running GPU task (or per container without one): its "
        "deadline, phase, elapsed time, slack and whether the actuator paused it, read from "
        "the exporter's /api/v1/state.",
    )
    add_service_flags(ps, EXPORTER, DEFAULT_EXPORTER_URL)
    ps.add_argument("--json", action="store_true", help="print the rows as JSON")
    ps.add_argument("--all", "-a", action="store_true", help="also stopped containers")
    ps.set_defaults(func=cmd_ps)


def cmd_ps(args: argparse.Namespace) -> int:
    try:
        tls_auth = http_config(args.exporter_http_config_file, "exporter")
    except ConfigError as exc:
        print(f"gpuguard ps: {exc}", file=sys.stderr)
        return 2
    try:
        reply = get_json(EXPORTER, args.exporter_url, "/api/v1/state", tls_auth=tls_auth)
    except ServiceUnreachable as exc:
        print(f"gpuguard ps: {exc}", file=sys.stderr)
        return 1
    if reply.status != 200:
        print(f"gpuguard ps: the exporter answered {reply.error()}", file=sys.stderr)
        return 1
    try:
        state = parse_state(reply.doc)
    except StateError as exc:
        print(
            f"gpuguard ps: the exporter's state is not what gpuguard reads: {exc}", file=sys.stderr
        )
        return 1
    rows = ps_rows(state, show_all=args.all)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows))
    return 0


def _seconds(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1f}s" if signed else f"{value:.1f}s"


def ps_rows(state: ExporterState, show_all: bool = False) -> list[dict[str, str]]:
    """One row per running task, or per container without one (pure)."""
    tasks_by_container: dict[str | None, list[Task]] = {}
    for task in state.tasks:
        tasks_by_container.setdefault(task.container_id, []).append(task)
    rows = []
    for container in state.containers:
        if not show_all and container.state not in ("running", "paused"):
            continue
        if container.deadline_s is not None:
            deadline = labels.format_duration(container.deadline_s)
        else:
            deadline = "invalid" if container.deadline_error else "-"
        base = {
            "CONTAINER ID": container.id[:12],
            "NAME": _name(container),
            "COMMAND": _shorten(container.command, 22),
            "DEADLINE": deadline,
            "PAUSED": "yes" if container.paused else "no",
        }
        tasks = tasks_by_container.get(container.id, [])
        if not tasks:
            gpus = ",".join(container.gpus) or "-"
            rows.append({**base, "GPU": gpus, "PHASE": "-", "ELAPSED": "-", "SLACK": "-"})
        for task in tasks:
            rows.append({**base, **_task_cells(task)})
    if show_all:
        for task in tasks_by_container.get(None, []):
            base = {"CONTAINER ID": "-", "NAME": f"(pid {task.pid})", "COMMAND": "-",
                    "DEADLINE": "-", "PAUSED": "no"}  # fmt: skip
            rows.append({**base, **_task_cells(task)})
    return rows


def _name(container: Container) -> str:
    """A pod's container as ``namespace/pod/container`` (as kubectl names it), else its name."""
    if container.pod:
        return f"{container.namespace or '-'}/{container.pod}/{container.name}"
    return container.name


def _task_cells(task: Task) -> dict[str, str]:
    phase = task.phase.value + (" OVERRUN" if task.overrun else "")
    return {
        "GPU": str(task.gpu),
        "PHASE": phase,
        "ELAPSED": _seconds(task.elapsed_s),
        "SLACK": _seconds(task.slack_s, signed=True),
    }


def _shorten(text: str, width: int) -> str:
    text = f'"{text}"' if text else "-"
    return text if len(text) <= width else text[: width - 4] + '..."'


def format_table(rows: list[dict[str, str]]) -> str:
    widths = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in PS_COLUMNS}
    lines = ["   ".join(c.ljust(widths[c]) for c in PS_COLUMNS).rstrip()]
    lines += ["   ".join(r[c].ljust(widths[c]) for c in PS_COLUMNS).rstrip() for r in rows]
    return "\n".join(lines)
