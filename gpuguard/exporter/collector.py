"""The exporter's /metrics: every series from the last poll, built anew on every scrape.

It never calls NVML or Docker: it reads the newest ``PollSnapshot``. ``build_rows`` makes
the series of one scrape afresh, so a removed container leaves no series; ``TextRenderer``
writes them in Prometheus' text format. prometheus_client's custom-collector way of doing
the same (``GpuguardCollector``: ``describe()`` and fresh metric families in ``collect()``)
is the tests' reference for the exposition, in ``gpuguard/demo/stack/reference_collector.py``.

Sample exposition (names and labels: docs/interfaces.md §5; the render below writes labels
in this order)::

    # HELP gpuguard_gpu_utilization_ratio Share of time any kernel ran on the GPU (NVML meaning).
    # TYPE gpuguard_gpu_utilization_ratio gauge
    gpuguard_gpu_utilization_ratio{node="host-a",gpu="0"} 1.0
    # HELP gpuguard_container_paused 1 if the container is paused.
    # TYPE gpuguard_container_paused gauge
    gpuguard_container_paused{node="a",namespace="",pod="",container="rt",container_id="3f2a9c"} 0.0
    # HELP gpuguard_container_deadline_hits_total Tasks that ended within the deadline.
    # TYPE gpuguard_container_deadline_hits_total counter
    gpuguard_container_deadline_hits_total{node="a",namespace="ml",pod="w-0",container="i",...} 7.0
    # HELP gpuguard_container_gpu_processes GPU processes of the container.
    # TYPE gpuguard_container_gpu_processes gauge
    gpuguard_container_gpu_processes{node="a",gpu="0",namespace="",pod="",container="r",...} 1.0
    # HELP gpuguard_gpu_state 1 if the GPU can take new real-time work (deadlines met, ...), else 0.
    # TYPE gpuguard_gpu_state gauge
    gpuguard_gpu_state{node="host-a",gpu="0"} 1.0
    # HELP gpuguard_gpu_float_time_seconds Sum of the float times of the GPU's tasks in the ...
    # TYPE gpuguard_gpu_float_time_seconds gauge
    gpuguard_gpu_float_time_seconds{node="host-a",gpu="0"} +Inf
    # HELP gpuguard_exporter_collector_success Whether the source answered in the last poll.
    # TYPE gpuguard_exporter_collector_success gauge
    gpuguard_exporter_collector_success{node="host-a",source="gpu"} 1.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial

from gpuguard import __version__
from gpuguard.contract import StateReason, TaskMode
from gpuguard.exporter.activity import source_of
from gpuguard.exporter.model import ContainerInfo, DeviceSample
from gpuguard.exporter.poller import SOURCES, PollSnapshot
from gpuguard.exporter.tracker import PHASES, RUN_SECONDS_BUCKETS, ContainerStats, TaskView
from gpuguard.labels import CLASS, TASK
from gpuguard.slo import SloDeclaration

# A container's identity on every per-container series: on a Kubernetes node (containerd
# source) `namespace` and `pod` name its pod and `container` its name in the pod spec, as
# cAdvisor and kube-state-metrics name them; elsewhere both are empty, which Prometheus
# reads as absent, so each family keeps one label set on every kind of host.
_C = ("node", "namespace", "pod", "container", "container_id")
# Every per-GPU series also names the GPU as dcgm-exporter does: UUID (the physical GPU's)
# and GPU_I_ID (the MIG instance; empty off MIG), so its series join with gpuguard's on
# (UUID, GPU_I_ID) without gpuguard_gpu_info (docs/operator-reference.md, "Beside dcgm-exporter").
_GPU_ID = ("UUID", "GPU_I_ID")
_CG = ("node", "gpu", "namespace", "pod", "container", "container_id", *_GPU_ID)
_G = ("node", "gpu", *_GPU_ID)
# `uuid`: the device's own (MIG-... for a MIG device); `UUID`: its physical GPU's, with the MIG
# instance in GPU_I_ID and GPU_I_PROFILE (empty off MIG), as dcgm-exporter names them: the
# join key to its series (docs/operator-reference.md, "Beside dcgm-exporter").
_GPU_INFO_LABELS = ("node", "gpu", "uuid", "name", "UUID", "GPU_I_ID", "GPU_I_PROFILE")
_N = ("node",)
_PHASE_LABELS = (*_CG, "phase")
_BOUNDARY_LABELS = (*_CG, "boundary")
_INFO_LABELS = (*_C, "image")
_POD_INFO_LABELS = (*_C, "pod_uid")
_TASK_INFO_LABELS = (*_C, "task_mode", "class")
_LABEL_INVALID_LABELS = (*_C, "label")
_SLO_INFO_LABELS = (*_C, "metric")
_SOURCE_LABELS = (*_C, "source", "reason")
# `bound`, not `le`: promtool refuses `le` on a gauge; the rules copy it into `le`.
_SLO_BUCKET_LABELS = (*_C, "metric", "bound")

#: Every family of /metrics: name -> (type, help, label names), in exposition order.
SPECS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "gpuguard_gpu_info": (
        "gauge",
        "GPU identity (always 1); UUID, GPU_I_ID and GPU_I_PROFILE as dcgm-exporter labels "
        "the same GPU or MIG instance.",
        _GPU_INFO_LABELS,
    ),
    "gpuguard_gpu_utilization_ratio": (
        "gauge",
        "Share of time any kernel ran on the GPU (NVML meaning).",
        _G,
    ),
    "gpuguard_gpu_memory_used_bytes": ("gauge", "GPU memory in use.", _G),
    "gpuguard_gpu_memory_total_bytes": ("gauge", "GPU memory in total.", _G),
    "gpuguard_container_info": ("gauge", "Container identity (always 1).", _INFO_LABELS),
    "gpuguard_container_pod_info": (
        "gauge",
        "Kubernetes pod of a container created by the CRI (always 1; containerd source).",
        _POD_INFO_LABELS,
    ),
    "gpuguard_container_managed": ("gauge", "1 if gpuguard may pause the container.", _C),
    "gpuguard_container_paused": ("gauge", "1 if the container is paused.", _C),
    "gpuguard_container_deadline_seconds": ("gauge", "Relative deadline of each GPU task.", _C),
    "gpuguard_container_deadline_invalid": (
        "gauge",
        "1 if the gpuguard.deadline label cannot be parsed.",
        _C,
    ),
    "gpuguard_container_task_info": (
        "gauge",
        "What a GPU task of the container is (task_mode) and how admission treats it (class).",
        _TASK_INFO_LABELS,
    ),
    "gpuguard_container_label_invalid": (
        "gauge",
        "1 for each gpuguard.task, gpuguard.class or gpuguard.slo.* label that cannot be used "
        "(ignored).",
        _LABEL_INVALID_LABELS,
    ),
    "gpuguard_container_claim_rejected": (
        "gauge",
        "1 for each gpuguard.class, gpuguard.deadline, gpuguard.slo.metric or gpuguard.role "
        "claim the trust policy in force rejected (the container is treated as it allows).",
        _LABEL_INVALID_LABELS,
    ),
    "gpuguard_container_deadline_vouched": (
        "gauge",
        "1 if the container's deadline counts toward the node record and the alerts that "
        "mark the node (the trust policy granted it as claimed); 0 if its misses are its own.",
        _C,
    ),
    # the tenant's own latency objective (gpuguard/slo.py), joined by the SLO rules
    "gpuguard_container_slo_info": (
        "gauge",
        "The container's latency SLO is measured by this histogram of its own (always 1; "
        "metric: its name with : written _).",
        _SLO_INFO_LABELS,
    ),
    "gpuguard_container_slo_target_seconds": (
        "gauge",
        "Latency a request must stay within to meet the container's SLO.",
        _C,
    ),
    "gpuguard_container_slo_objective_ratio": (
        "gauge",
        "Share of the container's requests that must meet the SLO's target.",
        _C,
    ),
    "gpuguard_container_slo_bucket_info": (
        "gauge",
        "1 for each way a histogram may spell the bucket bound that is the SLO's target.",
        _SLO_BUCKET_LABELS,
    ),
    "gpuguard_container_demand_sm_ratio": (
        "gauge",
        "Expected SM share of the container's tasks while computing (EWMA of finished tasks).",
        _C,
    ),
    "gpuguard_container_gpu_memory_bytes": (
        "gauge",
        "GPU memory used by the container's processes.",
        _CG,
    ),
    "gpuguard_container_gpu_sm_utilization_ratio": (
        "gauge",
        "SM share of the container's processes (per-process samples).",
        _CG,
    ),
    "gpuguard_container_gpu_processes": ("gauge", "GPU processes of the container.", _CG),
    "gpuguard_container_task_phase": (
        "gauge",
        "Phase of the container's oldest running task on the GPU.",
        _PHASE_LABELS,
    ),
    "gpuguard_container_task_boundary": (
        "gauge",
        "1 for what is known of the boundaries of the container's oldest running task on the "
        "GPU: exact (judged against the deadline), open (a burst, judged when it ends), merged "
        "(busy time that may hold several tasks, never judged).",
        _BOUNDARY_LABELS,
    ),
    "gpuguard_container_task_elapsed_seconds": (
        "gauge",
        "Run time so far of the container's oldest running task on the GPU.",
        _CG,
    ),
    "gpuguard_container_task_slack_seconds": (
        "gauge",
        "Deadline minus elapsed time of the oldest running task (negative: overrun).",
        _CG,
    ),
    "gpuguard_container_tasks_finished": (
        "counter",
        "GPU tasks of the container that ended, with exact boundaries (the tasks judged).",
        _C,
    ),
    "gpuguard_container_deadline_hits": ("counter", "Tasks that ended within the deadline.", _C),
    "gpuguard_container_deadline_misses": (
        "counter",
        "Tasks that overran the container's deadline.",
        _C,
    ),
    "gpuguard_container_busy_periods": (
        "counter",
        "Merged bursts of the container: busy time that may hold several tasks, never judged.",
        _C,
    ),
    "gpuguard_container_busy_seconds": ("counter", "Run time of its merged bursts.", _C),
    "gpuguard_container_launches": (
        "counter",
        "Kernel launches the launch probe saw (CUDA driver API calls; launch source only).",
        _C,
    ),
    "gpuguard_container_copies": ("counter", "Asynchronous copies the launch probe saw.", _C),
    "gpuguard_container_launch_tasks": (
        "counter",
        "Tasks the launch probe saw end: first launch to the return of the last wait.",
        _C,
    ),
    "gpuguard_container_launch_busy_seconds": (
        "counter",
        "Time in tasks the launch probe saw, the running one included.",
        _C,
    ),
    "gpuguard_container_gpu_busy": (
        "gauge",
        "1 while the launch probe sees the container's GPU work unfinished.",
        _C,
    ),
    "gpuguard_container_inflight_requests": (
        "gauge",
        "Requests in flight by the server's own gauge (gpuguard.inflight.metric), read by "
        "the exporter every 100 ms.",
        _C,
    ),
    "gpuguard_container_activity_source": (
        "gauge",
        "How the exporter sees the container's GPU work (always 1): launch, gauge or nvml, "
        "and why not launch (reason; empty for launch).",
        _SOURCE_LABELS,
    ),
    "gpuguard_container_paused_seconds": (
        "counter",
        "Time the container spent paused (a best-effort one: frozen), at poll resolution.",
        _C,
    ),
    "gpuguard_container_resumes": (
        "counter",
        "Times the container was resumed (a best-effort one: thawed).",
        _C,
    ),
    "gpuguard_task_run_seconds": (
        "histogram",
        "Run time of finished GPU tasks with exact boundaries.",
        _G,
    ),
    "gpuguard_tasks_waiting": ("gauge", "Running tasks whose container is paused.", _G),
    "gpuguard_unattributed_gpu_processes": ("gauge", "GPU processes in no known container.", _G),
    # paper C's node record (gpuguard/exporter/record.py)
    "gpuguard_node_state": (
        "gauge",
        "1 if the node can take new real-time work (a GPU whose deadlines are met and cores "
        "and memory not full), else 0.",
        _N,
    ),
    "gpuguard_node_float_time_seconds": (
        "gauge",
        "Sum of the float times of the node's tasks in the record window (+Inf: none).",
        ("node",),
    ),
    "gpuguard_node_free_memory_bytes": ("gauge", "Free GPU memory of the node.", ("node",)),
    "gpuguard_gpu_state": (
        "gauge",
        "1 if the GPU can take new real-time work (deadlines met, cores and memory not full), "
        "else 0.",
        _G,
    ),
    "gpuguard_gpu_state_reason": (
        "gauge",
        "1 for each reason that puts the GPU in state 0.",
        (*_G, "reason"),
    ),
    "gpuguard_gpu_float_time_seconds": (
        "gauge",
        "Sum of the float times of the GPU's tasks in the record window (+Inf: none).",
        _G,
    ),
    "gpuguard_gpu_free_memory_bytes": ("gauge", "GPU memory not in use.", _G),
    "gpuguard_gpu_busy_ratio": ("gauge", "Share of the busy window a kernel ran.", _G),
    "gpuguard_gpu_running_tasks": ("gauge", "GPU tasks running or waiting on the GPU.", _G),
    "gpuguard_gpu_deadline_tasks": (
        "gauge",
        "Tasks with a deadline counted in the GPU's float time.",
        _G,
    ),
    "gpuguard_gpu_recent_misses": (
        "gauge",
        "Tasks on the GPU that missed their deadline in the record window.",
        _G,
    ),
    "gpuguard_gpu_min_slack_seconds": (
        "gauge",
        "Least slack of a running task with a deadline on the GPU.",
        _G,
    ),
    "gpuguard_exporter_polls": ("counter", "Polls done.", ("node",)),
    "gpuguard_exporter_poll_duration_seconds": ("gauge", "Wall time of the last poll.", ("node",)),
    "gpuguard_exporter_last_poll_timestamp_seconds": (
        "gauge",
        "Wall clock of the last poll.",
        ("node",),
    ),
    "gpuguard_exporter_collector_success": (
        "gauge",
        "Whether the source answered in the last poll.",
        ("node", "source"),
    ),
    "gpuguard_exporter_collector_duration_seconds": (
        "gauge",
        "Time the source took in the last poll.",
        ("node", "source"),
    ),
    "gpuguard_exporter_errors": ("counter", "Errors per source.", ("node", "source")),
    "gpuguard_exporter_build_info": (
        "gauge",
        "Exporter version and GPU backend (always 1).",
        ("node", "version", "backend"),
    ),
    "gpuguard_exporter_launch_probe_up": (
        "gauge",
        "1 if the launch probe is attached; reason says why not (docs/interfaces.md §5).",
        ("node", "reason"),
    ),
    "gpuguard_exporter_trust_policy_info": (
        "gauge",
        "The trust policy applied to containers' claims (always 1): default (built in, for a "
        "shared host), file (--trust.policy-file, named in file) or trust-all (--trust.all).",
        ("node", "policy", "file"),
    ),
}


class LabelSet:
    """Label values with their exposition text, made once per container and reused.

    The render's hot loop then only formats values: 20,000 series at 1,000 containers.
    """

    __slots__ = ("key", "text", "values")

    def __init__(self, names: tuple[str, ...], values: tuple[str, ...]) -> None:
        self.key = (id(names), values)  # names are the constant tuples of SPECS
        self.values = values
        self.text = ",".join(
            f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True)
        )


class LabelCache:
    """LabelSets by (label names, values), kept across scrapes while their series live.

    Containers come and go; after a scrape, once the cache holds more than twice what that
    scrape used (plus ``slack``), it keeps only what the scrape used. Memory stays about
    twice the live series, and the trim costs one pass over them each time the cache has
    doubled (amortised O(1) per new label set).
    """

    def __init__(self, slack: int = 256) -> None:
        self._sets: dict[tuple[int, tuple[str, ...]], LabelSet] = {}
        self._phases: dict[tuple[str, ...], tuple[LabelSet, ...]] = {}
        #: a container's labels by (names, the ContainerInfo's id, GPU, GPU ids): kept with
        #: the ContainerInfo itself, so an id reused by a new object is never mistaken for it
        self._of: dict[tuple[int, int, str, tuple[str, str]], tuple[ContainerInfo, LabelSet]]
        self._of = {}
        self._slack = slack

    def __len__(self) -> int:
        return len(self._sets) + len(self._phases) * len(PHASES)

    def of(
        self,
        names: tuple[str, ...],
        info: ContainerInfo,
        values: Callable[[], tuple[str, ...]],
        gpu: str = "",
        gpu_id: tuple[str, str] = ("", ""),
    ) -> LabelSet:
        """``get(names, values())`` for one container (on one GPU), without building and
        hashing its values again while its ContainerInfo is the same object."""
        key = (id(names), id(info), gpu, gpu_id)
        hit = self._of.get(key)
        if hit is not None and hit[0] is info:
            return hit[1]
        found = self.get(names, values())
        self._of[key] = (info, found)
        return found

    def get(self, names: tuple[str, ...], values: tuple[str, ...]) -> LabelSet:
        found = self._sets.get((id(names), values))
        if found is None:
            found = LabelSet(names, values)
            self._sets[found.key] = found
        return found

    def phases(self, values: tuple[str, ...]) -> tuple[LabelSet, ...]:
        """The ``phase`` label sets of one container on one GPU (``_CG``), in PHASES order."""
        found = self._phases.get(values)
        if found is None:
            found = tuple(LabelSet(_PHASE_LABELS, (*values, p)) for p in PHASES)
            self._phases[values] = found
        return found

    def retain(self, rows: Rows) -> None:
        """Forget label sets the scrape in ``rows`` did not use, once there are many."""
        used = sum(len(r) for r in rows.gauges.values()) + sum(
            len(r) for r in rows.histograms.values()
        )
        if len(self) <= 2 * used + self._slack:
            return
        phase_key = _PHASE_LABELS
        sets: dict[tuple[int, tuple[str, ...]], LabelSet] = {}
        phases: dict[tuple[str, ...], tuple[LabelSet, ...]] = {}
        for name, gauge_rows in rows.gauges.items():
            if SPECS[name][2] is phase_key:
                for label_set, _ in gauge_rows:
                    values = label_set.values[:-1]
                    if values in self._phases:
                        phases[values] = self._phases[values]
                continue
            for label_set, _ in gauge_rows:
                sets[label_set.key] = label_set
        for hist_rows in rows.histograms.values():
            for label_set, _, _ in hist_rows:
                sets[label_set.key] = label_set
        self._sets, self._phases = sets, phases
        self._of = {}  # rebuilt by the next scrape, from the label sets kept


Row = tuple[LabelSet, float]
HistRow = tuple[LabelSet, tuple[int, ...], float]  # labels, cumulative buckets, sum
#: the run-time histogram's bucket bounds as their ``le`` label values
BUCKET_BOUNDS = (*(str(b) for b in RUN_SECONDS_BUCKETS), "+Inf")


class Rows:
    """The series of one scrape, built once from a snapshot and rendered either way."""

    def __init__(self, cache: LabelCache) -> None:
        self.cache = cache
        self.gauges: dict[str, list[Row]] = {
            name: [] for name, spec in SPECS.items() if spec[0] != "histogram"
        }
        self.histograms: dict[str, list[HistRow]] = {
            name: [] for name, spec in SPECS.items() if spec[0] == "histogram"
        }

    def add(self, name: str, values: tuple[str, ...], value: float) -> None:
        self.gauges[name].append((self.cache.get(SPECS[name][2], values), value))


# Families that follow from the container index alone (with the node and the default task
# mode): the text renderer renders them again only when the index changes (it is a new
# mapping after every change), about a third of the series at 1,000 containers.
_IDENTITY_FAMILIES = (
    "gpuguard_container_info",
    "gpuguard_container_pod_info",
    "gpuguard_container_managed",
    "gpuguard_container_paused",
    "gpuguard_container_deadline_seconds",
    "gpuguard_container_deadline_invalid",
    "gpuguard_container_task_info",
    "gpuguard_container_label_invalid",
    "gpuguard_container_claim_rejected",
    "gpuguard_container_deadline_vouched",
    "gpuguard_container_slo_info",
    "gpuguard_container_slo_target_seconds",
    "gpuguard_container_slo_objective_ratio",
    "gpuguard_container_slo_bucket_info",
)


def build_rows(
    snap: PollSnapshot | None,
    cache: LabelCache | None = None,
    identity: Mapping[str, list[Row]] | None = None,
) -> Rows:
    """Every series for ``snap`` (none but the families' headers when there is no poll yet).

    ``identity``: the rows of ``_IDENTITY_FAMILIES`` for this snapshot's container index,
    made earlier by ``identity_rows``; built here when not given.
    """
    rows = Rows(cache if cache is not None else LabelCache())
    if snap is not None:
        _add_gpus(rows, snap)
        if identity is None:
            _add_identity(rows, snap)
        else:
            rows.gauges.update(identity)
        _add_containers(rows, snap)
        _add_activity(rows, snap)
        _add_tasks(rows, snap)
        _add_record(rows, snap)
        _add_exporter(rows, snap)
    rows.cache.retain(rows)
    return rows


class TextRenderer:
    """Prometheus text format straight from ``Rows``, for /metrics.

    prometheus_client's ``generate_latest`` takes about 200 ms for 1,000 containers here
    (20,000 series; ``bench/exporter_cost.py``), mostly building a dict per sample; this
    writes the same exposition (checked in tests against prometheus_client's, from
    ``gpuguard/demo/stack/reference_collector.py``) from label text made once per container, and
    keeps the text of ``_IDENTITY_FAMILIES`` while the container index stays the same.
    """

    def __init__(self) -> None:
        self.cache = LabelCache()
        # the container index (with node and default mode) the identity text was made from
        self._identity_of: tuple[Mapping[str, ContainerInfo], str, TaskMode] | None = None
        self._identity_rows: dict[str, list[Row]] = {}
        self._identity_text: dict[str, str] = {}

    def render_snapshot(self, snap: PollSnapshot | None) -> bytes:
        if snap is None:
            return self.render(build_rows(None, self.cache))
        of = (snap.containers, snap.node, snap.default_task_mode)
        known = self._identity_of
        if known is None or known[0] is not of[0] or known[1:] != of[1:]:
            made = Rows(self.cache)
            _add_identity(made, snap)
            self._identity_rows = {name: made.gauges[name] for name in _IDENTITY_FAMILIES}
            self._identity_text = {
                name: "".join(_lines(name, rows)) for name, rows in self._identity_rows.items()
            }
            self._identity_of = of
        rows = build_rows(snap, self.cache, self._identity_rows)
        return self.render(rows, self._identity_text)

    def render(self, rows: Rows, rendered: Mapping[str, str] | None = None) -> bytes:
        """The exposition of ``rows``; a family in ``rendered`` is taken as its text."""
        out: list[str] = []
        append = out.append
        for name, (kind, doc, _labels) in SPECS.items():
            sample_name = f"{name}_total" if kind == "counter" else name
            append(f"# HELP {sample_name} {_escape_help(doc)}\n# TYPE {sample_name} {kind}\n")
            if kind == "histogram":
                _histogram(out, name, rows.histograms[name])
            elif rendered is not None and name in rendered:
                append(rendered[name])
            else:
                out.extend(_lines(name, rows.gauges[name]))
        return "".join(out).encode()


def _lines(name: str, rows: list[Row]) -> list[str]:
    """The sample lines of one gauge or counter family."""
    sample_name = f"{name}_total" if SPECS[name][0] == "counter" else name
    out: list[str] = []
    append = out.append
    for label_set, value in rows:  # the hot loop: keep it flat
        number = f"{value}.0" if type(value) is int else repr(float(value))
        if number[-1] in "fn":  # inf, -inf, nan: the exposition spells them +Inf ...
            number = _special(value)
        append(f"{sample_name}{{{label_set.text}}} {number}\n")
    return out


def _histogram(out: list[str], name: str, rows: list[HistRow]) -> None:
    for label_set, buckets, total in rows:
        text = label_set.text
        for bound, count in zip(BUCKET_BOUNDS, buckets, strict=True):
            out.append(f'{name}_bucket{{le="{bound}",{text}}} {_value(count)}\n')
        out.append(f"{name}_count{{{text}}} {_value(buckets[-1])}\n")
        out.append(f"{name}_sum{{{text}}} {_value(total)}\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _special(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def _value(value: float) -> str:
    if type(value) is int:  # most series are counts and bytes: skip float formatting
        return f"{value}.0"
    return repr(float(value))


def gpu_ids(snap: PollSnapshot) -> dict[str, tuple[str, str]]:
    """gpu key -> (UUID, GPU_I_ID) of each device of the last sample (dcgm-exporter's names)."""
    devices = snap.sample.devices if snap.sample is not None else ()
    physical = {d.index: d.uuid for d in devices if d.mig_index is None}
    return {
        d.key: (
            physical.get(d.index, d.uuid),
            "" if d.gpu_instance_id is None else str(d.gpu_instance_id),
        )
        for d in devices
    }


_NO_ID = ("", "")


def _container(node: str, info: ContainerInfo) -> tuple[str, str, str, str, str]:
    """The values of ``_C`` (namespace and pod empty off Kubernetes)."""
    return (node, info.pod_namespace or "", info.pod_name or "", info.name, info.short_id)


def _container_gpu(
    node: str, gpu: str, info: ContainerInfo, gpu_id: tuple[str, str]
) -> tuple[str, ...]:
    """The values of ``_CG``."""
    ns, pod = info.pod_namespace or "", info.pod_name or ""
    return (node, gpu, ns, pod, info.name, info.short_id, *gpu_id)


def _gpu_info(node: str, d: DeviceSample, physical_uuid: str) -> tuple[str, ...]:
    instance = "" if d.gpu_instance_id is None else str(d.gpu_instance_id)
    return (node, d.key, d.uuid, d.name, physical_uuid, instance, d.mig_profile or "")


def _add_gpus(r: Rows, snap: PollSnapshot) -> None:
    node = snap.node
    devices = snap.sample.devices if snap.sample is not None else ()
    unattributed = snap.joined.unattributed if snap.joined is not None else {}
    physical = {d.index: d.uuid for d in devices if d.mig_index is None}
    # A GPU in MIG mode: its memory is its instances' memory, so only they report it and a
    # `sum` counts each byte once.
    partitioned = {d.index for d in devices if d.mig_index is not None}
    ids = gpu_ids(snap)
    for d in devices:
        gpu = (node, d.key, *ids[d.key])
        r.add("gpuguard_gpu_info", _gpu_info(node, d, physical.get(d.index, d.uuid)), 1)
        if d.utilization_ratio is not None:
            r.add("gpuguard_gpu_utilization_ratio", gpu, d.utilization_ratio)
        if d.mig_index is not None or d.index not in partitioned:
            r.add("gpuguard_gpu_memory_used_bytes", gpu, d.memory_used_bytes)
            r.add("gpuguard_gpu_memory_total_bytes", gpu, d.memory_total_bytes)
        r.add("gpuguard_unattributed_gpu_processes", gpu, unattributed.get(d.key, 0))
    empty = (0,) * len(BUCKET_BOUNDS)
    for gpu_key in sorted({d.key for d in devices} | set(snap.histograms)):
        h = snap.histograms.get(gpu_key)
        r.histograms["gpuguard_task_run_seconds"].append(
            (
                r.cache.get(_G, (node, gpu_key, *ids.get(gpu_key, _NO_ID))),
                h.buckets if h is not None else empty,
                h.total if h is not None else 0.0,
            )
        )


def _add_identity(r: Rows, snap: PollSnapshot) -> None:
    """The ``_IDENTITY_FAMILIES``: what each container is, from the container index alone."""
    node = snap.node
    g, cache = r.gauges, r.cache
    info_rows, managed, paused = (
        g["gpuguard_container_info"],
        g["gpuguard_container_managed"],
        g["gpuguard_container_paused"],
    )
    pod_info = g["gpuguard_container_pod_info"]
    deadline, invalid = (
        g["gpuguard_container_deadline_seconds"],
        g["gpuguard_container_deadline_invalid"],
    )
    task_info = g["gpuguard_container_task_info"]
    label_invalid = g["gpuguard_container_label_invalid"]
    rejected = g["gpuguard_container_claim_rejected"]
    vouched = g["gpuguard_container_deadline_vouched"]
    default_mode = snap.default_task_mode
    for info in snap.containers.values():
        values = _container(node, info)
        labels = cache.get(_C, values)
        info_rows.append((cache.get(_INFO_LABELS, (*values, info.image)), 1))
        if info.pod_name is not None:
            pod_info.append((cache.get(_POD_INFO_LABELS, (*values, info.pod_uid or "")), 1))
        managed.append((labels, 1 if info.managed else 0))
        paused.append((labels, 1 if info.paused else 0))
        if info.deadline_s is not None:
            deadline.append((labels, info.deadline_s))
            vouched.append((labels, 1 if info.deadline_vouched else 0))
        invalid.append((labels, 1 if info.deadline_error else 0))
        kind = (info.task_mode or default_mode, info.priority_class)
        task_info.append((cache.get(_TASK_INFO_LABELS, (*values, *kind)), 1))
        for label, error in ((TASK, info.task_mode_error), (CLASS, info.class_error)):
            if error:
                label_invalid.append((cache.get(_LABEL_INVALID_LABELS, (*values, label)), 1))
        for label, _ in info.slo_errors + info.inflight_errors:
            label_invalid.append((cache.get(_LABEL_INVALID_LABELS, (*values, label)), 1))
        for label, _ in info.claims_rejected:
            rejected.append((cache.get(_LABEL_INVALID_LABELS, (*values, label)), 1))
        if info.slo is not None:
            _add_slo(r, values, labels, info.slo)


def _add_slo(r: Rows, values: tuple[str, ...], labels: LabelSet, slo: SloDeclaration) -> None:
    g, cache = r.gauges, r.cache
    metric = slo.series_name
    g["gpuguard_container_slo_info"].append((cache.get(_SLO_INFO_LABELS, (*values, metric)), 1))
    g["gpuguard_container_slo_target_seconds"].append((labels, slo.target_s))
    g["gpuguard_container_slo_objective_ratio"].append((labels, slo.objective))
    buckets = g["gpuguard_container_slo_bucket_info"]
    for le in slo.bucket_bounds:
        buckets.append((cache.get(_SLO_BUCKET_LABELS, (*values, metric, le)), 1))


def _add_containers(r: Rows, snap: PollSnapshot) -> None:
    """What each container did: its counters, demand and GPU use (changes every poll)."""
    node = snap.node
    g, cache = r.gauges, r.cache
    finished, hits, misses = (
        g["gpuguard_container_tasks_finished"],
        g["gpuguard_container_deadline_hits"],
        g["gpuguard_container_deadline_misses"],
    )
    paused_s, resumes = g["gpuguard_container_paused_seconds"], g["gpuguard_container_resumes"]
    busy_periods, busy_s = (
        g["gpuguard_container_busy_periods"],
        g["gpuguard_container_busy_seconds"],
    )
    demand = g["gpuguard_container_demand_sm_ratio"]
    no_stats = ContainerStats()
    for info in snap.containers.values():
        labels = cache.of(_C, info, partial(_container, node, info))
        share = snap.demand.get(info.id)
        if share is not None:
            demand.append((labels, share))
        stats = snap.stats.get(info.id, no_stats)
        finished.append((labels, stats.finished))
        hits.append((labels, stats.hits))
        misses.append((labels, stats.misses))
        paused_s.append((labels, stats.paused_s))
        resumes.append((labels, stats.resumes))
        if stats.busy_periods:  # only once it had one: most containers never do
            busy_periods.append((labels, stats.busy_periods))
            busy_s.append((labels, stats.busy_s))
    if snap.joined is None:
        return
    memory = g["gpuguard_container_gpu_memory_bytes"]
    sm = g["gpuguard_container_gpu_sm_utilization_ratio"]
    processes = g["gpuguard_container_gpu_processes"]
    ids = gpu_ids(snap)
    for usage in snap.joined.usage:
        info = snap.containers[usage.container_id]  # the join only sums known containers
        gpu_id = ids.get(usage.gpu, _NO_ID)
        values = partial(_container_gpu, node, usage.gpu, info, gpu_id)
        cg_labels = cache.of(_CG, info, values, usage.gpu, gpu_id)
        memory.append((cg_labels, usage.memory_bytes))
        sm.append((cg_labels, usage.sm_ratio))
        processes.append((cg_labels, usage.processes))


def _add_activity(r: Rows, snap: PollSnapshot) -> None:
    """The launch probe's view of each container, and the source each is seen through."""
    g, cache = r.gauges, r.cache
    for info in snap.containers.values():
        labels = cache.of(_C, info, partial(_container, snap.node, info))
        activity = snap.activity.get(info.id)
        gauge = snap.inflight.get(info.id)
        if gauge is not None and gauge.value is not None:
            g["gpuguard_container_inflight_requests"].append((labels, gauge.value))
        read = gauge is not None and gauge.value is not None
        source, reason = source_of(activity, snap.probe, read)
        values = (*labels.values, source.value, reason.value if reason else "")
        r.add("gpuguard_container_activity_source", values, 1)
        if activity is None:
            continue
        g["gpuguard_container_launches"].append((labels, activity.launches))
        g["gpuguard_container_copies"].append((labels, activity.copies))
        g["gpuguard_container_launch_tasks"].append((labels, activity.tasks))
        g["gpuguard_container_launch_busy_seconds"].append((labels, activity.busy_s))
        g["gpuguard_container_gpu_busy"].append((labels, int(activity.busy)))


def _add_tasks(r: Rows, snap: PollSnapshot) -> None:
    node = snap.node
    g, cache = r.gauges, r.cache
    oldest: dict[tuple[str, str], TaskView] = {}
    waiting: dict[str, int] = {}
    for task in snap.tasks:  # in start order: the first per (container, gpu) is the oldest
        info = snap.containers.get(task.container_id) if task.container_id else None
        if info is None:
            continue
        if info.paused:
            waiting[task.gpu] = waiting.get(task.gpu, 0) + 1
        oldest.setdefault((info.id, task.gpu), task)
    phase_rows = g["gpuguard_container_task_phase"]
    boundary_rows = g["gpuguard_container_task_boundary"]
    elapsed = g["gpuguard_container_task_elapsed_seconds"]
    slack_rows = g["gpuguard_container_task_slack_seconds"]
    ids = gpu_ids(snap)
    for (cid, gpu), task in oldest.items():
        info = snap.containers[cid]
        gpu_id = ids.get(gpu, _NO_ID)
        labels = cache.of(_CG, info, partial(_container_gpu, node, gpu, info, gpu_id), gpu, gpu_id)
        values = labels.values
        for phase, phase_labels in zip(PHASES, cache.phases(values), strict=True):
            phase_rows.append((phase_labels, 1 if task.phase == phase else 0))
        boundary_rows.append((cache.get(_BOUNDARY_LABELS, (*values, task.boundary)), 1))
        elapsed.append((labels, task.elapsed_s(snap.timestamp)))
        slack = task.slack_s(snap.timestamp)
        if slack is not None:
            slack_rows.append((labels, slack))
    devices = snap.sample.devices if snap.sample is not None else ()
    for gpu in sorted({d.key for d in devices} | set(waiting)):
        r.add("gpuguard_tasks_waiting", (node, gpu, *ids.get(gpu, _NO_ID)), waiting.get(gpu, 0))


_GPU_STATE_REASONS = tuple(r for r in StateReason if r is not StateReason.NO_GPU)


def _add_record(r: Rows, snap: PollSnapshot) -> None:
    record = snap.record
    if record is None:
        return
    node = (snap.node,)
    r.add("gpuguard_node_state", node, record.state)
    r.add("gpuguard_node_float_time_seconds", node, record.float_time_s)
    r.add("gpuguard_node_free_memory_bytes", node, record.memory_free_bytes)
    ids = gpu_ids(snap)
    for g in record.gpus:
        gpu = (snap.node, g.gpu, *ids.get(g.gpu, _NO_ID))
        r.add("gpuguard_gpu_state", gpu, g.state)
        for reason in _GPU_STATE_REASONS:
            r.add("gpuguard_gpu_state_reason", (*gpu, reason), int(reason in g.reasons))
        r.add("gpuguard_gpu_float_time_seconds", gpu, g.float_time_s)
        r.add("gpuguard_gpu_free_memory_bytes", gpu, g.memory_free_bytes)
        r.add("gpuguard_gpu_busy_ratio", gpu, g.busy_ratio)
        r.add("gpuguard_gpu_running_tasks", gpu, g.running_tasks)
        r.add("gpuguard_gpu_deadline_tasks", gpu, g.deadline_tasks)
        r.add("gpuguard_gpu_recent_misses", gpu, g.recent_misses)
        if g.min_slack_s is not None:
            r.add("gpuguard_gpu_min_slack_seconds", gpu, g.min_slack_s)


def _add_exporter(r: Rows, snap: PollSnapshot) -> None:
    node = (snap.node,)
    r.add("gpuguard_exporter_polls", node, snap.polls_total)
    r.add("gpuguard_exporter_poll_duration_seconds", node, snap.poll_duration_s)
    r.add("gpuguard_exporter_last_poll_timestamp_seconds", node, snap.timestamp)
    for source in SOURCES:
        status = snap.sources.get(source)
        if status is None:
            continue
        r.add("gpuguard_exporter_collector_success", (snap.node, source), int(status.success))
        r.add(
            "gpuguard_exporter_collector_duration_seconds", (snap.node, source), status.duration_s
        )
        r.add("gpuguard_exporter_errors", (snap.node, source), status.errors)
    r.add("gpuguard_exporter_build_info", (snap.node, __version__, snap.backend), 1)
    r.add("gpuguard_exporter_trust_policy_info", (snap.node, *snap.trust_policy), 1)
    probe = snap.probe
    if probe is not None:
        reason = probe.reason.value if probe.reason is not None else ""
        r.add("gpuguard_exporter_launch_probe_up", (snap.node, reason), int(probe.attached))
