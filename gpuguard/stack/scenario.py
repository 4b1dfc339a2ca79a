"""Paper B's scenario: several containers run the matmul workload, all starting together.

Shared by the demo and the benchmarks: launch workload containers on gpusim, wait for them,
and read their own JSON-lines logs (the ground truth) into per-task results.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard import labels
from gpuguard.stack.images import python_container_kwargs

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

    def labels(self, scenario: str) -> dict[str, str]:
        out = {SCENARIO_LABEL: scenario}
        if self.deadline is not None:
            out[labels.DEADLINE] = self.deadline
        if self.managed:
            out[labels.MANAGED] = "true"
        return out

    def workload_args(self, log_path: Path, start_at: float) -> list[str]:
        args = ["gpuguard.gpusim.workload", "--size", str(self.size), "--repeat", str(self.repeat)]
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

    @property
    def run_s(self) -> float:
        return self.end - self.start

    @property
    def met_deadline(self) -> bool | None:
        return None if self.deadline_s is None else self.run_s <= self.deadline_s


@dataclass(frozen=True)
class ScenarioResult:
    """All tasks of one scenario run, and the figures paper B reports."""

    name: str
    released_at: float
    tasks: tuple[TaskResult, ...]
    errors: tuple[str, ...] = field(default=())

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
        judged = [t.met_deadline for t in self.tasks if t.met_deadline is not None]
        return sum(judged) / len(judged) if judged else None


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
            )
        )
    return tasks


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

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.released_at = time.time() + self.start_delay
        mounts = {
            str(self.gpusim_dir): {"bind": str(self.gpusim_dir), "mode": "rw"},
            str(self.log_dir): {"bind": str(self.log_dir), "mode": "rw"},
        }
        env = {"GPUSIM_SOCKET": str(self.gpusim_dir / "gpusim.sock")}
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
            self.containers.append(self.client.containers.run(**kwargs))

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
        errors: list[str] = []
        for spec, container in zip(self.specs, self.containers, strict=True):
            deadline = labels.parse_duration(spec.deadline) if spec.deadline else None
            path = self.log_dir / f"{spec.name}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            tasks += parse_workload_log(spec.name, lines, deadline)
            container.reload()
            code = container.attrs["State"]["ExitCode"]
            if code != 0:
                errors.append(f"{spec.name} exited {code}: {container.logs(tail=5).decode()}")
        tasks.sort(key=lambda t: (t.start, t.container))
        return ScenarioResult(self.name, self.released_at, tuple(tasks), tuple(errors))

    def remove(self) -> None:
        for container in self.containers:
            try:
                container.remove(force=True)
            except Exception:  # already gone
                pass
        self.containers = []
