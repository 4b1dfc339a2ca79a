"""``gpusim serve`` and ``gpusim status``."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from gpuguard.gpusim.client import GpusimClient, default_socket_path
from gpuguard.gpusim.config import (
    DEFAULT_CONTEXT_MEMORY,
    DEFAULT_SAMPLE_PERIOD_S,
    DaemonConfig,
    DeviceSpec,
    parse_device_spec,
    parse_size,
    positive_float,
)
from gpuguard.gpusim.errors import GpusimError


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (no usage dump), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"gpusim: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpusim", description="A simulated GPU for gpuguard.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--socket", type=Path, default=None, help="Unix socket path")
    serve.add_argument(
        "--device",
        action="append",
        default=[],
        metavar="SPEC",
        help="name=sim0,memory=24GiB,uuid=GPU-... (repeatable; default one 24 GiB device)",
    )
    serve.add_argument("--time-scale", default="1.0", help="multiplies kernel durations")
    serve.add_argument(
        "--copy-time-scale", default="1.0", help="multiplies copy durations (default real)"
    )
    serve.add_argument(
        "--context-memory", default=str(DEFAULT_CONTEXT_MEMORY), help="memory of each context"
    )
    serve.add_argument(
        "--sample-period", default=str(DEFAULT_SAMPLE_PERIOD_S), help="utilization period (s)"
    )
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING"])

    status = sub.add_parser("status", help="show devices and processes")
    status.add_argument("--socket", type=Path, default=None, help="Unix socket path")
    status.add_argument("--json", action="store_true", help="print the raw status reply")
    return parser


def _config(args: argparse.Namespace) -> DaemonConfig:
    """Validate the serve flags once, into a config (ValueError with a clear message)."""
    devices = tuple(parse_device_spec(spec, i) for i, spec in enumerate(args.device))
    context_memory = parse_size(args.context_memory)
    return DaemonConfig(
        devices=devices or (DeviceSpec(0),),
        time_scale=positive_float(args.time_scale, "--time-scale"),
        copy_time_scale=positive_float(args.copy_time_scale, "--copy-time-scale"),
        context_memory_bytes=context_memory,
        sample_period_s=positive_float(args.sample_period, "--sample-period"),
    )


def _serve(args: argparse.Namespace) -> int:
    from gpuguard.gpusim.daemon import Daemon, SocketInUse

    try:
        config = _config(args)
    except ValueError as exc:
        print(f"gpusim: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    path = args.socket or default_socket_path()
    daemon = Daemon(path, config)
    try:
        daemon.bind()
    except (SocketInUse, OSError) as exc:
        print(f"gpusim: error: {exc}", file=sys.stderr)
        return 1
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: daemon.stop())
    logging.getLogger("gpusim").info(
        "serving %d device(s) on %s (time scale %g, copy time scale %g)",
        len(config.devices),
        path,
        config.time_scale,
        config.copy_time_scale,
    )
    daemon.serve_forever()
    return 0


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def format_status(status: dict[str, Any]) -> str:
    """The status reply as two small tables: devices, then processes."""
    lines = [f"{'GPU':<4}{'NAME':<12}{'MEMORY USED/TOTAL (GiB)':<26}{'UTIL':>6}"]
    procs = []
    for dev in status["devices"]:
        memory = f"{_gib(dev['memory_used_bytes'])}/{_gib(dev['memory_total_bytes'])}"
        util = f"{dev['utilization_ratio'] * 100:.0f}%"
        lines.append(f"{dev['index']:<4}{dev['name']:<12}{memory:<26}{util:>6}")
        procs += [(dev["index"], p) for p in dev["processes"]]
    lines.append("")
    lines.append(f"{'PID':<10}{'GPU':<5}{'MEMORY (MiB)':>14}  PHASE")
    for index, proc in procs:
        mib = f"{proc['used_memory_bytes'] / 2**20:.0f}"
        lines.append(f"{proc['pid']:<10}{index:<5}{mib:>14}  {proc.get('phase', '')}")
    if not procs:
        lines.append("(no processes)")
    lines.append(
        f"time scale {status.get('time_scale')}, copy time scale {status.get('copy_time_scale')}"
    )
    return "\n".join(lines)


def _status(args: argparse.Namespace) -> int:
    try:
        with GpusimClient(args.socket) as client:
            status = client.status()
    except GpusimError as exc:
        print(f"gpusim: error: {exc.message}", file=sys.stderr)
        return 1
    status.pop("ok", None)
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpusim`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    return _status(args)


if __name__ == "__main__":
    sys.exit(main())
