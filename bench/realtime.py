"""Real-time programs that keep their memory and launch back to back: unmanaged vs managed.

Real containers on a private dockerd, gpusim, the real exporter and
actuator (fast path), as in ``colocation.py``; every scenario runs unmanaged and managed in
the same invocation, with the same arrivals, and is judged from the workloads' own JSON-lines
logs (the ground truth) and the actuator's audit log (why managed differs):

  (a) repeaters   the README walkthrough without its gap: rt-1 and rt-2, deadline 9s, each the
                  oneshot matmul ``--size 13312 --repeat 3`` back to back (no
                  ``--sleep-between``: the hard case), rt-2 released while rt-1's first kernel
                  runs.
                  ``overlap_s_*``: time both containers' kernels ran at once (the device's own
                  start and end of each kernel, as the workload logged them).
  (b) pair        two real-time servers on one GPU, bursty arrivals (a burst of 18-26 requests
                  within 10 s every 20 s, over a light Poisson background) with heavy-tailed
                  sizes (log-normal, median 180 ms of kernels: ~300 ms latency alone), one with
                  a tighter deadline (``gpuguard.deadline`` 1500ms against 4s), under
                  ``--policy.order=edf``. ``pair_tight_hit_rate_*``: the share of the tight
                  server's requests that met its deadline (its own request log).
  (c) dense       a server with short dense requests (25 ms of kernels, Poisson 16/s, deadline
                  100ms) beside a best-effort trainer (``gpuguard.class=best-effort``, 40 ms
                  steps): the server's p99 alone, shared and managed, the trainer's steps/s,
                  and flaps (the trainer's freeze -> thaw pairs per minute, audit log).
  (d) node_marks  hook: ``node_marked_fraction`` (a server alone, full alert pipeline)
  (e) freeze      hook: ``freeze_p95_ms_burst10`` (ten new tasks at once -> frozen, p95)

(d) and (e) are written elsewhere: their ``SCENARIOS`` entries name the module and function
each is looked up in (``bench/node_marks.py``, ``bench/freeze.py``: ``measure``); until they
exist their keys are null with a note. A hook is ``measure(bench: Bench) -> dict`` (its
figures, at least its keys); it may use ``bench.node`` (this run's node, fast path) or start
a stack of its own, and sizes itself by ``bench.mode`` (smoke, quick or full).

The actuator's flags are the scenario's defaults (``pair``: ``--policy.order=edf``) plus
``--actuator-flags NAME=FLAGS`` (NAME a scenario, its letter, or ``all``), so a policy change
(``--policy.preempt``, hold times) is tried without editing this file; the actuator restarts
between scenarios whose flags differ. Kernels run at ``--time-scale``; every wall length
above (requests, steps, the matmul's 1.08 s) is kept whatever the scale. ``--quick`` takes
about 2.5 minutes here, ``--smoke`` (CI) under a minute (the alone runs then share the
shared run's time, on GPUs of their own). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchargs import BenchParser, positive
from replay.judge import merged

from gpuguard.actuator.audit import read_audit
from gpuguard.contract import PriorityClass, WorkloadKind
from gpuguard.demo.stack.localstack import NodeStack
from gpuguard.demo.stack.process import ServiceError, exit_on_sigterm
from gpuguard.demo.stack.scenario import ScenarioResult, WorkloadSpec, run_to_end
from gpuguard.gpusim.workload.arrivals import Bursts, bursty_arrivals, trace_lines
from gpuguard.gpusim.workload.server import percentile

GPUS = ("name=gpu0", "name=gpu1", "name=gpu2")
#: (a): rt-2 is released this long after rt-1, inside rt-1's first kernel (which runs from
#: ~0.3 s to ~1.4 s: context, 2.2 GB copied in, then 1.08 s of kernel)
REPEATER_DELAY_S = 0.7
#: (b): requests' kernels (wall seconds) and deadlines
PAIR_MEDIAN_S, PAIR_TIGHT, PAIR_LOOSE = 0.18, "1500ms", "4s"
#: (b): a burst: this many requests within 10 s, every 20 s
PAIR_BURST = (18, 26)
#: (c): a request's kernels, requests per second, the server's deadline, a training step
DENSE_REQUEST_S, DENSE_RATE, DENSE_DEADLINE, DENSE_STEP_S = 0.025, 16.0, "100ms", 0.04
#: a freeze this soon after a thaw is a flap the issue counts apart
REFREEZE_S = 0.25
RUN_ORDER = {"alone": 0, "shared": 1, "managed": 2}


@dataclass(frozen=True)
class Sizes:
    """How long each scenario runs in a mode."""

    rounds: int  # (a) pairs of repeaters per run
    repeat: int  # (a) tasks each
    pair_s: float  # (b) seconds of arrivals
    dense_s: float  # (c) seconds per run
    lead_in: float  # s before the release: a server's start-up task ends first
    alone_beside: bool  # the alone containers run beside the shared run, on GPUs 1 and 2


SIZES = {
    "smoke": Sizes(1, 1, 4.0, 4.0, 2.5, True),
    "quick": Sizes(1, 3, 20.0, 10.0, 3.5, True),
    "full": Sizes(3, 3, 60.0, 60.0, 3.5, False),
}


# --- the harness: one node, runs, audit windows --------------------------------------------


@dataclass
class Run:
    """One run of a scenario: the workloads' results and the audit records of its window."""

    label: str
    result: ScenarioResult
    audit: list[dict[str, Any]]
    log_dir: Path

    def requests(self, container: str) -> list[Any]:
        return [r for r in self.result.requests if r.container == container]

    def steps_per_s(self, container: str, start: float, end: float) -> float:
        done = sum(s.container == container and start <= s.end <= end for s in self.result.steps)
        return done / (end - start) if end > start else 0.0

    def log_lines(self, container: str) -> list[str]:
        path = self.log_dir / f"{container}.jsonl"
        return path.read_text().splitlines() if path.exists() else []


@dataclass
class Bench:
    """What a scenario measures with: the node, the mode, the actuator flags asked for."""

    node: NodeStack
    mode: str
    sizes: Sizes
    time_scale: float
    seed: int
    extra_flags: dict[str, list[str]]
    progress: Callable[[str], None] = print

    def work(self, wall_s: float) -> float:
        """Device-seconds of kernel work that last ``wall_s`` at this time scale."""
        return round(wall_s / self.time_scale, 6)

    def actuator_flags(self, scenario: Scenario) -> list[str]:
        return [
            *scenario.default_flags,
            *self.extra_flags.get("all", []),
            *self.extra_flags.get(scenario.name, []),
        ]

    def use_actuator(self, flags: list[str]) -> None:
        """Restart the actuator when ``flags`` differ from those it runs with (or it is down).

        Raises RuntimeError with the actuator's own words when it will not start with them.
        """
        order, rest = split_order(flags)
        actuator = self.node.actuator
        same = (order, rest) == (self.node.order, self.node.extra_actuator_flags)
        if same and actuator is not None and actuator.alive():
            return
        self.node.stop_actuator()  # resumes what it paused
        self.node.order, self.node.extra_actuator_flags = order, rest
        try:
            self.node.start_actuator()
        except ServiceError as exc:  # its first line and its log's last: the reason
            said = str(exc).strip().splitlines()
            raise RuntimeError(
                f"the actuator would not start with {shlex.join(flags)}: {said[0]} {said[-1]}"
            ) from None
        self.progress(f"actuator restarted: {shlex.join([f'--policy.order={order}', *rest])}")

    def run(
        self, label: str, specs: list[WorkloadSpec], timeout: float, lead_in: float | None = None
    ) -> Run:
        lead = self.sizes.lead_in if lead_in is None else lead_in
        result, audit = run_audited(self.node, label, specs, lead, timeout)
        return Run(label, result, audit, self.node.base_dir / "logs" / label)


def run_audited(
    node: NodeStack,
    label: str,
    specs: list[WorkloadSpec],
    lead_in: float,
    timeout: float,
    concurrently: int = 1,
) -> tuple[ScenarioResult, list[dict[str, Any]]]:
    """Run a scenario to its end; its results and the actuator's audit records of its span.

    Raises RuntimeError when the actuator was not running at its end: its figures would
    then be unmanaged ones.
    """
    started = time.time()
    result = run_to_end(node, label, specs, lead_in, timeout, concurrently)
    ended = time.time()
    actuator = node.actuator
    if actuator is None or not actuator.alive():
        tail = actuator.log_tail(lines=1).strip() if actuator is not None else ""
        raise RuntimeError(f"the actuator was not running at the end of {label}: {tail}")
    audit = [
        r
        for r in read_audit(node.state_dir / "audit.jsonl")
        if started <= float(r.get("ts", 0)) <= ended
    ]
    return result, audit


def split_order(flags: list[str], default: str = "fifo") -> tuple[str, list[str]]:
    """``--policy.order`` (the last one given, either form) apart from the other flags:
    ``NodeStack`` passes the order itself."""
    order, rest = default, []
    words = iter(flags)
    for word in words:
        if word.startswith("--policy.order="):
            order = word.split("=", 1)[1]
        elif word == "--policy.order":
            order = next(words, default)
        else:
            rest.append(word)
    return order, rest


def action_counts(audit: Iterable[dict[str, Any]]) -> dict[str, int]:
    """The actuator's actions by kind and reason (a result other than ok is named), and its
    skips by reason, from audit records."""
    counts: collections.Counter[str] = collections.Counter()
    for record in audit:
        if record.get("event") == "action":
            key = f"{record.get('action')}/{record.get('reason', '-')}"
            if record.get("result") != "ok":
                key += f" ({record.get('result')})"
            counts[key] += 1
        elif record.get("event") == "skip":
            counts[f"skip/{record.get('reason')}"] += 1
    return dict(sorted(counts.items()))


def actions_text(runs: Iterable[Run]) -> str:
    lines = ["actuator (audit log; a skip is logged once per task and reason per 30 s):"]
    for run in runs:
        counts = action_counts(run.audit)
        text = ", ".join(f"{k} {v}" for k, v in counts.items()) or "nothing"
        lines.append(f"  {run.label}: {text}")
    return "\n".join(lines)


def overlap_s(spans: dict[str, list[tuple[float, float]]]) -> float:
    """Total time during which kernels of at least two different containers ran at once."""
    edges: list[tuple[float, int]] = []
    for intervals in spans.values():
        for start, end in merged(intervals):
            edges += [(start, 1), (end, -1)]
    edges.sort()  # at one instant an end (-1) comes before a start (+1): touching is no overlap
    total, active, last = 0.0, 0, 0.0
    for t, step in edges:
        if active >= 2:
            total += t - last
        active, last = active + step, t
    return total


def kernel_spans(
    lines: Iterable[str],
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """A oneshot log's kernels: as the device ran them (``device_started``/``device_ended``
    on ``kernel_end``), and as the host logged them (``kernel_start`` -> ``kernel_end``)."""
    device: list[tuple[float, float]] = []
    host: list[tuple[float, float]] = []
    starts: dict[int, float] = {}
    for line in lines:
        if not line.strip().endswith("}"):
            continue
        record = json.loads(line)
        if record.get("event") == "kernel_start":
            starts[int(record["run"])] = float(record["t"])
        elif record.get("event") == "kernel_end":
            run = int(record["run"])
            if run in starts:
                host.append((starts[run], float(record["t"])))
            began, ended = record.get("device_started"), record.get("device_ended")
            if began is not None and ended is not None:
                device.append((float(began), float(ended)))
            elif run in starts:
                device.append((starts[run], float(record["t"])))
    return device, host


def flaps(audit: Iterable[dict[str, Any]], container: str) -> tuple[int, int]:
    """A container's freeze -> thaw pairs, and how many freezes came within ``REFREEZE_S``
    of the thaw before them."""
    actions = sorted(
        (float(r.get("finished", r["ts"])), r["action"])
        for r in audit
        if r.get("event") == "action" and r.get("container") == container
        and r.get("result") == "ok" and r.get("action") in ("pause", "unpause")
    )  # fmt: skip
    pairs = quick = 0
    frozen, thawed_at = False, None
    for t, action in actions:
        if action == "pause" and not frozen:
            quick += thawed_at is not None and t - thawed_at <= REFREEZE_S
            frozen = True
        elif action == "unpause" and frozen:
            pairs += 1
            frozen, thawed_at = False, t
    return pairs, quick


def ms(value: float | None) -> float | None:
    return None if value is None else round(1000 * value, 1)


def latency_ms(latencies: list[float]) -> tuple[float | None, float | None]:
    """p50 and p99 in ms (nearest rank, as the server workload reports them)."""
    return ms(percentile(latencies, 0.5)), ms(percentile(latencies, 0.99))


def hit_rate(requests: list[Any]) -> float | None:
    judged = [r.met_deadline for r in requests if r.met_deadline is not None]
    return round(sum(judged) / len(judged), 3) if judged else None


def fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


# --- scenarios -----------------------------------------------------------------------------


@dataclass
class Outcome:
    """A scenario's figures (its keys, maybe more), the text a reader sees, notes."""

    figures: dict[str, Any]
    text: str = ""
    actions: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Scenario:
    name: str
    letter: str
    keys: tuple[str, ...]
    measure: Callable[[Bench, Scenario], Outcome]
    default_flags: tuple[str, ...] = ()
    target: str = ""
    #: whether the figures meet the target (None: cannot tell)
    met: Callable[[dict[str, Any]], bool | None] = lambda _: None


def outcome_of(runs: list[Run], figures: dict[str, Any], text: str) -> Outcome:
    return Outcome(
        figures,
        text + "\n" + actions_text(runs),
        {run.label: action_counts(run.audit) for run in runs},
    )


def measure_repeaters(bench: Bench, scenario: Scenario) -> Outcome:
    """(a) The README walkthrough's rt-1 and rt-2 without its gap, unmanaged then managed."""
    sizes = bench.sizes
    runs: list[Run] = []
    lines = [
        f"{'run':<22} {'tasks: run time s (rt-1 | rt-2)':<36} {'hit':>5} {'total s':>8} "
        f"{'overlap s':>9} {'(host)':>7}"
    ]
    per_mode: dict[str, list[tuple[float, float]]] = {"unmanaged": [], "managed": []}
    for mode in per_mode:
        for round_ in range(sizes.rounds):
            label = f"a-{mode}" + (f"-{round_ + 1}" if sizes.rounds > 1 else "")
            specs = [
                WorkloadSpec(
                    f"{label}-rt-{i + 1}", 13312, repeat=sizes.repeat, deadline="9s",
                    managed=mode == "managed", delay_s=i * REPEATER_DELAY_S,
                )
                for i in range(2)
            ]  # fmt: skip
            run = bench.run(label, specs, 120 + 10 * sizes.repeat, lead_in=1.0)
            runs.append(run)
            device, host = {}, {}
            for spec in specs:
                device[spec.name], host[spec.name] = kernel_spans(run.log_lines(spec.name))
            both = (overlap_s(device), overlap_s(host))
            per_mode[mode].append(both)
            times = " | ".join(
                "/".join(f"{t.run_s:.1f}" for t in run.result.tasks if t.container == s.name)
                for s in specs
            )
            lines.append(
                f"{label:<22} {times:<36} {fmt(run.result.hit_rate, '.0%'):>5} "
                f"{run.result.total_s:8.2f} {both[0]:9.2f} {both[1]:7.2f}"
            )
    figures: dict[str, Any] = {}
    for mode, values in per_mode.items():
        figures[f"overlap_s_{mode}"] = round(statistics.fmean(v[0] for v in values), 3)
        figures[f"overlap_host_s_{mode}"] = round(statistics.fmean(v[1] for v in values), 3)
    alone = 10.79 * bench.time_scale
    lines.append(
        f"overlap: the device's kernel start/end as each workload logged them (host: its "
        f"kernel_start -> kernel_end lines); one kernel alone lasts {alone:.2f} s"
    )
    return outcome_of(runs, figures, "\n".join(lines))


def pair_bursts(bench: Bench) -> Bursts:
    """Bursts of ``PAIR_BURST`` requests within 10 s every 20 s; a shorter run gets one burst,
    as dense, in half its length."""
    duration = bench.sizes.pair_s
    period = min(20.0, duration)
    span = period / 2
    size = (max(2, round(PAIR_BURST[0] * span / 10)), max(3, round(PAIR_BURST[1] * span / 10)))
    return Bursts(
        bench.work(PAIR_MEDIAN_S), sigma=0.7, max_factor=8.0, period=period, jitter=0.2,
        span=span, size=size, background_rate=0.2,
    )  # fmt: skip


def measure_pair(bench: Bench, scenario: Scenario) -> Outcome:
    """(b) Two real-time servers, the tight one and the loose one, alone, shared, managed."""
    sizes = bench.sizes
    deadline = {"tight": PAIR_TIGHT, "loose": PAIR_LOOSE}
    bursts = pair_bursts(bench)
    traces = {
        role: trace_lines(bursty_arrivals(bursts, sizes.pair_s, 256 * 1024, bench.seed + i))
        for i, role in enumerate(deadline)
    }

    def spec(label: str, kind: str, role: str, device: str) -> WorkloadSpec:
        trace = bench.node.base_dir / "logs" / label / f"{kind}-{role}.trace.jsonl"
        trace.parent.mkdir(parents=True, exist_ok=True)
        trace.write_text("\n".join(traces[role]) + "\n")
        flags = ("--trace", str(trace), "--kernels", "4", "--memory-bytes", "1GiB")
        return WorkloadSpec(
            f"b-{kind}-{role}", kind=WorkloadKind.SERVER, kind_args=(*flags, "--device", device),
            deadline=deadline[role], managed=kind == "managed",
        )  # fmt: skip

    # run -> (kind, role, GPU) of its servers
    plan: dict[str, list[tuple[str, str, str]]] = {
        "b-alone": [("alone", "tight", "0"), ("alone", "loose", "1")],
        "b-shared": [("shared", "tight", "0"), ("shared", "loose", "0")],
        "b-managed": [("managed", "tight", "0"), ("managed", "loose", "0")],
    }
    if sizes.alone_beside:
        plan["b-shared"] += [(k, r, str(1 + i)) for i, (k, r, _) in enumerate(plan["b-alone"])]
        del plan["b-alone"]
    runs: list[Run] = []
    served: dict[tuple[str, str], list[Any]] = {}
    for label, members in plan.items():
        specs = [spec(label, *member) for member in members]
        run = bench.run(label, specs, sizes.pair_s + sizes.lead_in + 120)
        runs.append(run)
        for (kind, role, _), s in zip(members, specs, strict=True):
            served[kind, role] = run.requests(s.name)
    lines = [
        f"{'run':<8} {'server':<6} {'deadline':>8} {'requests':>8} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'max ms':>7} {'hit':>5}"
    ]
    figures: dict[str, Any] = {}
    for (kind, role), requests in sorted(served.items(), key=lambda kv: RUN_ORDER[kv[0][0]]):
        latencies = [r.latency_s for r in requests]
        hit, p50, p99 = hit_rate(requests), *latency_ms(latencies)
        lines.append(
            f"{kind:<8} {role:<6} {deadline[role]:>8} {len(requests):>8} {fmt(p50, '.0f'):>7} "
            f"{fmt(p99, '.0f'):>7} {fmt(ms(max(latencies, default=None)), '.0f'):>7} "
            f"{fmt(hit, '.0%'):>5}"
        )
        figures[f"pair_{role}_hit_rate_{kind}"] = hit
        figures[f"pair_{role}_p99_ms_{kind}"] = p99
    figures["pair_requests"] = {role: len(traces[role]) for role in traces}
    lines.append(
        f"arrivals: {len(traces['tight'])} and {len(traces['loose'])} requests in "
        f"{sizes.pair_s:.0f} s: bursts of {bursts.size[0]}-{bursts.size[1]} within "
        f"{bursts.span:.0f} s every {bursts.period:.0f} s, Poisson {bursts.background_rate}/s "
        f"between; kernels log-normal, median {1000 * PAIR_MEDIAN_S:.0f} ms (sigma "
        f"{bursts.sigma}); actuator {' '.join(bench.actuator_flags(scenario))}"
    )
    return outcome_of(runs, figures, "\n".join(lines))


def measure_dense(bench: Bench, scenario: Scenario) -> Outcome:
    """(c) A server with short dense requests beside a best-effort trainer."""
    sizes = bench.sizes
    duration = sizes.dense_s

    def server(label: str, device: str) -> WorkloadSpec:
        flags = ["--rate", f"{DENSE_RATE}", "--request-work", f"{bench.work(DENSE_REQUEST_S)}"]
        flags += ["--kernels", "3", "--duration", f"{duration}", "--seed", f"{bench.seed}"]
        flags += ["--memory-bytes", "1GiB", "--device", device]
        return WorkloadSpec(
            f"{label}-server", kind=WorkloadKind.SERVER, kind_args=tuple(flags),
            deadline=DENSE_DEADLINE,
        )  # fmt: skip

    def trainer(label: str, device: str, managed: bool) -> WorkloadSpec:
        flags = ["--step-work", f"{bench.work(DENSE_STEP_S)}", "--kernels", "4"]
        flags += ["--sync-every", "1", "--duration", f"{duration}"]
        flags += ["--memory-bytes", "2GiB", "--device", device]
        return WorkloadSpec(
            f"{label}-trainer", kind=WorkloadKind.TRAIN, kind_args=tuple(flags),
            managed=managed, priority=PriorityClass.BEST_EFFORT,
        )  # fmt: skip

    plan = {
        "c-alone": [server("c-alone", "0"), trainer("c-alone", "1", False)],
        "c-shared": [server("c-shared", "0"), trainer("c-shared", "0", False)],
        "c-managed": [server("c-managed", "0"), trainer("c-managed", "0", True)],
    }
    who = {"alone": "c-alone", "shared": "c-shared", "managed": "c-managed"}
    if sizes.alone_beside:
        del plan["c-alone"]
        plan["c-shared"] += [server("c-alone", "1"), trainer("c-alone", "2", False)]
    runs = {
        label: bench.run(label, specs, duration + sizes.lead_in + 60)
        for label, specs in plan.items()
    }
    lines = [
        f"{'run':<8} {'requests':>8} {'p50 ms':>7} {'p99 ms':>7} {'hit':>5} {'trainer steps/s':>15}"
    ]
    figures: dict[str, Any] = {}
    for kind, prefix in who.items():
        run = next(r for r in runs.values() if r.requests(f"{prefix}-server"))
        requests = run.requests(f"{prefix}-server")
        p50, p99 = latency_ms([r.latency_s for r in requests])
        released = run.result.released_at
        steps = run.steps_per_s(f"{prefix}-trainer", released, released + duration)
        lines.append(
            f"{kind:<8} {len(requests):>8} {fmt(p50, '.0f'):>7} {fmt(p99, '.0f'):>7} "
            f"{fmt(hit_rate(requests), '.0%'):>5} {steps:15.1f}"
        )
        figures[f"dense_rt_p99_{kind}_ms"] = p99
        figures[f"dense_be_steps_{kind}"] = round(steps, 2)
        figures[f"dense_rt_hit_rate_{kind}"] = hit_rate(requests)
    managed = runs["c-managed"]
    window = (managed.result.released_at, managed.result.released_at + duration)
    in_window = [r for r in managed.audit if window[0] <= r.get("finished", r["ts"]) <= window[1]]
    pairs, quick = flaps(in_window, "c-managed-trainer")
    figures["dense_flaps_per_min"] = round(pairs * 60 / duration, 1)
    figures["dense_refreezes_within_250ms"] = quick
    lines.append(
        f"managed: the trainer was frozen and thawed {pairs} times in {duration:.0f} s "
        f"({figures['dense_flaps_per_min']}/min); {quick} freezes came within "
        f"{1000 * REFREEZE_S:.0f} ms of a thaw"
    )
    return outcome_of(list(runs.values()), figures, "\n".join(lines))


def hook(module: str, function: str) -> Callable[[Bench, Scenario], Outcome]:
    """A scenario measured by ``module.function(bench) -> dict`` written elsewhere; while it
    does not exist, its keys are null with a note."""

    def measure(bench: Bench, scenario: Scenario) -> Outcome:
        found = None
        for name in (module, module.rsplit(".", 1)[-1]):  # bench.x, or x beside this file
            try:
                found = importlib.import_module(name)
                break
            except ModuleNotFoundError as exc:
                if exc.name not in (name, name.split(".")[0]):
                    raise  # the module exists but lacks something it imports
        measure_fn = getattr(found, function, None) if found is not None else None
        if measure_fn is None:
            note = (
                f"{scenario.name}: {module}.{function} not available yet: "
                f"{', '.join(scenario.keys)} null"
            )
            return Outcome(dict.fromkeys(scenario.keys), note, notes=[note])
        figures = dict(measure_fn(bench))
        missing = [key for key in scenario.keys if key not in figures]
        if missing:
            raise RuntimeError(f"{module}.{function} returned no {', '.join(missing)}")
        return Outcome(figures)

    return measure


def _le(key: str, limit: float) -> Callable[[dict[str, Any]], bool | None]:
    return lambda f: None if f.get(key) is None else f[key] <= limit


def _targets_a(f: dict[str, Any]) -> bool | None:
    if f.get("overlap_s_managed") is None or f.get("overlap_s_unmanaged") is None:
        return None
    return f["overlap_s_managed"] <= 0.1 * f["overlap_s_unmanaged"]


def _targets_b(f: dict[str, Any]) -> bool | None:
    # two servers without SLO signals share; neither may fare worse than sharing
    rates = [(f.get(f"pair_{s}_hit_rate_shared"), f.get(f"pair_{s}_hit_rate_managed"))
             for s in ("tight", "loose")]  # fmt: skip
    if any(shared is None or managed is None for shared, managed in rates):
        return None
    return all(managed >= shared for shared, managed in rates)


def _targets_c(f: dict[str, Any]) -> bool | None:
    need = ("dense_rt_p99_shared_ms", "dense_rt_p99_managed_ms", "dense_be_steps_shared",
            "dense_be_steps_managed")  # fmt: skip
    if any(f.get(k) is None for k in need):
        return None
    return bool(
        f["dense_rt_p99_managed_ms"] < f["dense_rt_p99_shared_ms"]
        and f["dense_be_steps_managed"] >= f["dense_be_steps_shared"]
    )


#: Every scenario, in running order. Adding one is one entry here: its keys then always
#: appear in the JSON line (null when it did not run).
SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "repeaters", "a", ("overlap_s_unmanaged", "overlap_s_managed"), measure_repeaters,
        target="overlap managed <= 10% of unmanaged", met=_targets_a,
    ),
    Scenario(
        "pair", "b", ("pair_tight_hit_rate_shared", "pair_tight_hit_rate_managed"),
        measure_pair, default_flags=("--policy.order=edf",),
        target="no server's hit rate managed below shared", met=_targets_b,
    ),
    Scenario(
        "dense", "c",
        ("dense_rt_p99_alone_ms", "dense_rt_p99_shared_ms", "dense_rt_p99_managed_ms",
         "dense_be_steps_shared", "dense_be_steps_managed", "dense_flaps_per_min"),
        measure_dense, target="p99 managed < shared and trainer managed >= shared",
        met=_targets_c,
    ),
    # HOOK (d): a server alone through the full alert pipeline (another engineer's module).
    Scenario(
        "node_marks", "d", ("node_marked_fraction",), hook("bench.node_marks", "measure"),
        target="<= 0.05", met=_le("node_marked_fraction", 0.05),
    ),
    # HOOK (e): ten new tasks at once -> their containers frozen (another engineer's module).
    Scenario(
        "freeze", "e", ("freeze_p95_ms_burst10",), hook("bench.freeze", "measure"),
        target="<= 20 ms", met=_le("freeze_p95_ms_burst10", 20.0),
    ),
)  # fmt: skip


# --- main ----------------------------------------------------------------------------------


def scenario_named(name: str) -> Scenario:
    for scenario in SCENARIOS:
        if name in (scenario.name, scenario.letter):
            return scenario
    known = ", ".join(f"{s.name} ({s.letter})" for s in SCENARIOS)
    raise argparse.ArgumentTypeError(f"unknown scenario {name!r}: one of {known}")


def parse_flag_sets(values: list[str]) -> dict[str, list[str]]:
    """``NAME=FLAGS`` (repeatable) into extra actuator flags by scenario name (or ``all``)."""
    out: dict[str, list[str]] = {}
    for value in values:
        name, sep, flags = value.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--actuator-flags {value!r}: use NAME=FLAGS")
        key = "all" if name == "all" else scenario_named(name).name
        out.setdefault(key, []).extend(shlex.split(flags))
    return out


def summary_table(figures: dict[str, Any], ran: list[Scenario]) -> str:
    lines = [f"{'scenario':<14} {'target':<52} met"]
    for scenario in ran:
        met = scenario.met(figures)
        lines.append(
            f"({scenario.letter}) {scenario.name:<10} {scenario.target:<52} "
            f"{'-' if met is None else 'yes' if met else 'NO'}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = BenchParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="short runs (about 2.5 minutes)")
    size.add_argument("--smoke", action="store_true", help="shortest runs, for CI (< 1 minute)")
    parser.add_argument("--time-scale", type=positive, default=0.1, help="gpusim kernel time scale")
    parser.add_argument("--poll-interval", default="20ms", help="exporter poll interval")
    parser.add_argument("--seed", type=int, default=5, help="arrivals")
    parser.add_argument(
        "--only", action="append", type=scenario_named, default=None, metavar="NAME",
        help="run only this scenario (name or letter; repeatable): the others' keys are null",
    )  # fmt: skip
    parser.add_argument(
        "--actuator-flags", action="append", default=[], metavar="NAME=FLAGS",
        help="more actuator flags for scenario NAME (or all), e.g. 'pair=--policy.preempt'",
    )  # fmt: skip
    parser.add_argument("--exporter-flags", default="", help="more exporter flags (all runs)")
    parser.add_argument("--keep", type=Path, default=None, help="keep logs and audit in this dir")
    args = parser.parse_args()
    try:
        extra_flags = parse_flag_sets(args.actuator_flags)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    chosen = [s for s in SCENARIOS if args.only is None or s in args.only]
    started = time.time()
    base = Path(tempfile.mkdtemp(prefix="ggr-")) if args.keep is None else args.keep.resolve()
    node = NodeStack(base, "bench", time_scale=args.time_scale, poll_interval=args.poll_interval)
    node.actuator_mode = "fast"
    node.gpusim_options = {"device": list(GPUS)}
    node.extra_exporter_flags = shlex.split(args.exporter_flags)
    # The node starts with the actuator's defaults; each scenario then asks for its flags, so
    # flags the actuator refuses fail that scenario alone.
    bench = Bench(node, mode, SIZES[mode], args.time_scale, args.seed, extra_flags)
    print(
        f"realtime bench ({mode}): gpusim time scale {args.time_scale} (wall lengths kept), "
        f"exporter poll {args.poll_interval}, actuator fast path; scenarios "
        f"{', '.join(s.name for s in chosen)}",
        flush=True,
    )
    figures: dict[str, Any] = {key: None for s in SCENARIOS for key in s.keys}
    notes: list[str] = [f"{s.name}: not run (--only)" for s in SCENARIOS if s not in chosen]
    actions: dict[str, dict[str, dict[str, int]]] = {}
    flags_used: dict[str, list[str]] = {}
    failed = False
    try:
        node.start(progress=lambda line: print("  " + line, flush=True))
        for scenario in chosen:
            print(f"\n== ({scenario.letter}) {scenario.name}", flush=True)
            flags_used[scenario.name] = bench.actuator_flags(scenario)
            t0 = time.time()
            try:
                bench.use_actuator(flags_used[scenario.name])
                outcome = scenario.measure(bench, scenario)
            except Exception as exc:  # a scenario that fails leaves the others to run
                failed = True
                note = f"{scenario.name}: failed: {type(exc).__name__}: {exc}"
                outcome = Outcome(dict.fromkeys(scenario.keys), note, notes=[note])
            figures.update(outcome.figures)
            notes += outcome.notes
            if outcome.actions:
                actions[scenario.name] = outcome.actions
            print(outcome.text, flush=True)
            print(f"({scenario.letter}) took {time.time() - t0:.0f}s", flush=True)
    finally:
        node.stop()
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    wall = time.time() - started
    print()
    print(summary_table(figures, chosen))
    print(f"took {wall:.0f}s")
    line = dict(figures)
    line.update(
        mode=mode, time_scale=args.time_scale, wall_s=round(wall, 1), actuator_flags=flags_used,
        actions=actions, notes=notes,
    )  # fmt: skip
    print(json.dumps(line))
    return 1 if failed else 0


if __name__ == "__main__":
    exit_on_sigterm()  # a timeout or kill still stops the stack it started
    sys.exit(main())
