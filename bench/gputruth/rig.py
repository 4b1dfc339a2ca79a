"""The device under test: NVML and CUDA on a real GPU, or gpusim when there is none.

The kit measures gpuguard's own code paths (the exporter's NVML or gpusim backend, its
tracker, the ``gpuguard.gpusim.workload`` programs), so a rig is that backend plus the way
to start a workload on the same device. Workloads run as host processes: the GPU machines
this kit is for have no Docker, and the point is the GPU side.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard.exporter.backends.base import GpuBackend
from gpuguard.exporter.errors import BackendError
from gpuguard.exporter.model import GpuSample

WORKLOAD = [sys.executable, "-m", "gpuguard.gpusim.workload"]


@dataclass
class Rig:
    """One device and how to run workloads on it."""

    backend: GpuBackend
    kind: str  # "nvml" (a real GPU) or "gpusim"
    gpu_name: str
    workload_flags: list[str]  # --backend ... (and --socket for gpusim)
    time_scale: float = 1.0
    service: Any = None  # the gpusim daemon the kit started, if any
    notes: list[str] = field(default_factory=list)

    def workload(self, kind: str, *args: str) -> list[str]:
        return [*WORKLOAD, kind, *self.workload_flags, *args]

    def start(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        """A workload as a host process; its stderr goes next to its log."""
        with open(log.with_suffix(".err"), "wb") as err:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=err)

    def close(self) -> None:
        self.backend.close()
        if self.service is not None:
            self.service.stop()


def open_rig(want: str, workdir: Path, time_scale: float) -> Rig:
    """``want``: ``nvml``, ``gpusim`` or ``auto`` (NVML with a device, else gpusim)."""
    if want in ("nvml", "auto"):
        try:
            return _nvml_rig()
        except BackendError as exc:
            if want == "nvml":
                raise
            note = f"no NVML device ({exc}): running on gpusim"
    else:
        note = "gpusim asked for"
    rig = _gpusim_rig(workdir, time_scale)
    rig.notes.append(note)
    return rig


def _nvml_rig() -> Rig:
    from gpuguard.exporter.backends.nvml import NvmlBackend

    backend = NvmlBackend()
    sample = backend.sample()
    if not sample.devices:
        backend.close()
        raise BackendError("NVML sees no device")
    return Rig(backend, "nvml", sample.devices[0].name, ["--backend", "cuda"])


def _gpusim_rig(workdir: Path, time_scale: float) -> Rig:
    from gpuguard.demo.stack.gpusim import GpusimService  # the harness: only without a GPU
    from gpuguard.exporter.backends.gpusim import GpusimBackend

    service = GpusimService(workdir / "gpusim", {"time_scale": time_scale}).start()
    backend = GpusimBackend(service.socket)
    name = backend.sample().devices[0].name
    flags = ["--backend", "sim", "--socket", str(service.socket)]
    return Rig(backend, "gpusim", name, flags, time_scale=time_scale, service=service)


class Sampler:
    """Samples the backend every ``period_s`` in a thread; keeps (wall time, sample)."""

    def __init__(self, backend: GpuBackend, period_s: float) -> None:
        self.backend = backend
        self.period_s = period_s
        self.samples: list[GpuSample] = []
        self.costs_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            began = time.perf_counter()
            try:
                sample = self.backend.sample()
            except BackendError:
                sample = None
            self.costs_s.append(time.perf_counter() - began)
            if sample is not None:
                self.samples.append(sample)
            next_tick += self.period_s
            self._stop.wait(max(0.0, next_tick - time.monotonic()))


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def pair_by_overlap(
    truth: list[tuple[float, float]], seen: list[tuple[float, float]]
) -> dict[int, int]:
    """Each true interval (index) with the seen one (index) that overlaps it most, one to
    one, in the order of ``truth``; an interval nothing overlaps has no pair."""
    paired: dict[int, int] = {}
    taken: set[int] = set()
    for t, (start, end) in enumerate(truth):
        best, most = None, 0.0
        for i, (s, e) in enumerate(seen):
            overlap = min(end, e) - max(start, s)
            if i not in taken and overlap > most:
                best, most = i, overlap
        if best is not None:
            paired[t] = best
            taken.add(best)
    return paired


def read_log(path: Path) -> list[dict[str, Any]]:
    import json

    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
