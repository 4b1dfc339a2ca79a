"""``gpuguard actuator``, ``gpuguard guard`` and ``gpuguard nodes``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from gpuguard import flags
from gpuguard.actuator import guard
from gpuguard.actuator.config import add_flags, load_config
from gpuguard.placer.cli import add_nodes_flags, show_ranked


def register(subparsers: Any) -> None:
    """Add the actuator's subcommands to ``gpuguard``'s parser."""
    run_parser = subparsers.add_parser(
        "actuator",
        help="admission control and node list, driven by alerts and exporter events",
        description="Pause/unpause managed containers to admit GPU tasks one at a time, "
        "and keep the node list (Swarm label gpuguard.provisionable).",
    )
    add_flags(run_parser)
    run_parser.set_defaults(func=run_actuator)
    guard.register(subparsers)

    nodes_parser = subparsers.add_parser(
        "nodes",
        help="show the actuator's node list, or with --placer.url the placer's ranked list",
    )
    nodes_parser.add_argument(
        "--actuator.url",
        dest="actuator_url",
        default=os.environ.get("GPUGUARD_ACTUATOR_URL", "http://127.0.0.1:10836"),
        help="the actuator (default: $GPUGUARD_ACTUATOR_URL or %(default)s)",
    )
    nodes_parser.add_argument("--json", action="store_true", help="print the raw JSON")
    add_nodes_flags(nodes_parser)
    nodes_parser.set_defaults(func=show_nodes)


def run_actuator(args: argparse.Namespace) -> int:
    from gpuguard.actuator.app import run

    return flags.run_configured("gpuguard actuator", lambda: load_config(args), run)


def show_nodes(args: argparse.Namespace) -> int:
    if args.placer_url:
        return show_ranked(args)
    import requests

    url = args.actuator_url.rstrip("/") + "/api/v1/nodes"
    try:
        reply = requests.get(url, timeout=5)
        reply.raise_for_status()
        doc = reply.json()
    except (requests.RequestException, ValueError) as exc:
        print(f"gpuguard nodes: {url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(format_nodes(doc))
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
    lines.append(f"({doc.get('executor', '?')}: {doc.get('note', '')})")
    return "\n".join(lines)
