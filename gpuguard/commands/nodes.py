"""``gpuguard nodes``: the actuator's node list, or with ``--placer.url`` the placer's ranked
list with the reasons each node or GPU was passed over."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from gpuguard import flags, labels
from gpuguard.commands.errors import ServiceUnreachable
from gpuguard.commands.placed_run import placer_duration
from gpuguard.commands.service import (
    ACTUATOR,
    PLACER,
    add_http_config_flag,
    add_service_flags,
    get_json,
    http_config,
    service_url,
)
from gpuguard.contract import NodeListExecutor

DEFAULT_ACTUATOR_URL = "http://127.0.0.1:10836"
#: the placer's default address (``gpuguard placer --web.listen-address``), for the help
DEFAULT_PLACER_URL = "http://127.0.0.1:10837"
COLUMNS = ("#", "NODE", "GPU", "MODEL", "FREE", "FLOAT", "TASKS", "BUSY", "SLOWDOWN", "WHY NOT")
GIB = 2**30


def register(subparsers: Any) -> None:
    """Add ``gpuguard nodes`` to ``gpuguard``'s subparsers."""
    nodes_parser = subparsers.add_parser(
        "nodes",
        help="show the actuator's node list, or with --placer.url the placer's ranked list",
        description="Which nodes take new real-time work: the actuator's node list (marked "
        "by alerts), or with --placer.url the placer's ranked list of nodes and GPUs with the "
        "reasons each was passed over.",
    )
    add_service_flags(nodes_parser, ACTUATOR, DEFAULT_ACTUATOR_URL)
    nodes_parser.add_argument("--json", action="store_true", help="print the raw JSON")
    add_ranked_flags(nodes_parser)
    nodes_parser.set_defaults(func=show_nodes)


def add_ranked_flags(parser: argparse.ArgumentParser) -> None:
    """The flags ``gpuguard nodes`` takes to show the placer's ranked list."""
    parser.add_argument(
        "--placer.url",
        dest="placer_url",
        type=service_url,
        metavar="URL",
        default=None,
        help=f"show the placer's ranked list (e.g. {DEFAULT_PLACER_URL}) instead of the actuator's",
    )
    parser.add_argument("--deadline", metavar="DURATION", help="rank for this deadline (e.g. 9s)")
    parser.add_argument(
        "--memory", metavar="BYTES", help="rank for this much GPU memory (e.g. 2GiB)"
    )
    parser.add_argument(
        "--runtime", metavar="DURATION", help="a task's run time on an idle GPU (e.g. 2s)"
    )
    parser.add_argument(
        "--policy", metavar="POLICY", help="gpuguard or paper-c (default: the placer's)"
    )
    parser.add_argument(
        "--placer.token-file",
        dest="placer_token_file",
        metavar="PATH",
        help="file holding the placer's bearer token (its --web.token-file), when it has one",
    )
    add_http_config_flag(parser, "placer")


def show_nodes(args: argparse.Namespace) -> int:
    if args.placer_url:
        return show_ranked(args)
    try:
        tls_auth = http_config(args.actuator_http_config_file, "actuator")
    except flags.ConfigError as exc:
        print(f"gpuguard nodes: {exc}", file=sys.stderr)
        return 2
    try:
        reply = get_json(ACTUATOR, args.actuator_url, "/api/v1/nodes", tls_auth=tls_auth)
    except ServiceUnreachable as exc:
        print(f"gpuguard nodes: {exc}", file=sys.stderr)
        return 1
    if reply.status != 200:
        print(f"gpuguard nodes: the actuator answered {reply.error()}", file=sys.stderr)
        return 1
    print(json.dumps(reply.doc, indent=2) if args.json else format_nodes(reply.doc))
    return 0


def format_nodes(doc: dict[str, Any]) -> str:
    """The node list as a table (pure, for tests)."""
    rows = [("NODE", "PROVISIONABLE", "SINCE", "REASONS")]
    for node in doc.get("nodes", []):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(node.get("since", 0)))
        reasons = ", ".join(
            f"{r['alertname']}({r['fingerprint'][:8]})" for r in node.get("reasons", [])
        )
        rows.append((node["node"], "yes" if node["provisionable"] else "NO", since, reasons or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3] for row in rows]
    lines.append(_how_marks_act(doc))
    return "\n".join(lines)


def _how_marks_act(doc: dict[str, Any]) -> str:
    """What a mark does on this node, in words (the API's ``executor`` is for programs)."""
    executor = doc.get("executor")
    if executor == NodeListExecutor.LIST_ONLY:
        return (
            "This engine is in no Swarm: a node marked NO is only listed here, and nothing "
            "keeps new work off it (in a Swarm it would get the node label "
            f"{labels.PROVISIONABLE}=false)."
        )
    if executor == NodeListExecutor.SWARM:
        return (
            f"A node marked NO gets the Swarm node label {labels.PROVISIONABLE}=false, so "
            f"services constrained to node.labels.{labels.PROVISIONABLE}!=false avoid it."
        )
    return f"({executor}: {doc.get('note', '')})"


def show_ranked(args: argparse.Namespace) -> int:
    """``gpuguard nodes --placer.url URL``: the ranked list with the reasons."""
    params = {
        name: value
        for name, value in (
            ("deadline", args.deadline),
            ("memory", args.memory),
            ("runtime", args.runtime),
            ("policy", args.policy),
        )
        if value is not None
    }
    headers = {}
    try:
        for name in ("deadline", "runtime"):  # as a label spells it, sent as the placer does
            if name in params:
                params[name] = placer_duration(f"--{name}", params[name])
        if args.placer_token_file:
            token = flags.read_token(args.placer_token_file, "placer.token-file")
            headers["Authorization"] = f"Bearer {token}"
        tls_auth = http_config(args.placer_http_config_file, "placer")
    except flags.ConfigError as exc:
        print(f"gpuguard nodes: {exc}", file=sys.stderr)
        return 2
    try:
        reply = get_json(PLACER, args.placer_url, "/api/v1/nodes", params, headers, 10.0, tls_auth)
    except ServiceUnreachable as exc:
        print(f"gpuguard nodes: {exc}", file=sys.stderr)
        return 1
    if reply.status != 200:
        print(f"gpuguard nodes: the placer answered {reply.error()}", file=sys.stderr)
        return 2 if reply.status == 400 else 1
    print(json.dumps(reply.doc, indent=2) if args.json else format_ranked(reply.doc))
    return 0


def format_ranked(doc: dict[str, Any]) -> str:
    """The ranked list as a table, best first (pure, for tests)."""
    rows = [COLUMNS]
    for i, c in enumerate(doc.get("ranked", []), start=1):
        float_time = c.get("float_time_s")
        slowdown = c.get("slowdown")
        rows.append(
            (
                str(i) if c["eligible"] else "-",
                c["node"],
                c["gpu"] if c["gpu"] is not None else "-",
                c.get("model") or "-",
                f"{c['memory_free_bytes'] / GIB:.1f}GiB",
                "inf" if float_time is None else f"{float_time:.1f}s",
                str(c.get("running_tasks", 0)),
                f"{c.get('busy_ratio', 0.0):.0%}",
                "-" if slowdown is None else f"x{slowdown:.2f}",
                ", ".join(c["reasons"]) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]  # fmt: skip
    request = doc.get("request", {})
    lines.append(
        f"({doc.get('policy')}: {doc.get('eligible', 0)} of {doc.get('candidates', 0)} eligible"
        f" for deadline {request.get('deadline_s')}s, memory "
        f"{request.get('memory_bytes', 0) / GIB:.1f}GiB)"
    )
    return "\n".join(lines)
