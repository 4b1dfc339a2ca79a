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

from gpuguard import __version__
from gpuguard.gpusim import DEFAULT_SOCKET, SOCKET_ENV
from gpuguard.gpusim.client import GpusimClient, default_socket_path
from gpuguard.gpusim.config import DaemonConfig, DeviceSpec, parse_device_spec
from gpuguard.gpusim.errors import GpusimError
from gpuguard.gpusim.profile import DEFAULT_PROFILE, load_profile
from gpuguard.gpusim.units import parse_size, positive_float


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (no usage dump), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"gpusim: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpusim", description="A simulated GPU for gpuguard.")
    parser.add_argument("--version", action="version", version=f"gpusim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    serve = sub.add_parser("serve", help="run the daemon")
    socket_help = (
        "Unix socket path (default $GPUSIM_SOCKET, else /run/gpusim/gpusim.sock); its "
        "directory must exist, but for the default's"
    )
    serve.add_argument("--socket", type=Path, default=None, metavar="PATH", help=socket_help)
    serve.add_argument(
        "--device",
        action="append",
        default=[],
        metavar="SPEC",
        help="name=sim0,memory=80GiB,uuid=GPU-...,mig=3g.40gb+3g.40gb (repeatable; "
        "default one device with the profile's memory)",
    )
    serve.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        metavar="NAME|FILE",
        help=f"device profile: a shipped name or a JSON file (default {DEFAULT_PROFILE})",
    )
    serve.add_argument(
        "--time-scale",
        default="1.0",
        metavar="FACTOR",
        help="multiplies kernel durations (default 1.0: real time)",
    )
    serve.add_argument(
        "--copy-time-scale",
        default="1.0",
        metavar="FACTOR",
        help="multiplies copy durations (default 1.0: real time)",
    )
    serve.add_argument(
        "--context-memory",
        metavar="BYTES",
        help="memory each context holds, e.g. 300MiB (default: the profile's)",
    )
    serve.add_argument(
        "--sample-period",
        metavar="SECONDS",
        help="the driver's utilization sample period (default: the profile's)",
    )
    serve.add_argument(
        "--launch-queue-depth",
        metavar="N",
        help="kernels a context may have queued (default: the profile's)",
    )
    serve.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING"],
        help="log verbosity (default INFO)",
    )

    status = sub.add_parser("status", help="show devices and processes")
    status.add_argument("--socket", type=Path, default=None, metavar="PATH", help=socket_help)
    status.add_argument("--json", action="store_true", help="print the raw status reply")
    for command in (serve, status):
        command.add_argument("--version", action="version", version=f"gpusim {__version__}")
    return parser


def _depth(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--launch-queue-depth must be an integer >= 1, got {text!r}")
    return int(text)


def _config(args: argparse.Namespace) -> DaemonConfig:
    """Validate the serve flags once, into a config (ValueError with a clear message)."""
    profile = load_profile(args.profile)
    memory = profile.memory_bytes
    devices = tuple(parse_device_spec(spec, i, memory) for i, spec in enumerate(args.device))
    context_memory = profile.context_memory_bytes
    if args.context_memory is not None:
        context_memory = parse_size(args.context_memory)
    period = profile.sample_period_s
    if args.sample_period is not None:
        period = positive_float(args.sample_period, "--sample-period")
    depth = profile.launch_queue_depth
    if args.launch_queue_depth is not None:
        depth = _depth(args.launch_queue_depth)
    return DaemonConfig(
        devices=devices or (DeviceSpec(0, memory_bytes=memory),),
        time_scale=positive_float(args.time_scale, "--time-scale"),
        copy_time_scale=positive_float(args.copy_time_scale, "--copy-time-scale"),
        context_memory_bytes=context_memory,
        sample_period_s=period,
        profile=profile,
        launch_queue_depth=depth,
    )


def _serve(args: argparse.Namespace) -> int:
    from gpuguard.gpusim.daemon import Daemon, SocketInUse

    try:
        config = _config(args)
    except ValueError as exc:
        print(f"gpusim: error: {exc}", file=sys.stderr)
        return 2
    path = args.socket or default_socket_path()
    if path != Path(DEFAULT_SOCKET) and not path.parent.is_dir():
        # only the default's directory (/run/gpusim) is made: a typo must not create trees
        given = "--socket" if args.socket else f"${SOCKET_ENV}"
        print(f"gpusim: error: {given} {path}: no directory {path.parent}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    daemon = Daemon(path, config)
    try:
        daemon.bind()
    except (SocketInUse, OSError) as exc:
        print(f"gpusim: error: {exc}", file=sys.stderr)
        return 1
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: daemon.stop())
    logging.getLogger("gpusim").info(
        "serving %d device(s) on %s (profile %s, time scale %g, copy time scale %g)",
        len(config.devices),
        path,
        config.profile.name,
        config.time_scale,
        config.copy_time_scale,
    )
    daemon.serve_forever()
    return 0


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def _address(dev: dict[str, Any]) -> str:
    mig = dev.get("mig_index")
    return str(dev["index"]) if mig is None else f"{dev['index']}:{mig}"


def format_status(status: dict[str, Any]) -> str:
    """The status reply as two small tables: devices, then processes."""
    lines = [f"{'GPU':<6}{'NAME':<22}{'MEMORY USED/TOTAL (GiB)':<26}{'UTIL':>6}"]
    procs = []
    for dev in status["devices"]:
        memory = f"{_gib(dev['memory_used_bytes'])}/{_gib(dev['memory_total_bytes'])}"
        ratio = dev["utilization_ratio"]
        util = "N/A" if ratio is None else f"{ratio * 100:.0f}%"
        lines.append(f"{_address(dev):<6}{dev['name']:<22}{memory:<26}{util:>6}")
        procs += [(_address(dev), p) for p in dev["processes"]]
    lines.append("")
    lines.append(f"{'PID':<10}{'GPU':<6}{'MEMORY (MiB)':>14}{'QUEUED':>8}  PHASE")
    for address, proc in procs:
        mib = f"{proc['used_memory_bytes'] / 2**20:.0f}"
        queued = proc.get("kernels_queued", "")
        phase = proc.get("phase", "")
        lines.append(f"{proc['pid']:<10}{address:<6}{mib:>14}{queued:>8}  {phase}")
    if not procs:
        lines.append("(no processes)")
    lines.append(
        f"profile {status.get('profile')}, time scale {status.get('time_scale')}, "
        f"copy time scale {status.get('copy_time_scale')}"
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
