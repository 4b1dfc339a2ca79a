"""Scenarios of workload containers on gpusim, all released together.

Paper B's (several containers run the matmul workload), and mixes of the other workload
kinds (an inference server beside a training loop). Shared by the demo and the benchmarks:
launch workload containers, wait for them, and read their own JSON-lines logs (the ground
truth) into per-task, per-request and per-step results.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard import labels
from gpuguard.contract import WorkloadEvent, WorkloadKind
from gpuguard.demo.stack.images import python_container_kwargs

SCENARIO_LABEL = "gpuguard.scenario"


@dataclass(frozen=True)
class WorkloadSpec:
    """One container of a scenario."""

    name: str
    size: int = 13312
    repeat: int = 1
    deadline: str | None = None
    managed: bool = False
    work_seconds: float | None = None
    memory_bytes: int | None = None
    delay_s: float = 0.0  # released this long after the others
    kind: WorkloadKind = WorkloadKind.ONESHOT
    #: more flags of the workload kind (size and repeat are oneshot's own fields)
    kind_args: tuple[str, ...] = ()
    priority: str | None = None  # label gpuguard.class
    task_mode: str | None = None  # label gpuguard.task
    #: more container labels (a latency SLO's ``gpuguard.slo.*``)
    extra_labels: tuple[tuple[str, str], ...] = ()
    #: on the host's network: a server whose /metrics the stack's Prometheus scrapes
    host_network: bool = False

    def labels(self, scenario: str) -> dict[str, str]:
        out = {SCENARIO_LABEL: scenario}
        if self.deadline is not None:
            out[labels.DEADLINE] = self.deadline
        if self.managed:
            out[labels.MANAGED] = "true"
        if self.priority is not None:
            out[labels.CLASS] = self.priority
        if self.task_mode is not None:
            out[labels.TASK] = self.task_mode
        out.update(self.extra_labels)
        return out

    def workload_args(self, log_path: Path, start_at: float) -> list[str]:
        args = ["gpuguard.gpusim.workload"]
        if self.kind is WorkloadKind.ONESHOT:
            args += ["--size", str(self.size), "--repeat", str(self.repeat), *self.kind_args]
        else:
            args += [self.kind.value, *self.kind_args]
        args += ["--log", str(log_path), "--start-at", f"{start_at + self.delay_s:.6f}"]
        if self.work_seconds is not None:
            args += ["--work-seconds", str(self.work_seconds)]
        if self.memory_bytes is not None:
            args += ["--memory-bytes", str(self.memory_bytes)]
        return args


@dataclass(frozen=True)
class TaskResult:
    """One GPU task as the workload itself logged it."""

    container: str
    run: int
    pid: int
    start: float
    end: float
    context_created: float | None
    kernel_start: float | None
    kernel_end: float | None
    deadline_s: float | None
    #: when its output copy began (after its last kernel): the tail NVML shows no SM in
    output_start: float | None = None

    @property
    def run_s(self) -> float:
        return self.end - self.start

    @property
    def met_deadline(self) -> bool | None:
        return None if self.deadline_s is None else self.run_s <= self.deadline_s


@dataclass(frozen=True)
class RequestResult:
    """One request a ``server`` workload answered, as it logged it."""

    container: str
    id: int
    arrival: float
    start: float
    end: float
    gpu_start: float | None
    gpu_end: float | None
    deadline_s: float | None

    @property
    def latency_s(self) -> float:
        """Arrival to answer: what its client waited."""
        return self.end - self.arrival

    @property
    def met_deadline(self) -> bool | None:
        return None if self.deadline_s is None else self.latency_s <= self.deadline_s


@dataclass(frozen=True)
class StepResult:
    """One step of a ``train`` workload: when it was launched and when the device ended it."""

    container: str
    step: int
    launched: float
    end: float


@dataclass(frozen=True)
class ScenarioResult:
    """All tasks, requests and steps of one scenario run, and the figures paper B reports."""

    name: str
    released_at: float
    tasks: tuple[TaskResult, ...]
    errors: tuple[str, ...] = field(default=())
    requests: tuple[RequestResult, ...] = field(default=())
    steps: tuple[StepResult, ...] = field(default=())

    @property
    def total_s(self) -> float:
        """First start to last finish (paper B's metric)."""
        if not self.tasks:
            return 0.0
        return max(t.end for t in self.tasks) - min(t.start for t in self.tasks)

    @property
    def mean_completion_s(self) -> float:
        """Mean time from the common release to each task's end."""
        if not self.tasks:
            return 0.0
        return statistics.fmean(t.end - self.released_at for t in self.tasks)

    @property
    def hit_rate(self) -> float | None:
        """Share of the tasks with a deadline that met it (a server's requests count)."""
        outcomes = [*(t.met_deadline for t in self.tasks), *(r.met_deadline for r in self.requests)]
        judged = [met for met in outcomes if met is not None]
        return sum(judged) / len(judged) if judged else None

    def steps_per_s(self, start: float, end: float) -> float:
        """Training steps the device ended per second within ``[start, end]``."""
        done = sum(start <= s.end <= end for s in self.steps)
        return done / (end - start) if end > start else 0.0


def parse_workload_log(
    container: str, lines: Iterable[str], deadline_s: float | None
) -> list[TaskResult]:
    """Turn one workload log into its tasks (pure; incomplete tasks are left out)."""
    runs: dict[int, dict[str, Any]] = {}
    for line in lines:
        line = line.strip()
        if not line:
            continue
        record = json.loads(line)
        if "run" in record:
            runs.setdefault(int(record["run"]), {})[record["event"]] = record
    tasks = []
    for run, events in sorted(runs.items()):
        if "task_start" not in events or "task_end" not in events:
            continue

        def at(name: str, events: dict[str, Any] = events) -> float | None:
            return float(events[name]["t"]) if name in events else None

        tasks.append(
            TaskResult(
                container=container,
                run=run,
                pid=int(events["task_start"]["pid"]),
                start=float(events["task_start"]["t"]),
                end=float(events["task_end"]["t"]),
                context_created=at("context_created"),
                kernel_start=at("kernel_start"),
                kernel_end=at("kernel_end"),
                deadline_s=deadline_s,
                output_start=at("output_start"),
            )
        )
    return tasks


def parse_requests(
    container: str, lines: Iterable[str], deadline_s: float | None
) -> list[RequestResult]:
    """A ``server`` workload's answered requests (pure)."""
    return [
        RequestResult(
            container,
            int(r["id"]),
            float(r["arrival"]),
            float(r["start"]),
            float(r["end"]),
            _maybe(r.get("gpu_start")),
            _maybe(r.get("gpu_end")),
            deadline_s,
        )
        for r in _records(lines)
        if r.get("event") == WorkloadEvent.REQUEST
    ]


def parse_steps(container: str, lines: Iterable[str]) -> list[StepResult]:
    """A ``train`` workload's steps, as the device ended them (pure)."""
    return [
        StepResult(container, int(r["step"]), float(r["launched"]), float(r["t"]))
        for r in _records(lines)
        if r.get("event") == WorkloadEvent.STEP
    ]


def _records(lines: Iterable[str]) -> list[dict[str, Any]]:
    # A line cut short by a container's end is left out.
    return [json.loads(line) for line in lines if line.strip().endswith("}")]


def _maybe(value: Any) -> float | None:
    return None if value is None else float(value)


class Scenario:
    """Launch a set of workload containers on a private engine and collect their results."""

    def __init__(
        self,
        name: str,
        client: Any,
        gpusim_dir: Path,
        log_dir: Path,
        specs: list[WorkloadSpec],
        start_delay: float = 1.0,
    ) -> None:
        self.name = name
        self.client = client
        self.gpusim_dir = gpusim_dir
        self.log_dir = log_dir / name
        self.specs = specs
        self.start_delay = start_delay
        self.containers: list[Any] = []
        self.released_at = 0.0

    def start(self, concurrently: int = 1) -> None:
        """Start every container; ``concurrently`` > 1 starts that many at a time (a run of
        ten containers then needs a shorter lead-in: each start takes ~0.5 s on 2 cores)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.released_at = time.time() + self.start_delay
        mounts = {
            str(self.gpusim_dir): {"bind": str(self.gpusim_dir), "mode": "rw"},
            str(self.log_dir): {"bind": str(self.log_dir), "mode": "rw"},
        }
        env = {"GPUSIM_SOCKET": str(self.gpusim_dir / "gpusim.sock")}
        every = []
        for spec in self.specs:
            log_path = self.log_dir / f"{spec.name}.jsonl"
            log_path.unlink(missing_ok=True)
            kwargs = python_container_kwargs(
                spec.workload_args(log_path, self.released_at),
                labels=spec.labels(self.name),
                extra_mounts=mounts,
                environment=env,
                name=spec.name,
            )
            if spec.host_network:
                kwargs["network_mode"] = "host"  # its /metrics on the host's loopback
            every.append(kwargs)
        if concurrently <= 1:
            for kwargs in every:
                self.containers.append(self.client.containers.run(**kwargs))
            return
        with ThreadPoolExecutor(concurrently) as pool:
            futures = [pool.submit(self.client.containers.run, **kwargs) for kwargs in every]
        # Every container that did start is kept (``remove`` removes it) before a failure
        # is raised; ``result`` keeps the specs' order.
        self.containers = [f.result() for f in futures if f.exception() is None]
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        if errors:
            raise errors[0]

    def running(self) -> int:
        count = 0
        for container in self.containers:
            container.reload()
            count += container.status in ("running", "paused", "created")
        return count

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.running():
            raise TimeoutError(f"scenario {self.name}: containers still running after {timeout}s")

    def result(self) -> ScenarioResult:
        tasks: list[TaskResult] = []
        requests: list[RequestResult] = []
        steps: list[StepResult] = []
        errors: list[str] = []
        for spec, container in zip(self.specs, self.containers, strict=True):
            deadline = labels.parse_duration(spec.deadline) if spec.deadline else None
            path = self.log_dir / f"{spec.name}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            tasks += parse_workload_log(spec.name, lines, deadline)
            requests += parse_requests(spec.name, lines, deadline)
            steps += parse_steps(spec.name, lines)
            container.reload()
            code = container.attrs["State"]["ExitCode"]
            if code != 0:
                errors.append(f"{spec.name} exited {code}: {container.logs(tail=5).decode()}")
        tasks.sort(key=lambda t: (t.start, t.container))
        return ScenarioResult(
            self.name,
            self.released_at,
            tuple(tasks),
            tuple(errors),
            tuple(sorted(requests, key=lambda r: r.arrival)),
            tuple(sorted(steps, key=lambda s: s.end)),
        )

    def remove(self) -> None:
        for container in self.containers:
            try:
                container.remove(force=True)
            except Exception:  # already gone
                pass
        self.containers = []


def run_to_end(
    node: Any,
    name: str,
    specs: list[WorkloadSpec],
    start_delay: float,
    timeout: float,
    concurrently: int = 1,
) -> ScenarioResult:
    """Run a scenario on a ``NodeStack`` to its end, its containers removed after; raises
    RuntimeError when a workload failed. ``concurrently``: containers started at a time."""
    assert node.gpusim is not None
    client = node.client()
    scenario = Scenario(name, client, node.gpusim.dir, node.base_dir / "logs", specs, start_delay)
    try:
        scenario.start(concurrently)
        scenario.wait(timeout)
        result = scenario.result()
    finally:
        scenario.remove()
        client.close()
    if result.errors:
        raise RuntimeError(f"{name}: " + "; ".join(result.errors))
    return result
