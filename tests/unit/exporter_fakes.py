"""Small real-shaped inputs for the exporter's unit tests: procfs trees, samples, containers."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from gpuguard.contract import PriorityClass, TaskMode
from gpuguard.exporter.cgroup import ProcReader
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.model import (
    ContainerInfo,
    DeviceSample,
    GpuProcess,
    GpuSample,
    ProcessUtilization,
)
from gpuguard.exporter.poller import Poller
from gpuguard.exporter.tracker import Tracker

GIB = 2**30
#: the pod labels of a container outside Kubernetes: empty (absent to Prometheus)
NO_POD = {"namespace": "", "pod": ""}


def cid(n: int) -> str:
    """A 64-hex container id whose first 12 digits differ from other n's."""
    return (f"{n:x}c" * 64)[:64]


class FakeProcfs:
    """A directory laid out like /proc with ``<pid>/stat`` and ``<pid>/cgroup``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(self, pid: int, container_id: str | None, ticks: int, comm: str = "python3") -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        # fields 3..52 after "(comm)"; field 22 (starttime) is the 20th of them
        after = ["S", "1", "1", "1", "0", "-1", "4194560", "0", "0", "0", "0", "0", "0", "0",
                 "0", "20", "0", "1", "0", str(ticks), "0", "0"]  # fmt: skip
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(after)}\n")
        path = f"/system.slice/docker-{container_id}.scope" if container_id else "/user.slice"
        (d / "cgroup").write_text(f"0::{path}\n")

    def remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid), ignore_errors=True)


def container(
    n: int,
    name: str | None = None,
    deadline_s: float | None = None,
    state: str = "running",
    managed: bool = True,
    deadline_error: str | None = None,
    task_mode: TaskMode | None = None,
    class_label: PriorityClass | None = None,
) -> ContainerInfo:
    return ContainerInfo(
        id=cid(n),
        name=name or f"rt-{n}",
        image="gpuguard/base:local",
        state=state,
        managed=managed,
        deadline_s=deadline_s,
        deadline_error=deadline_error,
        gpus=("0",),
        task_mode=task_mode,
        class_label=class_label,
    )


def sample(
    t: float,
    procs: Mapping[int, int | None] | None = None,
    sm: Mapping[int, float] | None = None,
    gpu: int = 0,
    sm_at: Mapping[int, float] | None = None,
) -> GpuSample:
    """One device with ``procs`` (pid -> used bytes) and SM samples (pid -> ratio), each
    sample stamped ``t`` unless ``sm_at`` gives its time (a kernel that ended before ``t``).
    """
    procs = procs or {}
    sm = sm or {}
    sm_at = sm_at or {}
    return GpuSample(
        timestamp=t,
        devices=(
            DeviceSample(
                index=gpu,
                uuid=f"GPU-{gpu:08d}",
                name="gpusim",
                memory_total_bytes=24 * GIB,
                memory_used_bytes=sum(m or 0 for m in procs.values()),
                utilization_ratio=1.0 if any(v > 0 for v in sm.values()) else 0.0,
                processes=tuple(GpuProcess(pid, m) for pid, m in procs.items()),
                process_samples=tuple(
                    ProcessUtilization(pid, int(sm_at.get(pid, t) * 1e6), ratio, 0.0)
                    for pid, ratio in sm.items()
                ),
            ),
        ),
    )


class ListBackend:
    """A GPU backend that returns prepared samples, or raises a prepared error."""

    name = "test"

    def __init__(self) -> None:
        self.next: GpuSample | Exception = GpuSample(0.0)

    def sample(self) -> GpuSample:
        if isinstance(self.next, Exception):
            raise self.next
        return self.next

    def close(self) -> None:
        pass


class StaticContainers:
    """A container source holding a fixed mapping (the poller's ContainerSource)."""

    ENGINE = "docker"

    def __init__(self, *infos: ContainerInfo) -> None:
        self.connected = True
        self.errors = 0
        self.resync_duration_s = 0.001
        self.last_error: str | None = None
        self.set(*infos)

    def set(self, *infos: ContainerInfo) -> None:
        self._map = MappingProxyType({i.id: i for i in infos})

    def snapshot(self) -> Mapping[str, ContainerInfo]:
        return self._map


def three_container_poller(
    proc_root: Path, names: tuple[str, str, str] = ("rt-1", "rt-2", "bad")
) -> tuple[ListBackend, StaticContainers, Poller]:
    """A poller on node-a over three containers named ``names``: 1 with a 9 s deadline, 2
    paused, 3 unmanaged with an invalid deadline; PIDs 100 and 200 run in 1 and 2, 300 in none.
    """
    procfs = FakeProcfs(proc_root)
    procfs.add(100, cid(1), 500)
    procfs.add(200, cid(2), 600)
    procfs.add(300, None, 700)
    backend = ListBackend()
    containers = StaticContainers(
        container(1, names[0], deadline_s=9.0),
        container(2, names[1], state="paused"),
        container(3, names[2], deadline_error="invalid duration 'soon'", managed=False),
    )
    events = EventLog(100)
    poller = Poller(
        backend, containers, ProcReader(procfs.root), Tracker(events), events, "node-a", 0.1
    )
    return backend, containers, poller
