"""The workload's command line: ``python -m gpuguard.gpusim.workload [KIND] [flags]``.

KIND is ``oneshot`` (the default, so paper B's command lines keep working), ``server`` or
``train``; ``KIND -h`` lists its flags. Bad arguments are one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NoReturn

from gpuguard import loader
from gpuguard.contract import WorkloadEvent, WorkloadKind
from gpuguard.gpusim.errors import GpusimError, OutOfMemory
from gpuguard.gpusim.units import parse_size, positive_float
from gpuguard.gpusim.workload.arrivals import Arrival, parse_trace, rate_arrivals
from gpuguard.gpusim.workload.devices import Devices, SimDevices
from gpuguard.gpusim.workload.events import EXIT_FAILED, EXIT_OUT_OF_MEMORY, EventLog
from gpuguard.gpusim.workload.latency_metrics import DEFAULT_ADDRESS
from gpuguard.gpusim.workload.timing import stop_on_sigterm, wait_until

DEFAULT_CHUNK = 64 * 2**20
#: a trace of a million requests is about 40 MiB of JSON lines
MAX_TRACE_BYTES = 64 << 20


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"gpusim.workload: error: {message}\n")


def _typed(convert: Callable[[str], object]) -> Callable[[str], object]:
    def parse(text: str) -> object:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise ValueError(f"must be an integer > 0, got {text!r}")
    return int(text)


def _non_negative(text: str) -> float:
    return 0.0 if text.strip() in ("0", "0.0") else positive_float(text, "value")


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"must be a TCP port (1 to 65535), got {text!r}")
    return int(text)


def _devices(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(","))
    if not all(parts) or len(set(parts)) != len(parts):
        raise ValueError(f"a comma-separated list of distinct devices, got {text!r}")
    return parts


POSITIVE_INT = _typed(_positive_int)
SECONDS = _typed(lambda t: positive_float(t, "value"))
NON_NEGATIVE = _typed(_non_negative)
SIZE = _typed(parse_size)


def _common(kind: WorkloadKind, memory: str, default_memory: int | None) -> _Parser:
    parser = _Parser(
        prog=f"python -m gpuguard.gpusim.workload {kind.value}",
        description=sys.modules[f"gpuguard.gpusim.workload.{kind.value}"].__doc__,
        epilog="kinds: oneshot (the default), server, train; KIND -h shows a kind's flags",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--backend", choices=["sim", "cuda"], default="sim")
    parser.add_argument("--socket", type=Path, default=None, help="gpusim socket (sim)")
    parser.add_argument("--device", default="0", help="device: 0, 0:1 (MIG) or a UUID")
    parser.add_argument(
        "--devices", type=_typed(_devices), default=None, help="several devices: 0,1"
    )
    parser.add_argument("--log", default="-", help="JSON-lines log file, or - for stdout")
    parser.add_argument("--start-at", type=float, default=None, help="wall time to begin")
    parser.add_argument("--memory-bytes", type=SIZE, default=None, help=f"(default {memory})")
    parser.set_defaults(default_memory=default_memory)
    return parser


def _oneshot_parser() -> _Parser:
    parser = _common(WorkloadKind.ONESHOT, "3 N x N float32 matrices", None)
    parser.add_argument("--size", type=POSITIVE_INT, default=13312, help="matrix side N")
    parser.add_argument("--repeat", type=POSITIVE_INT, default=1, help="number of tasks")
    parser.add_argument("--sleep-between", type=NON_NEGATIVE, default=0.0, help="seconds")
    parser.add_argument("--work-seconds", type=SECONDS, default=None, help="kernel work")
    parser.add_argument("--chunk-bytes", type=SIZE, default=DEFAULT_CHUNK, help="per copy")
    parser.add_argument("--kernels", type=POSITIVE_INT, default=1, help="kernels per task")
    parser.add_argument(
        "--host-gap", type=NON_NEGATIVE, default=0.0, help="host seconds between kernels"
    )
    parser.add_argument(
        "--keep-context", action="store_true", help="one context and cached memory for all runs"
    )
    # For the child process of a CUDA run (see oneshot._run_child).
    parser.add_argument("--run-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--no-task-end", action="store_true", help=argparse.SUPPRESS)
    return parser


def _server_parser() -> _Parser:
    parser = _common(WorkloadKind.SERVER, "1GiB", 2**30)
    parser.add_argument("--rate", type=SECONDS, default=None, help="requests per second")
    parser.add_argument("--arrivals", choices=["poisson", "fixed"], default="poisson")
    parser.add_argument("--trace", type=Path, default=None, help="JSON lines: t, work, bytes")
    parser.add_argument("--requests", type=POSITIVE_INT, default=None, help="stop after N")
    parser.add_argument("--duration", type=SECONDS, default=None, help="stop after S seconds")
    parser.add_argument(
        "--request-work", type=SECONDS, default=0.02, help="kernel seconds per request"
    )
    parser.add_argument("--kernels", type=POSITIVE_INT, default=3, help="kernels per request")
    parser.add_argument("--io-bytes", type=SIZE, default=256 * 1024, help="copied each way")
    parser.add_argument("--seed", type=int, default=1, help="Poisson arrivals' seed")
    parser.add_argument(
        "--metrics-port", type=_typed(_port), default=None,
        help="serve request latency as vLLM's histogram on this port (default: none)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-address", default=DEFAULT_ADDRESS, help="address of that /metrics"
    )
    parser.add_argument("--model-name", default="gpusim", help="its model_name label")
    return parser


def _train_parser() -> _Parser:
    parser = _common(WorkloadKind.TRAIN, "2GiB", 2 * 2**30)
    parser.add_argument("--steps", type=POSITIVE_INT, default=None, help="stop after N steps")
    parser.add_argument("--duration", type=SECONDS, default=None, help="stop after S seconds")
    parser.add_argument("--step-work", type=SECONDS, default=0.05, help="kernel seconds a step")
    parser.add_argument("--kernels", type=POSITIVE_INT, default=4, help="kernels per step")
    parser.add_argument("--sync-every", type=POSITIVE_INT, default=10, help="steps per sync")
    parser.add_argument(
        "--input-wait", type=NON_NEGATIVE, default=0.0,
        help="seconds on the host after each sync, the device idle (a data loader's wait)",
    )  # fmt: skip
    return parser


_PARSERS = {
    WorkloadKind.ONESHOT: _oneshot_parser,
    WorkloadKind.SERVER: _server_parser,
    WorkloadKind.TRAIN: _train_parser,
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The kind (first word, default oneshot) and its validated flags."""
    words = list(sys.argv[1:] if argv is None else argv)
    kinds = [k.value for k in WorkloadKind]
    kind = WorkloadKind(words.pop(0)) if words and words[0] in kinds else WorkloadKind.ONESHOT
    # The kind's module docstring is its help text; import them all for the parsers.
    from gpuguard.gpusim.workload import oneshot, server, train  # noqa: F401

    parser = _PARSERS[kind]()
    args = parser.parse_args(words)
    args.kind, args.argv = kind, words
    args.addresses = args.devices or (args.device,)
    if args.memory_bytes is None:
        args.memory_bytes = args.default_memory
    problem = _check(args)
    if problem:
        parser.error(problem)
    if args.backend == "cuda":
        from gpuguard.gpusim.workload.cuda import cuda_index

        for address in args.addresses:
            try:
                cuda_index(address)
            except ValueError as exc:
                parser.error(str(exc))
    return args


def _check(args: argparse.Namespace) -> str | None:
    """What is wrong with a combination of flags argparse cannot see, if anything."""
    if args.kind is WorkloadKind.ONESHOT:
        if args.memory_bytes is not None and args.memory_bytes < 3:
            return "--memory-bytes must be at least 3"
    elif args.kind is WorkloadKind.SERVER:
        if (args.rate is None) == (args.trace is None):
            return "give one of --rate or --trace"
        if args.rate is not None and not (args.requests or args.duration):
            return "with --rate give --requests or --duration"
    elif args.steps is None and args.duration is None:
        args.steps = 100  # train: a bounded default
    return None


def _schedule(args: argparse.Namespace) -> Iterable[Arrival]:
    if args.trace is not None:
        text = loader.read_text(args.trace, "--trace", MAX_TRACE_BYTES)
        return parse_trace(text.splitlines(), args.request_work, args.io_bytes)
    poisson = args.arrivals == "poisson"
    return rate_arrivals(args.rate, poisson, args.request_work, args.io_bytes, args.seed)


def make_devices(args: argparse.Namespace) -> Devices:
    """The workload's devices on the chosen backend."""
    if args.backend == "cuda":
        from gpuguard.gpusim.workload.cuda import CudaDevices

        return CudaDevices(args.addresses)
    return SimDevices(args.socket, args.addresses)


def run(args: argparse.Namespace, log: EventLog) -> None:
    """Run the chosen kind to its end (raises GpusimError, OutOfMemory)."""
    from gpuguard.gpusim.workload.oneshot import run_oneshot
    from gpuguard.gpusim.workload.server import run_server
    from gpuguard.gpusim.workload.train import run_train

    if args.kind is WorkloadKind.ONESHOT:
        # Lets several workloads start together, as in paper B's experiments.
        wait_until(args.start_at)
        run_oneshot(args, lambda: make_devices(args), log)
    elif args.kind is WorkloadKind.SERVER:
        run_server(args, make_devices(args), _schedule(args), log)
    else:
        run_train(args, make_devices(args), log)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one workload; see the package docstring for exit statuses."""
    args = parse_args(argv)
    if args.kind is WorkloadKind.SERVER and args.trace is not None:
        try:
            _schedule(args)  # a bad trace is a bad argument: one line, exit 2, nothing run
        except ValueError as exc:
            where = "" if str(exc).startswith("--trace") else f"--trace {args.trace}: "
            print(f"gpusim.workload: error: {where}{exc}", file=sys.stderr)
            return 2
    stream = sys.stdout if args.log == "-" else open(args.log, "a", buffering=1)  # noqa: SIM115
    fields: dict[str, object] = {"size": args.size} if args.kind is WorkloadKind.ONESHOT else {}
    if len(args.addresses) > 1:
        fields["devices"] = list(args.addresses)
    log = EventLog(stream, args.kind, **fields)
    if args.kind is not WorkloadKind.ONESHOT:
        stop_on_sigterm()  # docker stop: a long-lived workload still logs its summary
    try:
        run(args, log)
    except OutOfMemory as exc:
        log.event(WorkloadEvent.ERROR, error="out_of_memory", message=exc.message)
        return EXIT_OUT_OF_MEMORY
    except GpusimError as exc:
        log.event(WorkloadEvent.ERROR, error=exc.code, message=exc.message)
        return EXIT_FAILED
    except ImportError as exc:  # --backend cuda without torch or cupy
        log.event(WorkloadEvent.ERROR, error="no_cuda", message=str(exc))
        return EXIT_FAILED
    finally:
        if stream is not sys.stdout:
            stream.close()
    return 0
