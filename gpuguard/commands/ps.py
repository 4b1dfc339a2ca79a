"""``gpuguard ps``: paper A's DEADLINES view of ``docker ps`` (and more).

Read from the exporter's /api/v1/state (by the reader the actuator uses too,
``gpuguard/statedoc.py``): one row per running GPU task, or per container without one, with
how many of the container's finished tasks met and missed their deadline (of those the
exporter keeps in its history, ``--history.size``); with ``--tasks``, those tasks listed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpuguard import labels
from gpuguard.commands.errors import ServiceUnreachable
from gpuguard.commands.service import EXPORTER, add_service_flags, get_json, http_config
from gpuguard.contract import TaskBoundary
from gpuguard.flags import ConfigError
from gpuguard.statedoc import Container, EndedTask, ExporterState, StateError, Task, parse_state

DEFAULT_EXPORTER_URL = "http://127.0.0.1:10835"
PS_COLUMNS = (
    "CONTAINER ID", "NAME", "COMMAND", "DEADLINE", "GPU", "PHASE", "ELAPSED", "SLACK", "PAUSED",
    "MET", "MISSED",
)  # fmt: skip
TASK_COLUMNS = ("CONTAINER ID", "NAME", "GPU", "STARTED", "RUN", "DEADLINE", "VERDICT")
#: finished tasks ``--tasks`` lists per container when given no number
DEFAULT_TASKS = 5


def register(sub: Any) -> None:
    """Add ``gpuguard ps`` to ``gpuguard``'s subparsers."""
    ps = sub.add_parser(
        "ps",
        help="containers with their deadlines and GPU tasks",
        description="One row per running GPU task (or per container without one): its "
        "deadline, phase, elapsed time, slack and whether the actuator paused it, and how "
        "many of the container's finished tasks MET and MISSED their deadline (of those the "
        "exporter still keeps: its --history.size, 256 tasks of the node by default), read "
        "from the exporter's /api/v1/state.",
    )
    add_service_flags(ps, EXPORTER, DEFAULT_EXPORTER_URL)
    ps.add_argument("--json", action="store_true", help="print the rows as JSON")
    ps.add_argument("--all", "-a", action="store_true", help="also stopped containers")
    ps.add_argument(
        "--tasks", "-t", type=_count, nargs="?", const=DEFAULT_TASKS, default=None, metavar="N",
        help="also list each container's last N finished tasks with their verdict "
        f"(N default: {DEFAULT_TASKS})",
    )  # fmt: skip
    ps.set_defaults(func=cmd_ps)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer of at least 1")
    return int(text)


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
    tasks = None if args.tasks is None else task_rows(state, args.tasks, show_all=args.all)
    if args.json:
        print(json.dumps(rows if tasks is None else {"containers": rows, "tasks": tasks}, indent=2))
        return 0
    print(format_table(rows))
    if tasks is not None:
        print(f"\nfinished tasks (the last {args.tasks} of each container; STARTED: before now)")
        print(format_table(tasks, TASK_COLUMNS) if tasks else "(none)")
    return 0


def _seconds(value: float | None, signed: bool = False) -> str:
    """Seconds to a tenth; a value that rounds to zero is ``0.0s`` (``+0.0s``), never
    ``-0.0s``."""
    if value is None:
        return "-"
    shown = round(value, 1) or 0.0  # -0.0 is falsy: it becomes 0.0
    return f"{shown:+.1f}s" if signed else f"{shown:.1f}s"


def ps_rows(state: ExporterState, show_all: bool = False) -> list[dict[str, str]]:
    """One row per running task, or per container without one (pure)."""
    tasks_by_container: dict[str | None, list[Task]] = {}
    for task in state.tasks:
        tasks_by_container.setdefault(task.container_id, []).append(task)
    finished = _finished(state)
    rows = []
    for container in _shown(state, show_all):
        judged = [t.met_deadline for t in finished.get(container.id, [])]
        base = {
            "CONTAINER ID": container.id[:12],
            "NAME": _name(container),
            "COMMAND": _shorten(container.command, 22),
            "DEADLINE": _deadline(container),
            "PAUSED": "yes" if container.paused else "no",
            "MET": str(judged.count(True)) if container.deadline_s is not None else "-",
            "MISSED": str(judged.count(False)) if container.deadline_s is not None else "-",
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
                    "DEADLINE": "-", "PAUSED": "no", "MET": "-", "MISSED": "-"}  # fmt: skip
            rows.append({**base, **_task_cells(task)})
    return rows


def task_rows(state: ExporterState, last: int, show_all: bool = False) -> list[dict[str, str]]:
    """The last ``last`` finished tasks of each container ``ps`` shows, oldest first, with
    their verdict: ``met``, ``MISSED``, ``merged`` (busy time that may hold several requests,
    never judged) or ``-`` (no deadline) (pure)."""
    finished = _finished(state)
    rows = []
    for container in _shown(state, show_all):
        for task in finished.get(container.id, [])[-last:]:
            rows.append(
                {
                    "CONTAINER ID": container.id[:12],
                    "NAME": _name(container),
                    "GPU": "-" if task.gpu is None else str(task.gpu),
                    "STARTED": _seconds(state.timestamp - task.started_at) + " ago",
                    "RUN": _seconds(task.run_s),
                    "DEADLINE": _deadline(container),
                    "VERDICT": _verdict(task),
                }
            )
    return rows


def _verdict(task: EndedTask) -> str:
    if task.met_deadline is not None:
        return "met" if task.met_deadline else "MISSED"
    return task.boundary if task.boundary != TaskBoundary.EXACT else "-"


def _finished(state: ExporterState) -> dict[str | None, list[EndedTask]]:
    """Each container's finished tasks in the exporter's history, oldest first; start-up
    contexts (no kernel) are no task of the container's."""
    out: dict[str | None, list[EndedTask]] = {}
    for task in sorted(state.recent, key=lambda t: t.ended_at):
        if task.boundary != TaskBoundary.NO_KERNEL:
            out.setdefault(task.container_id, []).append(task)
    return out


def _shown(state: ExporterState, show_all: bool) -> list[Container]:
    return [c for c in state.containers if show_all or c.state in ("running", "paused")]


def _deadline(container: Container) -> str:
    if container.deadline_s is not None:
        return labels.format_duration(container.deadline_s)
    return "invalid" if container.deadline_error else "-"


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


def format_table(rows: list[dict[str, str]], columns: tuple[str, ...] = PS_COLUMNS) -> str:
    widths = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in columns}
    lines = ["   ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["   ".join(r[c].ljust(widths[c]) for c in columns).rstrip() for r in rows]
    return "\n".join(lines)
