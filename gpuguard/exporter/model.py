"""Small frozen snapshots passed between the exporter's stages (docs/interfaces.md §2)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

from gpuguard.contract import PriorityClass, TaskMode
from gpuguard.inflight import InflightDeclaration
from gpuguard.slo import SloDeclaration

# "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "MIG 1g.10gb" (a MIG device's NVML name), "sim0 MIG 3g.40gb"
_MIG_NAME = re.compile(r"(?:^|\s)MIG\s+(\S+)\s*$")


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on one device, as the GPU reports it (host PID)."""

    pid: int
    used_memory_bytes: int | None  # NVML cannot always tell (usedGpuMemory None)


@dataclass(frozen=True, slots=True)
class ProcessUtilization:
    """One per-process utilization sample (``nvmlDeviceGetProcessUtilization``)."""

    pid: int
    timestamp_us: int
    sm_ratio: float
    mem_ratio: float
    #: an earlier sample standing in until the next is due (``gpuguard/exporter/samples.py``)
    held: bool = False
    #: where in its period the activity began (it opens a run) or ended (it stops there)
    began_us: int | None = None
    ended_us: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One device (a whole GPU, or a MIG device when ``mig_index`` is set)."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_ratio: float | None
    processes: tuple[GpuProcess, ...] = ()
    process_samples: tuple[ProcessUtilization, ...] = ()
    mig_index: int | None = None
    #: the MIG GPU instance id (NVML's, dcgm-exporter's GPU_I_ID); not the MIG device index
    gpu_instance_id: int | None = None
    #: how often its per-process samples come, as learnt from them; None: not learnt yet
    sample_period_s: float | None = None

    @property
    def mig_profile(self) -> str | None:
        """A MIG device's profile (``1g.10gb``, dcgm-exporter's GPU_I_PROFILE): NVML and
        gpusim both name MIG devices ``<GPU name> MIG <profile>``."""
        if self.mig_index is None:
            return None
        match = _MIG_NAME.search(self.name)
        return match.group(1) if match else None

    @property
    def key(self) -> str:
        """The ``gpu`` label: the index, or ``<gpu>:<mig>`` like NVIDIA_VISIBLE_DEVICES."""
        if self.mig_index is None:
            return str(self.index)
        return f"{self.index}:{self.mig_index}"


@dataclass(frozen=True, slots=True)
class GpuSample:
    """Everything one poll learned from the GPU backend."""

    timestamp: float  # wall clock (seconds) when the sample was taken
    devices: tuple[DeviceSample, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """What the exporter keeps about one container (from inspect + labels)."""

    id: str
    name: str
    image: str
    state: str  # created, running, paused, exited, ...
    managed: bool = False
    deadline_s: float | None = None
    deadline_error: str | None = None
    gpus: tuple[str, ...] = ()
    role: str | None = None
    command: str = ""
    created: float = 0.0
    task_mode: TaskMode | None = None  # gpuguard.task; None: the exporter's default
    task_mode_error: str | None = None
    class_label: PriorityClass | None = None  # gpuguard.class as given (valid only)
    class_error: str | None = None
    slo: SloDeclaration | None = None  # gpuguard.slo.* (gpuguard/slo.py)
    slo_errors: tuple[tuple[str, str], ...] = ()  # (label, why) for each unusable one
    inflight: InflightDeclaration | None = None  # gpuguard.inflight.* (gpuguard/inflight.py)
    inflight_errors: tuple[tuple[str, str], ...] = ()  # (label, why) for each unusable one
    # Kubernetes identity (containerd source, CRI labels; gpuguard/exporter/kube.py); None elsewhere
    pod_namespace: str | None = None
    pod_name: str | None = None
    pod_uid: str | None = None
    #: (label, why) for each claim the operator's trust policy rejected (gpuguard/exporter/trust.py)
    claims_rejected: tuple[tuple[str, str], ...] = ()
    #: whether its tasks' deadlines count toward the node record and the alerts that mark
    #: the node: the trust policy granted its deadline and class as given, and lets its
    #: misses mark the node (gpuguard/exporter/trust.py); otherwise its misses are its own
    deadline_vouched: bool = True

    @property
    def paused(self) -> bool:
        return self.state == "paused"

    @property
    def priority_class(self) -> PriorityClass:
        """The label's class, else real-time with a deadline, else normal."""
        if self.class_label is not None:
            return self.class_label
        return PriorityClass.NORMAL if self.deadline_s is None else PriorityClass.REAL_TIME

    @property
    def short_id(self) -> str:
        return self.id[:12]


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """Which container a host process belongs to, and when the process started."""

    container_id: str | None
    start_ticks: int  # /proc/<pid>/stat field 22 (clock ticks since boot)


class AttributedProcess(NamedTuple):
    """A GPU process joined with its container (the join's output, one per device+pid).

    A named tuple, not a frozen dataclass: the join makes one per GPU process per poll, and
    a frozen dataclass takes four times as long to make (bench/exporter_cost.py).
    """

    gpu: str
    gpu_index: int
    mig_index: int | None
    pid: int
    start_ticks: int
    container_id: str | None
    used_memory_bytes: int | None
    sm_ratio: float | None  # None: no utilization sample this poll
    active_at: float | None = None  # wall time of its newest SM activity
    held: bool = False  # its SM share is an earlier sample standing in (nothing new)
    active_since: float | None = None  # where this poll's first run of activity began
    stopped: bool = False  # its newest sample shows its kernels stopping (at active_at)
    #: its SM share this poll comes only from samples whose period it began or ended in
    #: (part of the period idle): no measure of what it takes while it computes
    edge: bool = False


@dataclass(frozen=True, slots=True)
class ContainerGpuUsage:
    """Per (container, gpu) aggregates for the metrics."""

    container_id: str
    gpu: str
    memory_bytes: int
    sm_ratio: float
    processes: int


@dataclass(frozen=True, slots=True)
class Joined:
    """The join of one GPU sample with the container index."""

    processes: tuple[AttributedProcess, ...]
    usage: tuple[ContainerGpuUsage, ...]
    unattributed: dict[str, int] = field(default_factory=dict)  # gpu -> count
    device_sm_ratio: dict[str, float] = field(default_factory=dict)  # gpu -> summed SM share
    #: devices whose activity NVML cannot show this poll (no utilization: MIG devices)
    unsampled: frozenset[str] = frozenset()
