"""``server``: a long-lived inference server with one context and cached memory.

It loads its model (an allocation copied in once), then answers requests one at a time in
arrival order: each is a small copy in, a few kernels, a small copy out (which waits for
the kernels, as ``cudaMemcpy`` does). Requests arrive at a rate (Poisson or fixed) or from
a trace file. A request that arrives while another runs waits. The GPU share of the
requests alone is ``rate x work`` (work in seconds of the whole GPU; on gpusim times the
daemon's time scale), so ``--rate 10 --request-work 0.03`` keeps about 30% of it busy.

With ``--metrics-port`` it also serves each request's latency (arrival to answer) as vLLM's
``vllm:e2e_request_latency_seconds`` histogram on ``--metrics-address`` (127.0.0.1), for a
latency SLO declared by container labels (``gpuguard.slo.*``).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Iterable
from typing import Any

from gpuguard.contract import WorkloadEvent as Ev
from gpuguard.gpusim.errors import GpusimError
from gpuguard.gpusim.workload.arrivals import Arrival
from gpuguard.gpusim.workload.devices import Devices
from gpuguard.gpusim.workload.events import EventLog
from gpuguard.gpusim.workload.latency_metrics import LatencyMetrics
from gpuguard.gpusim.workload.timing import Stopped, wait_until

#: the ``error`` a server logs when it cannot serve ``--metrics-port``
METRICS_PORT = "metrics_port"


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by nearest rank, or None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def answer(devices: Devices, request: Arrival, kernels: int) -> tuple[float, float]:
    """One request: copy in, ``kernels`` kernels, copy out (which waits for them).

    Returns when the device started its first kernel and ended its last (from marks).
    """
    if request.nbytes:
        devices.copy_in(request.nbytes)
    first = devices.mark()
    for _ in range(kernels):
        devices.launch(work_s=request.work / kernels)
    last = devices.mark()
    if request.nbytes:
        devices.copy_out(request.nbytes)
    reached = devices.synchronize()  # at once after the copy: it only collects the marks
    return reached[first], reached[last]


def run_server(
    args: argparse.Namespace, devices: Devices, schedule: Iterable[Arrival], log: EventLog
) -> None:
    """Load the model, then answer every scheduled request until the limits; log each."""
    metrics = None
    ready: dict[str, Any] = {"memory_bytes": args.memory_bytes}
    if args.metrics_port is not None:  # first: a port in use fails before the GPU is taken
        metrics = LatencyMetrics(args.model_name)
        try:
            metrics.serve(args.metrics_port, args.metrics_address)
        except OSError as exc:
            where = f"{args.metrics_address}:{args.metrics_port}"
            raise GpusimError(METRICS_PORT, f"cannot serve /metrics on {where}: {exc}") from None
        ready["metrics_port"] = args.metrics_port
    devices.open()
    devices.alloc(args.memory_bytes)  # the model, cached for the process's life
    devices.copy_in(args.memory_bytes)
    log.event(Ev.READY, **ready)
    start = wait_until(args.start_at)
    latencies: list[float] = []
    limited = itertools.islice(schedule, args.requests) if args.requests else schedule
    try:
        for number, request in enumerate(limited):
            if args.duration is not None and request.offset >= args.duration:
                break
            arrival = start + request.offset
            wait_until(arrival)
            began = time.time()
            if metrics is not None:
                metrics.running(1)
            gpu_start, gpu_end = answer(devices, request, args.kernels)
            end = time.time()
            if metrics is not None:
                metrics.running(0)
            latencies.append(end - arrival)
            if metrics is not None:
                metrics.observe(end - arrival)
            log.event(
                Ev.REQUEST, t=end, id=number, arrival=arrival, start=began, end=end,
                gpu_start=gpu_start, gpu_end=gpu_end, work=request.work, bytes=request.nbytes,
            )  # fmt: skip
    except Stopped:
        pass  # SIGTERM: report what was answered
    log.event(
        Ev.SUMMARY,
        requests=len(latencies),
        latency_p50_s=percentile(latencies, 0.5),
        latency_p99_s=percentile(latencies, 0.99),
    )
