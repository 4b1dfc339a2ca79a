"""Real-time beside best-effort on production inference traces: alone, shared and managed,
the exporter seeing through NVML only and through the launch probe.

Public production LLM-inference traces (the Azure LLM inference traces 2023, a
code-completion and a conversation service: ``bench/traces/README.md``) are replayed by
gpusim's ``server`` workload (``--trace``) through the real stack: a private dockerd, gpusim,
the exporter, the actuator with its defaults (``--actuator-arg`` adds flags) and its guard.
Each window of a trace is one run of every arm, on the same machine in one invocation:

  alone     each real-time container by itself on a GPU of its own, and the trainer by
            itself: its latency alone, its GPU share alone, the trainer's steps/s alone
  shared    the window's containers on one GPU, none managed: they time-slice it
  nvml      the same containers, all ``gpuguard.managed=true``, the trainer
            ``gpuguard.class=best-effort``; the exporter with ``--probe.launch=off``
  probe     the same, the exporter with ``--probe.launch=auto`` (the launch probe's
            uprobes: root and BTF). Where the probe cannot attach, one line says so and
            the last line says ``probe_attached: false``: this arm then saw through NVML

The exporter and the actuator are restarted between the two managed arms (the guard stays),
whose order alternates so that each batch restarts them once.

Scenarios (``replay/trace.py`` turns tokens into kernel time: prefill ~ context tokens,
decode ~ generated tokens, scaled to the share given; ``--plan`` prints every window):

  (a) sparse    one server at 40% of the GPU with a random draw of its window's requests
                (1.5 a second: heavy-tailed, 10 ms to 1-2 s each) beside a trainer; the
                trace (code and conversation in turn) replayed 6x faster than it happened
  (b) dense     the same, with every request of the conversation service as it came (about
                5 a second, 5-250 ms each, most far shorter than NVML's 1/6 s sample)
  (c) pair      two servers, 26% and 14% of the GPU, the first replaying the window's trace
                and the second the other trace over the same minutes; deadlines 1.5x and 3x
                their own p99 alone
  (d) oneshot   a server with 2 s request deadlines (25% of the GPU, the conversation trace)
                and a real-time one-shot (kernels for 40% of the window in 0.1 s pieces,
                deadline 2x that) released a quarter into the window

A server's request deadline is a factor (2x for (a) and (b)) of its own p99 alone, computed
from its schedule before the run (it answers in arrival order). Per scenario and arm the
median and the worst window of ``rt_p99_over_alone``, ``rt_hit_rate`` and ``be_over_ideal``
are printed, where the ideal is the trainer's alone rate x (1 - the servers' GPU share alone,
measured from their own kernel spans). A miss ``from a freeze`` is a missed request during which the
actuator held its server frozen (its audit log). gpusim runs kernels at ``--time-scale``;
every wall length above is kept whatever the scale. ``--quick`` runs three windows of 16 s at
once, each on GPUs of its own, the alone containers beside the shared run (about 5 minutes on
a busy 2-core machine); the default runs ten windows of 40 s, two at a time, each arm in a
run of its own (about an hour). The points for a picture (real-time p99 over alone against
best-effort steps/s: shared, NVML-only, probe, ideal) are written as JSON to ``--points``.
The last line printed is one JSON object: the probe arm's figures under their keys, the
NVML-only arm's under the same keys with ``_nvml`` after them, and ``probe_attached``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from realtime import action_counts, hit_rate, run_audited, split_order
from replay.judge import (
    Spread,
    busy_share,
    covered,
    frozen_spans,
    misses_from_freeze,
    ratio,
    spread,
)
from replay.trace import (
    Job,
    Request,
    TraceError,
    Window,
    deadline_ms,
    draw,
    fifo_latencies,
    find_trace_dir,
    load_traces,
    plan_windows,
    requests_in,
    schedule,
    synthetic_traces,
    trace_dirs,
)

from gpuguard.contract import PriorityClass, WorkloadKind
from gpuguard.demo.stack.localstack import NodeStack
from gpuguard.demo.stack.process import ServiceError, exit_on_sigterm
from gpuguard.demo.stack.scenario import ScenarioResult, WorkloadSpec
from gpuguard.gpusim.workload.arrivals import Arrival, trace_lines
from gpuguard.gpusim.workload.server import percentile

REPO = Path(__file__).resolve().parents[1]
#: trace seconds per wall second: a draw of a trace's requests, and every request of one
#: (as they came: each request is a few calls to gpusim, each a round trip that costs CPU)
COMPRESS, DENSE_COMPRESS = 6.0, 1.0
#: context tokens' worth of GPU time one generated token costs (replay/trace.py)
DECODE_COST = 10.0
#: a training step (wall seconds of kernels; four kernels, synced every step)
STEP_S = 0.04
#: kernels per request (the work split evenly), bytes copied each way: token ids in and out,
#: a few KiB (nothing the copy engine would notice), each copy waited for before the first
#: launch and after the last, as a server's ``tensor.to("cuda")`` and ``.cpu()`` are
REQUEST_KERNELS, IO_BYTES = 2, 4096
#: containers started at a time, and what each such start adds to the lead-in (s)
STARTING, START_S = 4, 1.2
#: a container whose first log line comes this long after its release began late (s)
LATE_S = 0.1
#: a deadline is at least this (s)
DEADLINE_FLOOR_S = 0.05
#: the one-shot: its kernel time and release as shares of the window, its kernels' length,
#: its deadline as a multiple of its kernel time
ONESHOT_WORK, ONESHOT_AT, ONESHOT_KERNEL_S, ONESHOT_DEADLINE = 0.4, 0.25, 0.1, 2.0
#: every arm; the managed ones run the same containers, all ``gpuguard.managed=true``, with
#: the exporter seeing them through NVML's samples only, or through the launch probe too
ARMS = ("alone", "shared", "nvml", "probe")
MANAGED = ("nvml", "probe")
#: the exporter's flag for each managed arm
PROBE_FLAG = {"nvml": "--probe.launch=off", "probe": "--probe.launch=auto"}


@dataclass(frozen=True)
class ServerRole:
    """A real-time server of a scenario: its traffic and its deadline."""

    role: str
    share: float  # of the GPU over its window
    rate: float | None  # requests per wall second drawn from the window; None: all of them
    deadline_factor: float | None  # x its p99 alone; None: ``deadline_s``
    deadline_s: float = 0.0
    other_trace: bool = False  # replays the trace the window is not cut from


@dataclass(frozen=True)
class Kind:
    """A scenario: its servers, and whether a trainer or a one-shot shares their GPU."""

    name: str
    letter: str
    servers: tuple[ServerRole, ...]
    trainer: bool = False
    oneshot: bool = False
    compress: float = COMPRESS  # trace seconds per wall second
    #: the traces its windows are cut from, in turn (the steady conversation service alone
    #: where every request is replayed as it came: the code service idles for minutes)
    traces: tuple[str, ...] = ("conv", "code")


KINDS: tuple[Kind, ...] = (
    Kind("sparse", "a", (ServerRole("server", 0.4, 1.5, 2.0),), trainer=True),
    Kind("dense", "b", (ServerRole("server", 0.4, None, 2.0),), trainer=True,
         compress=DENSE_COMPRESS, traces=("conv",)),
    Kind("pair", "c", (ServerRole("tight", 0.26, 1.0, 1.5),
                       ServerRole("loose", 0.14, 0.6, 3.0, other_trace=True))),
    Kind("oneshot", "d", (ServerRole("server", 0.25, 1.0, None, 2.0),), oneshot=True,
         traces=("conv",)),
)  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    windows: int
    wall_s: float  # a window's wall length
    parallel: int  # windows run at once, each on GPUs of its own
    alone_beside: bool  # the alone containers run beside the shared run, on GPUs of their own
    lead_in: float = 2.5  # s before the release, and more by the containers (``lead_in``)


SIZES = {"quick": Sizes(3, 16.0, 3, True), "full": Sizes(10, 40.0, 2, False)}


# --- what each window runs ----------------------------------------------------------------


@dataclass(frozen=True)
class ServerPlan:
    role: str
    trace: str
    jobs: tuple[Job, ...]
    deadline_ms: int


@dataclass(frozen=True)
class WindowPlan:
    """A window's containers, before any run: servers' schedules, a one-shot's length."""

    kind: Kind
    window: Window
    servers: tuple[ServerPlan, ...]
    oneshot_s: float = 0.0  # the one-shot's kernel wall seconds


def plan(
    kind: Kind,
    window: Window,
    traces: dict[str, list[Request]],
    wall_s: float,
) -> WindowPlan:
    """The servers' schedules for one window of a scenario (pure)."""
    servers = []
    names = list(traces)
    for i, role in enumerate(kind.servers):
        name = window.trace
        if role.other_trace:
            name = names[(names.index(window.trace) + 1) % len(names)]
        cut = Window(window.index, name, window.start, window.length, window.seed + 1000 * i)
        chosen = requests_in(traces[name], cut)
        count = None if role.rate is None else max(1, round(role.rate * wall_s))
        jobs = schedule(draw(chosen, count, cut.seed), cut, kind.compress, role.share, DECODE_COST)
        if not jobs:  # a server with nothing to answer would fail its run, not this plan
            raise TraceError(
                f"{kind.name} {window.label()}: no request in {name} from {cut.start:g} s for "
                f"{cut.length:g} s (try fewer or longer windows)"
            )
        if role.deadline_factor is None:
            deadline = round(1000 * role.deadline_s)
        else:
            deadline = deadline_ms(jobs, role.deadline_factor, DEADLINE_FLOOR_S)
        servers.append(ServerPlan(role.role, name, tuple(jobs), deadline))
    oneshot = ONESHOT_WORK * wall_s if kind.oneshot else 0.0
    return WindowPlan(kind, window, tuple(servers), oneshot)


class Devices:
    """Hands out the simulated GPUs of one run, one after another."""

    def __init__(self) -> None:
        self.next = 0

    def take(self) -> str:
        self.next += 1
        return str(self.next - 1)


def devices_needed(sizes: Sizes) -> int:
    """GPUs for the busiest run: each window's shared (or managed) GPU, and beside it its
    alone containers (two servers or a server and a one-shot), and one alone trainer."""
    per_window = 1 + (2 if sizes.alone_beside else 0)
    alone_only = 2 * sizes.parallel + 1
    return max(sizes.parallel * per_window + 1, alone_only)


@dataclass
class Cast:
    """The containers of one run, and which window and arm each belongs to."""

    specs: list[WorkloadSpec] = field(default_factory=list)
    #: container name -> (window index or None for the trainer alone, arm, role)
    who: dict[str, tuple[int | None, str, str]] = field(default_factory=dict)

    def add(self, spec: WorkloadSpec, window: int | None, arm: str, role: str) -> None:
        self.specs.append(spec)
        self.who[spec.name] = (window, arm, role)


@dataclass(frozen=True)
class Replay:
    """How containers are made: the node's paths and the time scale."""

    schedule_dir: Path  # where the servers' schedules are written (under the node's logs)
    time_scale: float
    wall_s: float

    def work(self, wall_s: float) -> float:
        """Device-seconds of kernel work that last ``wall_s`` at this time scale."""
        return round(wall_s / self.time_scale, 6)

    def server(self, name: str, plan: ServerPlan, device: str, managed: bool) -> WorkloadSpec:
        path = self.schedule_dir / f"{name}.trace.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        arrivals = [Arrival(j.offset, self.work(j.work), IO_BYTES) for j in plan.jobs]
        path.write_text("\n".join(trace_lines(arrivals)) + "\n")
        flags = ("--trace", str(path), "--kernels", str(REQUEST_KERNELS), "--io-bytes",
                 str(IO_BYTES), "--memory-bytes", "1GiB", "--device", device)  # fmt: skip
        return WorkloadSpec(
            name, kind=WorkloadKind.SERVER, kind_args=flags,
            deadline=f"{plan.deadline_ms}ms", managed=managed,
        )  # fmt: skip

    def trainer(self, name: str, device: str, managed: bool) -> WorkloadSpec:
        flags = ("--step-work", str(self.work(STEP_S)), "--kernels", "4", "--sync-every",
                 "1", "--duration", str(self.wall_s), "--memory-bytes", "2GiB", "--device",
                 device)  # fmt: skip
        return WorkloadSpec(
            name, kind=WorkloadKind.TRAIN, kind_args=flags, managed=managed,
            priority=PriorityClass.BEST_EFFORT,
        )  # fmt: skip

    def oneshot(self, name: str, work_s: float, device: str, managed: bool) -> WorkloadSpec:
        kernels = max(1, round(work_s / ONESHOT_KERNEL_S))
        deadline = round(1000 * ONESHOT_DEADLINE * work_s)
        return WorkloadSpec(
            name, work_seconds=self.work(work_s), memory_bytes=256 * 2**20,
            deadline=f"{deadline}ms", managed=managed, delay_s=ONESHOT_AT * self.wall_s,
            kind_args=("--kernels", str(kernels), "--device", device),
        )  # fmt: skip


def cast_window(
    replay: Replay, plan: WindowPlan, arm: str, prefix: str, devices: Devices, cast: Cast
) -> None:
    """One window's containers in one arm: alone each on a GPU of its own, else together."""
    index = plan.window.index
    shared_gpu = None if arm == "alone" else devices.take()
    managed = arm in MANAGED
    for server in plan.servers:
        name = f"{prefix}-{arm}-{plan.window.label()}-{server.role}"
        device = shared_gpu if shared_gpu is not None else devices.take()
        cast.add(replay.server(name, server, device, managed), index, arm, server.role)
    if plan.oneshot_s:
        name = f"{prefix}-{arm}-{plan.window.label()}-oneshot"
        device = shared_gpu if shared_gpu is not None else devices.take()
        cast.add(replay.oneshot(name, plan.oneshot_s, device, managed), index, arm, "oneshot")
    if plan.kind.trainer and shared_gpu is not None:
        name = f"{prefix}-{arm}-{plan.window.label()}-trainer"
        cast.add(replay.trainer(name, shared_gpu, managed), index, arm, "trainer")


def run_casts(plans: Sequence[WindowPlan], replay_for: Callable[[str], Replay],
              alone_beside: bool, managed: Sequence[str] = MANAGED,
              ) -> Iterator[tuple[str, str, Cast]]:  # fmt: skip
    """The runs of one batch of windows, each with its label, the arm that names it (the
    managed arms in the order given) and its containers."""
    kind = plans[0].kind
    batch = f"{kind.name}-b{plans[0].window.index}"
    groups = [["shared", "alone"]] if alone_beside else [["alone"], ["shared"]]
    groups += [[arm] for arm in managed]
    for arms in groups:
        label = f"{batch}-{arms[0]}"
        replay, devices, cast = replay_for(label), Devices(), Cast()
        for arm in arms:
            for p in plans:
                cast_window(replay, p, arm, kind.letter, devices, cast)
            if arm == "alone" and kind.trainer:
                name = f"{kind.letter}-alone-{plans[0].window.label()}-trainer"
                cast.add(replay.trainer(name, devices.take(), False), None, "alone", "trainer")
        yield label, arms[0], cast


# --- running ------------------------------------------------------------------------------


@dataclass
class RunRecord:
    """One run: what it ran, what the workloads logged, the actuator's audit in its span,
    and the containers that were not ready when their release came (seconds late)."""

    label: str
    cast: Cast
    result: ScenarioResult
    audit: list[dict[str, Any]]
    late: dict[str, float] = field(default_factory=dict)


def lead_in(sizes: Sizes, containers: int) -> float:
    """Seconds from the first container's start to the release: every container started
    (``STARTING`` at a time) and its start-up task (context, model in) seen to end."""
    return sizes.lead_in + START_S * math.ceil(containers / STARTING)


def late_starts(log_dir: Path, specs: Sequence[WorkloadSpec], released: float) -> dict[str, float]:
    """Containers whose first log line (ready, or a one-shot's first task) came more than
    ``LATE_S`` after their release: they began behind their schedule."""
    late = {}
    for spec in specs:
        path = log_dir / f"{spec.name}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        first = json.loads(lines[0]) if lines and lines[0].strip().endswith("}") else None
        if first is not None:
            behind = float(first["t"]) - (released + spec.delay_s)
            if behind > LATE_S:
                late[spec.name] = round(behind, 2)
    return late


def run(node: NodeStack, label: str, cast: Cast, sizes: Sizes) -> RunRecord:
    lead = lead_in(sizes, len(cast.specs))
    timeout = 2 * sizes.wall_s + lead + 90
    result, audit = run_audited(node, label, cast.specs, lead, timeout, concurrently=STARTING)
    late = late_starts(node.base_dir / "logs" / label, cast.specs, result.released_at)
    return RunRecord(label, cast, result, audit, late)


# --- judging ------------------------------------------------------------------------------


@dataclass
class Seen:
    """What one container did in one run, found by its window, arm and role."""

    name: str
    record: RunRecord

    @property
    def requests(self) -> list[Any]:
        return [r for r in self.record.result.requests if r.container == self.name]

    @property
    def start(self) -> float:
        """When it began its window: the release, or later where it was late to start."""
        return self.record.result.released_at + self.record.late.get(self.name, 0.0)

    def steps_per_s(self, wall_s: float) -> float:
        """Steps the device ended for this trainer per second of the window."""
        start = self.start
        steps = self.record.result.steps
        done = sum(s.container == self.name and start <= s.end <= start + wall_s for s in steps)
        return done / wall_s

    def frozen(self, until: float) -> list[tuple[float, float]]:
        return frozen_spans(self.record.audit, self.name, until)


def index(records: Sequence[RunRecord]) -> dict[tuple[int | None, str, str], Seen]:
    """(window, arm, role) -> what that container did."""
    out = {}
    for record in records:
        for name, key in record.cast.who.items():
            out[key] = Seen(name, record)
    return out


def p99_s(requests: Sequence[Any]) -> float | None:
    return percentile([r.latency_s for r in requests], 0.99)


def judge_server(seen: dict[Any, Seen], window: int, role: str) -> dict[str, Any]:
    """A server's p99 and hit rate in each arm, and its p99 over alone."""
    out: dict[str, Any] = {}
    for arm in ARMS:
        requests = seen[window, arm, role].requests
        out[f"p99_{arm}_ms"] = None if not requests else round(1000 * (p99_s(requests) or 0), 1)
        out[f"hit_rate_{arm}"] = hit_rate(requests)
        out[f"requests_{arm}"] = len(requests)
    for arm in ("shared", *MANAGED):
        out[f"p99_over_alone_{arm}"] = ratio(out[f"p99_{arm}_ms"], out["p99_alone_ms"])
    return out


def judge_window(plan: WindowPlan, seen: dict[Any, Seen], wall_s: float) -> dict[str, Any]:
    """Every figure of one window (pure, from the runs' records)."""
    w = plan.window.index
    figures: dict[str, Any] = {
        "window": w, "trace": plan.window.trace, "trace_start_s": plan.window.start,
        "deadlines_ms": {s.role: s.deadline_ms for s in plan.servers},
        "requests": {s.role: len(s.jobs) for s in plan.servers},
    }  # fmt: skip
    for server in plan.servers:
        figures[server.role] = judge_server(seen, w, server.role)
    for arm in ("shared", *MANAGED):  # with two servers: the worse one
        ratios = [figures[s.role][f"p99_over_alone_{arm}"] for s in plan.servers]
        rates = [figures[s.role][f"hit_rate_{arm}"] for s in plan.servers]
        figures[f"rt_p99_over_alone_{arm}"] = max(
            (r for r in ratios if r is not None), default=None
        )
        figures[f"rt_hit_rate_{arm}"] = min((r for r in rates if r is not None), default=None)
    if len(plan.servers) > 1:
        for arm in MANAGED:
            gains = [gain(figures[s.role], arm) for s in plan.servers]
            figures[f"hit_rate_{arm}_minus_shared"] = min(
                (g for g in gains if g is not None), default=None
            )
            figures[f"{plan.servers[0].role}_hit_rate_{arm}_minus_shared"] = gains[0]
    if plan.kind.trainer:
        figures.update(judge_trainer(plan, seen, wall_s))
    if plan.oneshot_s:
        figures.update(judge_oneshot(plan, seen))
    return figures


def gain(server: dict[str, Any], arm: str) -> float | None:
    """A server's hit rate in a managed arm less its hit rate shared."""
    managed, shared = server[f"hit_rate_{arm}"], server["hit_rate_shared"]
    return None if managed is None or shared is None else round(managed - shared, 3)


def judge_trainer(plan: WindowPlan, seen: dict[Any, Seen], wall_s: float) -> dict[str, Any]:
    w = plan.window.index
    alone_runs = [seen[w, "alone", s.role] for s in plan.servers]
    share = sum(busy_share(a.requests, a.start, a.start + wall_s) for a in alone_runs)
    alone = seen.get((None, "alone", "trainer"))
    alone_steps = alone.steps_per_s(wall_s) if alone is not None else None
    ideal = None if alone_steps is None else alone_steps * max(0.0, 1 - share)
    out: dict[str, Any] = {"rt_share_alone": round(share, 3), "be_steps_alone": alone_steps,
                           "be_ideal": None if ideal is None else round(ideal, 2)}  # fmt: skip
    for arm in ("shared", *MANAGED):
        trainer = seen[w, arm, "trainer"]
        steps = trainer.steps_per_s(wall_s)
        out[f"be_steps_{arm}"] = round(steps, 2)
        out[f"be_over_ideal_{arm}"] = ratio(steps, ideal)
    for arm in MANAGED:
        managed = seen[w, arm, "trainer"]
        start = managed.start
        frozen = covered(managed.frozen(start + wall_s), start, start + wall_s)
        out[f"be_frozen_share_{arm}"] = round(frozen / wall_s, 3)
    if alone_steps is not None:
        out["be_steps_alone"] = round(alone_steps, 2)
    return out


def judge_oneshot(plan: WindowPlan, seen: dict[Any, Seen]) -> dict[str, Any]:
    w = plan.window.index
    server = plan.servers[0].role
    out: dict[str, Any] = {}
    for arm in ARMS:
        tasks = [t for t in seen[w, arm, "oneshot"].record.result.tasks
                 if t.container == seen[w, arm, "oneshot"].name]  # fmt: skip
        out[f"oneshot_s_{arm}"] = round(tasks[0].run_s, 2) if tasks else None
        out[f"oneshot_met_{arm}"] = tasks[0].met_deadline if tasks else None
        requests = seen[w, arm, server].requests
        out[f"server_misses_{arm}"] = sum(r.met_deadline is False for r in requests)
    for arm in MANAGED:
        managed = seen[w, arm, server]
        until = max((r.end for r in managed.requests), default=managed.start)
        frozen = managed.frozen(until)
        out[f"server_frozen_s_{arm}"] = round(sum(e - s for s, e in frozen), 2)
        out[f"server_longest_freeze_s_{arm}"] = round(
            max((e - s for s, e in frozen), default=0.0), 2
        )
        out[f"server_misses_from_freeze_{arm}"] = misses_from_freeze(
            managed.requests, frozen, seen[w, "shared", server].requests
        )
        out[f"server_misses_while_frozen_{arm}"] = misses_from_freeze(managed.requests, frozen)
    return out


# --- reporting ----------------------------------------------------------------------------


def fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


#: the arms' names in the printed tables
ARM_NAMES = {"alone": "alone", "shared": "shared", "nvml": "NVML-only", "probe": "probe"}


def _spreads() -> dict[str, tuple[str, bool]]:
    out: dict[str, tuple[str, bool]] = {}
    for figure, higher in (("rt_p99_over_alone", True), ("rt_hit_rate", False),
                           ("be_over_ideal", False)):  # fmt: skip
        for arm in ("shared", *MANAGED):
            out[f"{figure}_{arm}"] = (f"{figure} {ARM_NAMES[arm]}", higher)
    for arm in MANAGED:
        name = ARM_NAMES[arm]
        out[f"hit_rate_{arm}_minus_shared"] = (f"hit rate {name} - shared (worse server)", False)
        out[f"tight_hit_rate_{arm}_minus_shared"] = (f"hit rate {name} - shared (tight)", False)
        out[f"server_misses_from_freeze_{arm}"] = (f"server misses from a freeze {name}", True)
    return out


#: figure -> (its name in the summary, whether higher is worse)
SPREADS: dict[str, tuple[str, bool]] = _spreads()


def spreads(windows: Sequence[dict[str, Any]]) -> dict[str, Spread]:
    return {
        key: spread((w.get(key) for w in windows), higher)
        for key, (_, higher) in SPREADS.items()
        if any(key in w for w in windows)
    }


def _arms(values: Sequence[Any], spec: str = "") -> str:
    return " / ".join(fmt(v, spec) for v in values)


def window_table(kind: Kind, windows: Sequence[dict[str, Any]]) -> str:
    heading = "/".join(ARM_NAMES[a] for a in ARMS)
    lines = []
    for w in windows:
        head = (f"  w{w['window']} {w['trace']} @{w['trace_start_s']:.0f}s "
                f"requests {w['requests']} deadlines {w['deadlines_ms']} ms")  # fmt: skip
        lines.append(head)
        for role in w["requests"]:
            s = w[role]
            lines.append(
                f"    {role:<7} p99 ms {heading} "
                f"{_arms([s[f'p99_{a}_ms'] for a in ARMS])}  hit "
                f"{_arms([s[f'hit_rate_{a}'] for a in ARMS], '.0%')}"
            )
        if kind.trainer:
            lines.append(
                f"    trainer steps/s {heading} {fmt(w['be_steps_alone'])} / "
                f"{_arms([w[f'be_steps_{a}'] for a in ('shared', *MANAGED)])} (ideal "
                f"{fmt(w['be_ideal'])} at the server's {w['rt_share_alone']:.0%} alone; frozen "
                f"{_arms([w[f'be_frozen_share_{a}'] for a in MANAGED], '.0%')} of the "
                f"{'/'.join(ARM_NAMES[a] for a in MANAGED)} runs)"
            )
        if kind.oneshot:
            lines.append(
                f"    one-shot s {heading} {_arms([w[f'oneshot_s_{a}'] for a in ARMS])}; "
                f"server misses {_arms([w[f'server_misses_{a}'] for a in ARMS])}, from a "
                f"freeze {_arms([w[f'server_misses_from_freeze_{a}'] for a in MANAGED])} "
                f"(met shared; missed while frozen "
                f"{_arms([w.get(f'server_misses_while_frozen_{a}') for a in MANAGED])}; "
                f"frozen {_arms([w[f'server_frozen_s_{a}'] for a in MANAGED])} s, longest "
                f"{_arms([w[f'server_longest_freeze_s_{a}'] for a in MANAGED])} s)"
            )
    return "\n".join(lines)


def spread_table(found: dict[str, Spread]) -> str:
    lines = [f"  {'':<48} {'median':>8} {'worst':>8}"]
    for key, s in found.items():
        lines.append(f"  {SPREADS[key][0]:<48} {fmt(s.median):>8} {fmt(s.worst):>8}")
    return "\n".join(lines)


#: the last line's keys: (scenario, its figure over the windows) per key, for the probe's
#: arm; the NVML-only arm's are the same keys with ``_nvml`` after them
HEADLINE: dict[str, tuple[str, str]] = {
    "sparse_rt_p99_over_alone_worst": ("sparse", "rt_p99_over_alone"),
    "sparse_be_over_ideal_worst": ("sparse", "be_over_ideal"),
    "dense_rt_p99_over_alone_worst": ("dense", "rt_p99_over_alone"),
    "dense_be_over_ideal_worst": ("dense", "be_over_ideal"),
    "pair_hit_rate_managed_minus_shared_worst": ("pair", "hit_rate_{arm}_minus_shared"),
    "pair_tight_hit_rate_managed_minus_shared_worst": ("pair",
                                                       "tight_hit_rate_{arm}_minus_shared"),
}  # fmt: skip


def headline(
    per_kind: dict[str, dict[str, Spread]],
    per_window: dict[str, list[dict[str, Any]]],
    probe_attached: bool | None = None,
) -> dict[str, Any]:
    """The last line's figures (null where the scenario did not run): each key for the probe's
    arm and, suffixed ``_nvml``, for the NVML-only arm; misses from a freeze are summed over
    the windows. ``probe_attached`` is false unless the probe was attached in every probe
    run (pure)."""

    def worst(kind: str, key: str) -> Any:
        found = per_kind.get(kind, {}).get(key)
        return None if found is None else found.worst

    line: dict[str, Any] = {}
    oneshot = per_window.get("oneshot")
    for arm, suffix in (("probe", ""), ("nvml", "_nvml")):
        for key, (kind, figure) in HEADLINE.items():
            name = figure.format(arm=arm) if "{arm}" in figure else f"{figure}_{arm}"
            line[key + suffix] = worst(kind, name)
        line["oneshot_server_misses_from_freeze" + suffix] = (
            None if not oneshot else sum(w[f"server_misses_from_freeze_{arm}"] for w in oneshot)
        )
    line["probe_attached"] = probe_attached is True
    return line


POINT_ARMS = ("shared", *MANAGED)


def points(per_window: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """For each scenario with a trainer: (real-time p99 over alone, best-effort steps/s and
    over ideal) for shared, NVML-only, probe and ideal (p99 at alone, steps at the ideal),
    per window and median (pure)."""
    out: dict[str, Any] = {}
    for kind, windows in per_window.items():
        if not windows or "be_ideal" not in windows[0]:
            continue
        rows = []
        for w in windows:
            for arm in POINT_ARMS:
                rows.append({"window": w["window"], "arm": arm,
                             "rt_p99_over_alone": w[f"rt_p99_over_alone_{arm}"],
                             "be_steps_per_s": w[f"be_steps_{arm}"],
                             "be_over_ideal": w[f"be_over_ideal_{arm}"]})  # fmt: skip
            rows.append({"window": w["window"], "arm": "ideal", "rt_p99_over_alone": 1.0,
                         "be_steps_per_s": w["be_ideal"], "be_over_ideal": 1.0})  # fmt: skip
        medians = {}
        for arm in (*POINT_ARMS, "ideal"):
            mine = [r for r in rows if r["arm"] == arm]
            medians[arm] = {
                key: _median([r[key] for r in mine])
                for key in ("rt_p99_over_alone", "be_steps_per_s", "be_over_ideal")
            }
        out[kind] = {"windows": rows, "median": medians}
    return out


def _median(values: Sequence[float | None]) -> float | None:
    have = [v for v in values if v is not None]
    return round(statistics.median(have), 3) if have else None


# --- main ---------------------------------------------------------------------------------


def plan_kind(
    kind: Kind, traces: dict[str, list[Request]], sizes: Sizes, seed: int
) -> list[WindowPlan]:
    """Every window of a scenario, cut from its traces (raises TraceError)."""
    spans = {name: traces[name][-1].offset for name in kind.traces}
    length = sizes.wall_s * kind.compress
    return [
        plan(kind, w, traces, sizes.wall_s)
        for w in plan_windows(sizes.windows, spans, length, seed)
    ]


def only_windows(
    plans: dict[str, list[WindowPlan]], wanted: Sequence[int] | None, windows: int
) -> dict[str, list[WindowPlan]]:
    """The plans of the ``wanted`` windows only (all where None; raises TraceError for a
    window the plan does not have)."""
    if wanted is None:
        return plans
    missing = sorted({n for n in wanted if not 0 <= n < windows})
    if missing:
        raise TraceError(f"--window {missing[0]}: the plan has windows 0 to {windows - 1}")
    return {name: [p for p in ps if p.window.index in wanted] for name, ps in plans.items()}


def plan_text(plans: dict[str, list[WindowPlan]]) -> str:
    """Each window's servers: requests, kernel lengths, p99 alone (FIFO replay), deadline."""
    lines = []
    for kind, windows in plans.items():
        lines.append(f"({kind})")
        for p in windows:
            w = p.window
            lines.append(f"  {w.label()} {w.trace} trace {w.start:.0f}-{w.start + w.length:.0f} s")
            for s in p.servers:
                work = [j.work for j in s.jobs]
                lines.append(
                    f"    {s.role:<7} {s.trace:<5} {len(s.jobs):>5} requests, kernels "
                    f"{ms(min(work, default=None))}-{ms(max(work, default=None))} ms (median "
                    f"{ms(percentile(work, 0.5))}), p99 alone "
                    f"{ms(percentile(fifo_latencies(s.jobs), 0.99))} ms, deadline "
                    f"{s.deadline_ms} ms"
                )
            if p.oneshot_s:
                lines.append(f"    one-shot {p.oneshot_s:g} s of kernels")
    return "\n".join(lines)


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.0f}"


def kind_named(name: str) -> Kind:
    for kind in KINDS:
        if name in (kind.name, kind.letter):
            return kind
    known = ", ".join(f"{k.name} ({k.letter})" for k in KINDS)
    raise argparse.ArgumentTypeError(f"unknown scenario {name!r}: one of {known}")


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return int(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/traces.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="actuator flags: --actuator-arg=--policy.order=edf (repeatable; the = form, "
               "since the value starts with --)",
    )  # fmt: skip
    p.add_argument("--quick", action="store_true", help="three windows at once (about 5 minutes)")
    p.add_argument("--windows", type=count, default=None, help="windows per scenario")
    p.add_argument("--window", action="append", type=int, default=None, metavar="N",
                   help="run only window N of each scenario's plan (0-based, repeatable; for "
                        "a look at one window: the worst is then of these only)")  # fmt: skip
    p.add_argument("--window-s", type=positive, default=None, help="a window's wall seconds")
    p.add_argument("--parallel", type=count, default=None, help="windows run at once")
    p.add_argument("--time-scale", type=positive, default=0.1, help="gpusim kernel time scale")
    p.add_argument(
        "--poll-interval", default="100ms", help="exporter poll interval (the exporter's default)"
    )
    p.add_argument("--seed", type=int, default=24, help="windows' draws")
    p.add_argument("--only", action="append", type=kind_named, default=None, metavar="NAME",
                   help="run only this scenario (name or letter; repeatable)")  # fmt: skip
    p.add_argument("--actuator-arg", action="append", default=[], metavar="FLAG",
                   help="one more actuator flag (repeatable)")  # fmt: skip
    p.add_argument("--trace-dir", type=Path, default=None,
                   help="the trace subsets' directory (default: bench/traces, else "
                        "shared/traces)")  # fmt: skip
    p.add_argument("--synthetic", action="store_true",
                   help="a seeded synthetic stand-in instead of the production subsets (checks "
                        "the bench runs; its figures say nothing about production)")  # fmt: skip
    p.add_argument("--points", type=Path, default=None,
                   help="where the picture's points go (default: "
                        "bench/results/traces-points-MODE.json)")  # fmt: skip
    p.add_argument("--keep", type=Path, default=None, help="keep logs and audit in this dir")
    p.add_argument("--plan", action="store_true",
                   help="print each window's schedules and deadlines, run nothing")  # fmt: skip
    return p


def sizes_of(args: argparse.Namespace) -> Sizes:
    base = SIZES["quick" if args.quick else "full"]
    windows = args.windows or base.windows
    return Sizes(
        windows, args.window_s or base.wall_s, min(windows, args.parallel or base.parallel),
        base.alone_beside, base.lead_in,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    mode = "quick" if args.quick else "full"
    sizes = sizes_of(args)
    try:
        if args.synthetic:
            print("traces: SYNTHETIC stand-in (--synthetic): the figures below say nothing "
                  "about production traffic")  # fmt: skip
            traces = synthetic_traces(args.seed)
            source = "a synthetic stand-in"
        else:
            directory = find_trace_dir([args.trace_dir] if args.trace_dir else trace_dirs(REPO))
            traces = load_traces(directory)
            source = str(directory)
        kinds = [k for k in KINDS if args.only is None or k in args.only]
        plans = {k.name: plan_kind(k, traces, sizes, args.seed) for k in kinds}
        plans = only_windows(plans, args.window, sizes.windows)
    except TraceError as exc:
        p.exit(2, f"bench/traces.py: error: {exc}\n")
    if args.plan:
        print(plan_text(plans))
        return 0
    order, rest = split_order(args.actuator_arg, default="fifo")
    started = time.time()
    base = Path(tempfile.mkdtemp(prefix="ggt-")) if args.keep is None else args.keep.resolve()
    node = NodeStack(base, "bench", time_scale=args.time_scale, poll_interval=args.poll_interval,
                     order=order, extra_actuator_flags=rest,
                     extra_exporter_flags=[PROBE_FLAG["nvml"]])  # fmt: skip
    switch = ProbeSwitch(node)
    node.gpusim_options = {"device": [f"name=gpu{i}" for i in range(devices_needed(sizes))]}
    print(
        f"traces bench ({mode}): {sizes.windows} window(s) of {sizes.wall_s:g} s wall "
        f"(trace compressed x{COMPRESS:g}, every request x{DENSE_COMPRESS:g}), "
        f"{sizes.parallel} at once; gpusim time scale {args.time_scale:g}; exporter poll "
        f"{args.poll_interval}; actuator {shlex.join(args.actuator_arg) or 'defaults'}; "
        f"traces from {source}",
        flush=True,
    )
    per_window: dict[str, list[dict[str, Any]]] = {}
    notes: list[str] = []
    actions: dict[str, dict[str, dict[str, int]]] = {}
    failed = False
    try:
        try:
            node.start(progress=lambda line: print("  " + line, flush=True))
        except ServiceError as exc:
            said = str(exc).strip().splitlines()
            print(f"bench/traces.py: error: the stack did not start: {said[0]} {said[-1]}",
                  file=sys.stderr)  # fmt: skip
            return 2
        for kind in kinds:
            print(f"\n== ({kind.letter}) {kind.name}", flush=True)
            t0 = time.time()
            try:
                outcome = run_kind(switch, kind, plans[kind.name], sizes, args.time_scale)
            except Exception as exc:  # a scenario that fails leaves the others to run
                failed = True
                notes.append(f"{kind.name}: failed: {type(exc).__name__}: {exc}")
                print(notes[-1], flush=True)
                continue
            per_window[kind.name], actions[kind.name] = outcome.figures, outcome.actions
            if outcome.late:
                notes.append(f"{kind.name}: began behind their release (s): {outcome.late}")
                print(f"  NOTE {notes[-1]}")
            print(window_table(kind, per_window[kind.name]))
            print(spread_table(spreads(per_window[kind.name])))
            for arm in MANAGED:
                done = actions[kind.name].get(arm)
                print(f"  actuator {ARM_NAMES[arm]}: {done or 'nothing'}", flush=True)
            print(f"  took {time.time() - t0:.0f}s", flush=True)
    finally:
        node.stop()
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    if switch.reasons:
        notes.append(f"the launch probe was not attached: {'; '.join(switch.reasons)}")
    return finish(args, mode, sizes, per_window, actions, notes, time.time() - started, failed,
                  switch.attached)  # fmt: skip


@dataclass
class ProbeSwitch:
    """The node's exporter for each managed arm: restarted with its actuator (the guard
    stays) with the launch probe off or on; whether the probe attached whenever asked for."""

    node: NodeStack
    arm: str = "nvml"  # the managed arm the exporter runs for now
    attached: bool | None = None  # None until a probe arm ran; then True only if every did
    reasons: list[str] = field(default_factory=list)

    def use(self, arm: str) -> None:
        if arm not in MANAGED or arm == self.arm:
            return
        node = self.node
        node.stop_actuator()  # first: it resumes what it paused
        if node.exporter is not None:
            node.exporter.stop()
            node.exporter = None
        node.extra_exporter_flags = exporter_flags(node.extra_exporter_flags, arm)
        node.start_exporter()
        node.start_actuator()
        self.arm = arm
        if arm == "probe":
            up, reason = probe_up(scrape(node.exporter_url + "/metrics"))
            if not up and reason not in self.reasons:
                self.reasons.append(reason)
                print(f"  probe arm: the launch probe is NOT attached ({reason}): this arm "
                      "sees through NVML only (probe_attached: false)", flush=True)  # fmt: skip
            self.attached = up and self.attached is not False


def managed_order(current: str) -> tuple[str, ...]:
    """The managed arms, the one the exporter runs for now first: one restart a batch."""
    return tuple(sorted(MANAGED, key=lambda arm: arm != current))


def exporter_flags(flags: Sequence[str], arm: str) -> list[str]:
    """The exporter's flags with the launch probe as ``arm`` needs it (pure)."""
    return [f for f in flags if not f.startswith("--probe.launch")] + [PROBE_FLAG[arm]]


def probe_up(metrics: str) -> tuple[bool, str]:
    """Whether the exporter's launch probe is attached, and else why, from its ``/metrics``
    (``gpuguard_exporter_launch_probe_up{reason}``; pure)."""
    for line in metrics.splitlines():
        if line.startswith("gpuguard_exporter_launch_probe_up{"):
            labels, _, value = line.rpartition(" ")
            found = re.search(r'reason="([^"]*)"', labels)
            up = value.strip() in ("1", "1.0")
            return up, "" if up else (found.group(1) if found else "no reason given")
    return False, "the exporter reports no launch probe"


def scrape(url: str, tries: int = 20) -> str:
    """An exporter's ``/metrics`` once it reports the probe ('' where it never does)."""
    import requests

    text = ""
    for _ in range(tries):
        try:
            text = requests.get(url, timeout=5).text
        except requests.RequestException:
            text = ""
        if "gpuguard_exporter_launch_probe_up{" in text:
            break
        time.sleep(0.2)
    return text


@dataclass
class KindOutcome:
    """A scenario's windows' figures, the actuator's actions per managed arm, and the
    containers that began behind their release (the lead-in was too short for the load)."""

    figures: list[dict[str, Any]] = field(default_factory=list)
    actions: dict[str, dict[str, int]] = field(default_factory=dict)
    late: dict[str, float] = field(default_factory=dict)


def run_kind(
    switch: ProbeSwitch, kind: Kind, plans: Sequence[WindowPlan], sizes: Sizes,
    time_scale: float,
) -> KindOutcome:  # fmt: skip
    """Every run of one scenario, batch by batch; the managed arms begin with the one the
    exporter already runs for, so that it restarts once a batch."""
    node = switch.node
    out = KindOutcome()
    for first in range(0, len(plans), sizes.parallel):
        batch = plans[first : first + sizes.parallel]
        records = []

        def replay_for(label: str) -> Replay:
            return Replay(node.base_dir / "logs" / label, time_scale, sizes.wall_s)

        order = managed_order(switch.arm)
        for label, arm, cast in run_casts(batch, replay_for, sizes.alone_beside, order):
            switch.use(arm)
            print(f"  {label}: {len(cast.specs)} containers", flush=True)
            records.append(run(node, label, cast, sizes))
            for key, n in action_counts(records[-1].audit).items():
                if arm in MANAGED:
                    mine = out.actions.setdefault(arm, {})
                    mine[key] = mine.get(key, 0) + n
            out.late.update(records[-1].late)
        seen = index(records)
        out.figures += [judge_window(p, seen, sizes.wall_s) for p in batch]
    return out


def finish(
    args: argparse.Namespace, mode: str, sizes: Sizes, per_window: dict[str, list[dict[str, Any]]],
    actions: dict[str, dict[str, dict[str, int]]], notes: list[str], wall: float, failed: bool,
    probe_attached: bool | None,
) -> int:  # fmt: skip
    per_kind = {kind: spreads(windows) for kind, windows in per_window.items()}
    line = headline(per_kind, per_window, probe_attached)
    picture = {
        "mode": mode, "actuator_args": args.actuator_arg, "compress": COMPRESS,
        "dense_compress": DENSE_COMPRESS, "probe_attached": probe_attached is True,
        "traces": "synthetic" if args.synthetic else "azure-llm-2023",
        "time_scale": args.time_scale, "window_s": sizes.wall_s, "points": points(per_window),
    }  # fmt: skip
    where = args.points or REPO / "bench" / "results" / f"traces-points-{mode}.json"
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(json.dumps(picture, indent=1) + "\n")
    print(f"\npoints for the picture: {where}")
    print(f"took {wall:.0f}s")
    line.update(
        mode=mode, traces="synthetic" if args.synthetic else "azure-llm-2023",
        windows=sizes.windows, window_s=sizes.wall_s, compress=COMPRESS,
        dense_compress=DENSE_COMPRESS,
        time_scale=args.time_scale, actuator_args=args.actuator_arg, wall_s=round(wall, 1),
        spreads={k: {f: vars(s) for f, s in v.items()} for k, v in per_kind.items()},
        actions=actions, notes=notes,
    )  # fmt: skip
    print(json.dumps(line))
    return 1 if failed else 0


if __name__ == "__main__":
    exit_on_sigterm()  # a timeout or kill still stops the stack it started
    sys.exit(main())
