"""Paper C's node list: how fast it is built and ranked, and how well each policy places.

1. Fig. 11: time to build and rank the node list from N nodes' records (N = 10, 100,
   1,000): the placer's Prometheus reply for N nodes (JSON text, as the placer receives it)
   is parsed into records, ranked (gpuguard's policy) and the best GPU chosen. Median of
   repeated runs. Target: <= 50 ms at 1,000 nodes.
2. Placement policies on a simulated cluster driven by gpusim's contention model
   (``gpusim/contention.py``: concurrent kernels time-slice with paper B's overhead): the same
   arrivals (fixed seeds) are placed by each policy and every task's deadline is judged.
   Workloads: paper C's Fig. 3 (8,192 x 8,192 matmuls, arriving in bursts; memory allows
   21 on a 24 GiB GPU, paper C ran up to 20) and Fig. 4 (light inference tasks, each
   container keeping a GPU about 70% busy).
   The placer sees each node's record as Prometheus would (refreshed every scrape, so up to
   one scrape old). A container a policy cannot place counts all its tasks as missed, as does
   one placed on a GPU whose memory is gone by the time it starts (cudaMalloc fails).
   Policies: ``random`` (any GPU with the memory), ``least_loaded`` (lowest busy ratio,
   then most free memory), ``paper_c`` (paper C's Algorithm 2 on the node records) and
   ``gpuguard`` (the placer's default policy, told each task's run time alone);
   ``gpuguard_no_runtime`` is the same policy without the run time.
3. kube-scheduler's two calls per pod (filter, then prioritize) over HTTP on loopback, at a
   Prometheus stand-in that answers after 0.9 s, 1.2 s and 1.9 s (``placer.yaml``'s
   ``--prometheus.timeout=2s``, the default ``--records.cache=1s``; each pod arrives once the
   cache has expired, as when pods are a scrape or more apart). Target: one query per pod,
   so a pod costs what one reply does.

    python bench/placement.py            # 5 seeds per workload, 1,000-node ranking x 50
    python bench/placement.py --quick    # 2 seeds, shorter runs: under a minute

The last line is one JSON object: ``rank_ms_10``, ``rank_ms_100``, ``rank_ms_1000`` (and
``rank_only_ms_<n>``: ranking a list already built, as while the records are cached) and
``hit_rate_<policy>`` (the mean of the two workloads' hit rates), plus per workload
``fig3_hit_rate_<policy>`` / ``fig4_hit_rate_<policy>`` and ``rejected_<policy>``;
``extender_pod_ms_<delay in ms>`` (median filter + prioritize of a pod) and
``extender_queries_per_pod_<delay in ms>``.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from standins.slow_prometheus import SlowPrometheus  # noqa: E402

from gpuguard.contract import Phase, TaskMode  # noqa: E402
from gpuguard.exporter.model import DeviceSample  # noqa: E402
from gpuguard.exporter.record import RecordConfig, gpu_record  # noqa: E402
from gpuguard.exporter.tracker import TaskView  # noqa: E402
from gpuguard.gpusim.contention import (  # noqa: E402
    ContentionSimulator,
    Job,
    JobKind,
    matmul_bytes,
    matmul_work_s,
)
from gpuguard.noderecord import GpuRecord, NodeRecord  # noqa: E402
from gpuguard.placer import extender  # noqa: E402
from gpuguard.placer.http import placer_server  # noqa: E402
from gpuguard.placer.ranking import NodeView, Policy, Request, rank  # noqa: E402
from gpuguard.placer.reservations import Reservations  # noqa: E402
from gpuguard.placer.service import Placer  # noqa: E402
from gpuguard.placer.source import PrometheusSource, views_from_samples  # noqa: E402

GIB = 2**30
CONTEXT_BYTES = 300 * 2**20
SCRAPE_S = 1.0  # Prometheus' fast profile
START_S = 0.5  # placement to the container's first task
RECORD = RecordConfig()  # the exporter's defaults
#: The placer's --placement.settle by its rule: container start + one scrape + a margin.
SETTLE_S = START_S + SCRAPE_S + 0.5
POLICIES = ("random", "least_loaded", "paper_c", "gpuguard", "gpuguard_no_runtime")
#: (node, GPU memory in GiB per GPU): 6 one-GPU nodes and 2 nodes with two smaller GPUs.
CLUSTER = [(f"node-{i}", [24]) for i in range(6)] + [(f"node-{i}", [16, 16]) for i in (6, 7)]


# --- 1. Fig. 11: build and rank the node list ----------------------------------------------


def prometheus_reply(n_nodes: int, rng: random.Random) -> str:
    """The placer's query result for ``n_nodes`` one-GPU nodes, as Prometheus sends it."""
    result = []
    now = time.time()

    def series(name: str, labels: dict[str, str], value: float) -> None:
        metric = {"__name__": name, **{k: v for k, v in labels.items() if k != "uuid"}}
        result.append(
            {"metric": metric, "value": [now, repr(value) if math.isfinite(value) else "+Inf"]}
        )

    for i in range(n_nodes):
        node = {"node": f"gpu-node-{i:04d}"}
        gpu = {**node, "gpu": "0"}
        running = rng.randint(0, 6)
        state = int(rng.random() > 0.2)
        series("gpuguard_exporter_last_poll_timestamp_seconds", node, now - rng.random())
        series("gpuguard_actuator_node_provisionable", node, 1.0)
        series("gpuguard_gpu_info", {**gpu, "uuid": f"GPU-{i}", "name": "NVIDIA A100"}, 1.0)
        series("gpuguard_gpu_state", gpu, state)
        if not state:  # the query asks only for the reasons that hold
            series("gpuguard_gpu_state_reason", {**gpu, "reason": "saturated"}, 1.0)
        series(
            "gpuguard_gpu_float_time_seconds", gpu, rng.uniform(-5, 100) if running else math.inf
        )
        series("gpuguard_gpu_free_memory_bytes", gpu, float(rng.randint(0, 80) * GIB))
        series("gpuguard_gpu_memory_total_bytes", gpu, float(80 * GIB))
        series("gpuguard_gpu_busy_ratio", gpu, rng.random())
        series("gpuguard_gpu_running_tasks", gpu, float(running))
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})


def rank_ms(n_nodes: int, repeats: int) -> tuple[float, float]:
    """Median ms to decode the reply for ``n_nodes`` nodes, build the list, rank and choose;
    and to rank and choose alone (what a request costs while the records are cached)."""
    body = prometheus_reply(n_nodes, random.Random(n_nodes))
    request = Request(deadline_s=5.0, memory_bytes=4 * GIB, runtime_s=1.0)
    times, rank_only = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        samples = json.loads(body)["data"]["result"]
        views = views_from_samples(samples, time.time())
        built = time.perf_counter()
        ranking = rank(views, request)
        ranking.choice  # noqa: B018 - part of what is timed
        done = time.perf_counter()
        times.append((done - started) * 1000)
        rank_only.append((done - built) * 1000)
    assert len(ranking.candidates) == n_nodes
    return statistics.median(times), statistics.median(rank_only)


# --- 2. the simulated cluster ---------------------------------------------------------------


@dataclass(frozen=True)
class ContainerSpec:
    """One real-time container: its tasks, memory and deadline, and when it arrives."""

    id: int
    arrival: float
    work_s: float  # each task's kernel work (seconds alone on the GPU)
    gap_s: float  # host time between two tasks
    tasks: int
    memory_bytes: int
    deadline_s: float


def fig3_arrivals(rng: random.Random, duration_s: float) -> list[ContainerSpec]:
    """8,192 x 8,192 matmuls (2.5 s alone), six per container, arriving in bursts of 1-5."""
    work = matmul_work_s(8192)
    memory = matmul_bytes(8192) + CONTEXT_BYTES
    specs: list[ContainerSpec] = []
    t = 0.0
    while True:
        t += rng.expovariate(1 / 6.0)
        if t > duration_s:
            return specs
        for _ in range(rng.randint(1, 5)):
            deadline = work * rng.uniform(1.5, 5.0)
            specs.append(ContainerSpec(len(specs), t, work, 0.5, 6, memory, deadline))


def fig4_arrivals(rng: random.Random, duration_s: float) -> list[ContainerSpec]:
    """Light inference: 50 ms kernels every 75 ms (about 70% busy alone), 40 per container."""
    specs: list[ContainerSpec] = []
    t = 0.0
    while True:
        t += rng.expovariate(2.2)
        if t > duration_s:
            return specs
        deadline = 0.05 * rng.uniform(1.5, 5.0)
        specs.append(ContainerSpec(len(specs), t, 0.05, 0.025, 40, GIB // 2, deadline))


@dataclass
class _Task:
    container: ContainerSpec
    number: int
    started: float
    job: Job | None = None


@dataclass
class SimGpu:
    """One simulated GPU: the contention model, its memory, busy time and tasks."""

    node: str
    key: str
    total: int
    sim: ContentionSimulator = field(default_factory=ContentionSimulator)
    used: int = 0
    busy: deque[tuple[float, float]] = field(default_factory=deque)
    tasks: dict[int, _Task] = field(default_factory=dict)  # job id -> task
    finished: deque[TaskView] = field(default_factory=lambda: deque(maxlen=256))

    def __post_init__(self) -> None:
        self.sim.on_segment = self._segment

    def _segment(self, segment: object) -> None:
        start, end = segment.start, segment.end  # type: ignore[attr-defined]
        if not segment.sm_share:  # type: ignore[attr-defined]
            return
        if self.busy and self.busy[-1][1] >= start:
            self.busy[-1] = (self.busy[-1][0], end)
        else:
            self.busy.append((start, end))

    def busy_ratio(self, now: float, window: float) -> float:
        since = now - window
        while self.busy and self.busy[0][1] < since:
            self.busy.popleft()
        busy = sum(min(e, now) - max(s, since) for s, e in self.busy if e > since)
        return max(0.0, min(1.0, busy / window))

    def record(self, now: float) -> GpuRecord:
        device = DeviceSample(int(self.key), self.key, "sim", self.total, self.used, None)
        running = [self._view(task, now) for task in self.tasks.values()]
        return gpu_record(
            device, running, self.finished, now, self.busy_ratio(now, RECORD.busy_window_s), RECORD
        )

    def _view(self, task: _Task, now: float, ended: float | None = None) -> TaskView:
        deadline = task.container.deadline_s
        return TaskView(
            task_id=f"{task.container.id}:{task.number}",
            container_id=str(task.container.id),
            pid=task.container.id,
            gpu=self.key,
            gpu_index=0,
            mig_index=None,
            proc_start_ticks=0,
            order=(task.container.id, task.number),
            mode=TaskMode.PROCESS,  # the record reads no mode: any would do
            phase=Phase.ENDED if ended is not None else Phase.COMPUTING,
            started_at=task.started,
            memory_bytes=task.container.memory_bytes,
            sm_ratio=1.0,
            deadline_s=deadline,
            overrun=(ended if ended is not None else now) - task.started > deadline,
            ended_at=ended,
        )


Chooser = Callable[[list[NodeView], Request, float], tuple[str, str] | None]


def make_chooser(policy: str, seed: int) -> Chooser:
    """The placement decision of ``policy`` on the records the placer sees."""
    rng = random.Random(seed)
    reservations = Reservations(SETTLE_S)

    def fits(views: list[NodeView], request: Request) -> list[tuple[NodeView, GpuRecord]]:
        return [
            (v, g)
            for v in views
            for g in v.record.gpus
            if g.memory_free_bytes >= request.memory_bytes
        ]

    def choose(views: list[NodeView], request: Request, now: float) -> tuple[str, str] | None:
        if policy == "random":
            options = fits(views, request)
            return (
                None if not options else (lambda v, g: (v.record.node, g.gpu))(*rng.choice(options))
            )
        if policy == "least_loaded":
            options = fits(views, request)
            if not options:
                return None
            v, g = min(options, key=lambda o: (o[1].busy_ratio, -o[1].memory_free_bytes))
            return v.record.node, g.gpu
        if policy == "paper_c":
            choice = rank(views, request, Policy.PAPER_C).choice
        else:
            if policy == "gpuguard_no_runtime":
                request = Request(request.deadline_s, request.memory_bytes)
            pending = reservations.pending({v.record.node: v.record.timestamp for v in views}, now)
            choice = rank(views, request, Policy.GPUGUARD, pending).choice
        if choice is None or choice.gpu is None:
            return None
        if policy.startswith("gpuguard"):
            reservations.add(choice.node, choice.gpu, request.memory_bytes, now)
        return choice.node, choice.gpu

    return choose


@dataclass
class Outcome:
    hits: int = 0
    tasks: int = 0
    rejected: int = 0


def simulate(specs: list[ContainerSpec], choose: Chooser) -> Outcome:
    """Run every container of ``specs`` on a fresh cluster, placing each with ``choose``."""
    gpus = {
        (node, str(i)): SimGpu(node, str(i), gib * GIB)
        for node, sizes in CLUSTER
        for i, gib in enumerate(sizes)
    }
    outcome = Outcome(tasks=sum(s.tasks for s in specs))
    events: list[tuple[float, int, str, object]] = []
    seq = itertools.count()

    def at(t: float, kind: str, item: object) -> None:
        heapq.heappush(events, (t, next(seq), kind, item))

    for spec in specs:
        at(spec.arrival, "arrive", spec)
    at(0.0, "scrape", None)
    views: list[NodeView] = []
    scraped = 0.0
    last_arrival = max((s.arrival for s in specs), default=0.0)

    def start_task(gpu: SimGpu, spec: ContainerSpec, number: int, now: float) -> None:
        task = _Task(spec, number, now)
        task.job, _ = gpu.sim.add_job(now, JobKind.KERNEL, spec.work_s, spec.id)
        gpu.tasks[task.job.id] = task

    def finish(gpu: SimGpu, job: Job) -> None:
        task = gpu.tasks.pop(job.id)
        assert job.finished is not None
        spec = task.container
        view = gpu._view(task, job.finished, ended=job.finished)
        gpu.finished.append(view)
        outcome.hits += bool(view.met_deadline)
        if task.number + 1 < spec.tasks:
            at(job.finished + spec.gap_s, "task", (gpu, spec, task.number + 1))
        else:
            gpu.used -= spec.memory_bytes

    while events or any(g.sim.running() for g in gpus.values()):
        t_event = events[0][0] if events else math.inf
        t_job, gpu = min(
            ((g.sim.next_completion_time() or math.inf, g) for g in gpus.values()),
            key=lambda item: item[0],
        )
        if t_job <= t_event:
            for job in gpu.sim.advance(t_job):
                finish(gpu, job)
            continue
        now, _, kind, item = heapq.heappop(events)
        if kind == "scrape":
            records: dict[str, list[GpuRecord]] = {}
            for g in gpus.values():
                for job in g.sim.advance(now):
                    finish(g, job)
                records.setdefault(g.node, []).append(g.record(now))
            views = [NodeView(NodeRecord(node, now, tuple(rs))) for node, rs in records.items()]
            scraped = now
            if now < last_arrival or any(g.tasks for g in gpus.values()):
                at(now + SCRAPE_S, "scrape", None)
        elif kind == "arrive":
            spec = item  # type: ignore[assignment]
            aged = [NodeView(v.record, now - scraped) for v in views]
            request = Request(spec.deadline_s, spec.memory_bytes, runtime_s=spec.work_s)
            choice = choose(aged, request, now)
            if choice is None:
                outcome.rejected += 1
                continue
            at(now + START_S, "start", (gpus[choice], spec))
        elif kind == "start":
            gpu, spec = item  # type: ignore[misc]
            if gpu.used + spec.memory_bytes > gpu.total:
                continue  # out of memory: every task of the container is lost
            gpu.used += spec.memory_bytes
            start_task(gpu, spec, 0, now)
        else:
            gpu, spec, number = item  # type: ignore[misc]
            start_task(gpu, spec, number, now)
    return outcome


WORKLOADS = {"fig3": fig3_arrivals, "fig4": fig4_arrivals}


# --- 3. the extender's calls at a slow Prometheus -----------------------------------------

SLOW_PROMETHEUS_S = (0.9, 1.2, 1.9)
EXTENDER_NODES = [f"gpu-node-{i}" for i in range(10)]


def extender_pod_ms(delay_s: float, pods: int, cache_s: float = 1.0) -> tuple[float, float]:
    """Median ms for one pod's filter and prioritize (over HTTP, as kube-scheduler sends
    them) at a Prometheus answering after ``delay_s``, and Prometheus queries per pod."""
    pod = {"metadata": {"name": "p", "namespace": "n", "labels": {"gpuguard.deadline": "9s"}}}
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": EXTENDER_NODES}).encode()
    headers = {"Content-Type": "application/json"}
    times = []
    with SlowPrometheus(EXTENDER_NODES, delay_s=delay_s) as prometheus:
        source = PrometheusSource(prometheus.url, timeout_s=2.0, cache_s=cache_s)
        server = placer_server(("127.0.0.1", 0), Placer(source), None, with_extender=True)
        server.serve_in_thread()
        host, port = server.server_address[:2]
        prefix = f"http://{host}:{port}{extender.PATH_PREFIX}/"
        try:
            with requests.Session() as session:
                for _ in range(pods):
                    started = time.perf_counter()
                    for verb in (extender.FILTER_VERB, extender.PRIORITIZE_VERB):
                        reply = session.post(prefix + verb, data=body, headers=headers, timeout=10)
                        assert reply.status_code == 200, reply.text
                    times.append((time.perf_counter() - started) * 1000)
                    time.sleep(cache_s + 0.05)  # the next pod finds the cache expired
        finally:
            server.shutdown()
            server.server_close()
            source.close()
        queries = prometheus.queries
    return statistics.median(times), queries / pods


def compare(seeds: int, durations: dict[str, float]) -> dict[str, dict[str, Outcome]]:
    """workload -> policy -> outcome summed over seeds (same arrivals for every policy)."""
    results: dict[str, dict[str, Outcome]] = {}
    for workload, arrivals in WORKLOADS.items():
        results[workload] = {p: Outcome() for p in POLICIES}
        for seed in range(seeds):
            specs = arrivals(random.Random(1000 + seed), durations[workload])
            for policy in POLICIES:
                got = simulate(specs, make_chooser(policy, seed))
                total = results[workload][policy]
                total.hits += got.hits
                total.tasks += got.tasks
                total.rejected += got.rejected
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, shorter runs")
    args = parser.parse_args()
    repeats = 15 if args.quick else 50
    seeds = 2 if args.quick else 5
    durations = {"fig3": 240.0, "fig4": 60.0} if args.quick else {"fig3": 600.0, "fig4": 150.0}

    figures: dict[str, float] = {}
    print("Fig. 11: parse the Prometheus reply, build the node list, rank, choose")
    for n in (10, 100, 1000):
        total, rank_only = rank_ms(n, repeats)
        figures[f"rank_ms_{n}"] = round(total, 2)
        figures[f"rank_only_ms_{n}"] = round(rank_only, 2)
        print(
            f"  {n:>5} nodes: {total:8.2f} ms, of which ranking {rank_only:6.2f} ms"
            f" (median of {repeats})"
        )

    results = compare(seeds, durations)
    print(f"\ndeadline hit rate on {sum(len(s) for _, s in CLUSTER)} simulated GPUs, {seeds} seeds")
    print(f"{'policy':<22}" + "".join(f"{w:>18}" for w in WORKLOADS) + f"{'mean':>10}")
    for policy in POLICIES:
        rates = [results[w][policy].hits / results[w][policy].tasks for w in WORKLOADS]
        cells = []
        for workload, rate in zip(WORKLOADS, rates, strict=True):
            figures[f"{workload}_hit_rate_{policy}"] = round(rate, 4)
            cells.append(f"{rate:>8.1%} ({results[workload][policy].rejected:>3} rej)")
        # each workload weighs the same (Fig. 4's light tasks outnumber Fig. 3's by far)
        figures[f"hit_rate_{policy}"] = round(statistics.fmean(rates), 4)
        figures[f"rejected_{policy}"] = sum(results[w][policy].rejected for w in WORKLOADS)
        print(
            f"{policy:<22}"
            + "".join(f"{c:>18}" for c in cells)
            + f"{statistics.fmean(rates):>10.1%}"
        )

    pods = 2 if args.quick else 5
    print("\nkube-scheduler's filter + prioritize of a pod at a slow Prometheus (cache 1s)")
    for delay in SLOW_PROMETHEUS_S:
        pod_ms, per_pod = extender_pod_ms(delay, pods)
        key = f"{delay * 1000:.0f}"
        figures[f"extender_pod_ms_{key}"] = round(pod_ms, 1)
        figures[f"extender_queries_per_pod_{key}"] = round(per_pod, 2)
        print(
            f"  Prometheus answering after {delay:.1f} s: {pod_ms:7.1f} ms a pod, "
            f"{per_pod:.2f} queries a pod (median of {pods})"
        )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
