"""``/api/v1/state`` (docs/interfaces.md §3): a PollSnapshot as a JSON-ready dict (pure).

The field names are ``gpuguard/statedoc.py``'s, where the actuator's and ``gpuguard ps``'s
one reader of this document parses them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuguard.exporter.activity import source_of
from gpuguard.exporter.model import ContainerInfo, Joined
from gpuguard.exporter.poller import PollSnapshot
from gpuguard.exporter.tracker import TaskView
from gpuguard.statedoc import (
    ActivityField,
    ClaimField,
    ContainerField,
    DeviceField,
    GpuField,
    SloField,
    StateField,
    TaskField,
)


def program_name(command: str) -> str:
    """What ``/api/v1/state`` shows of a command line: the program alone, never arguments.

    The state is open to anyone who can connect, and arguments carry secrets (passwords,
    tokens, URLs with credentials) often enough; ``docker inspect`` still has the rest.
    """
    return command.split(" ", 1)[0].rsplit("/", 1)[-1]


def _container_json(
    info: ContainerInfo, snap: PollSnapshot, devices: Sequence[tuple[int, int | None]] = ()
) -> dict[str, Any]:
    return {
        ContainerField.ID: info.id,
        ContainerField.NAME: info.name,
        ContainerField.IMAGE: info.image,
        ContainerField.COMMAND: program_name(info.command),
        ContainerField.STATE: info.state,
        ContainerField.PAUSED: info.paused,
        ContainerField.MANAGED: info.managed,
        ContainerField.DEADLINE_S: info.deadline_s,
        ContainerField.DEADLINE_ERROR: info.deadline_error,
        ContainerField.GPUS: list(info.gpus),
        ContainerField.ROLE: info.role,
        ContainerField.TASK_MODE: info.task_mode or snap.default_task_mode,
        ContainerField.TASK_MODE_ERROR: info.task_mode_error,
        ContainerField.CLASS: info.priority_class,
        ContainerField.CLASS_ERROR: info.class_error,
        ContainerField.DEMAND_SM_RATIO: snap.demand.get(info.id),
        ContainerField.TYPICAL_RUN_S: snap.typical_run.get(info.id),
        ContainerField.LONGEST_RUN_S: snap.longest_run.get(info.id),
        ContainerField.SLO: _slo_json(info),
        # Kubernetes identity (containerd source); null on a Docker host
        ContainerField.NAMESPACE: info.pod_namespace,
        ContainerField.POD: info.pod_name,
        ContainerField.POD_UID: info.pod_uid,
        # the operator's trust policy replaced these claims (gpuguard/exporter/trust.py)
        ContainerField.CLAIMS_REJECTED: [
            {ClaimField.LABEL: label, ClaimField.WHY: why} for label, why in info.claims_rejected
        ],
        # whether its deadline counts toward the node record and node marks
        ContainerField.DEADLINE_VOUCHED: info.deadline_vouched,
        ContainerField.ACTIVITY: activity_json(info.id, snap),
        ContainerField.DEVICES: [
            {DeviceField.GPU: gpu, DeviceField.MIG_INDEX: mig} for gpu, mig in devices
        ],
    }


def process_devices(joined: Joined | None) -> Mapping[str, list[tuple[int, int | None]]]:
    """Container id -> the devices its processes are on (the GPU's own list), in order."""
    found: dict[str, list[tuple[int, int | None]]] = {}
    for proc in joined.processes if joined is not None else ():
        if proc.container_id is not None:
            mine = found.setdefault(proc.container_id, [])
            if (proc.gpu_index, proc.mig_index) not in mine:
                mine.append((proc.gpu_index, proc.mig_index))
    return found


def activity_json(container_id: str, snap: PollSnapshot) -> dict[str, Any]:
    """The source a container is seen through and, from the launch probe, its activity."""
    seen = snap.activity.get(container_id)
    gauge = snap.inflight.get(container_id)
    inflight = gauge.value if gauge is not None else None
    source, why = source_of(seen, snap.probe, inflight is not None)
    return {
        ActivityField.INFLIGHT: inflight,
        ActivityField.INFLIGHT_ERROR: gauge.error if gauge is not None else None,
        ActivityField.SOURCE: source,
        ActivityField.REASON: why,
        ActivityField.BUSY: seen.busy if seen is not None else None,
        ActivityField.BUSY_SINCE: seen.busy_since if seen is not None else None,
        ActivityField.LAUNCHES: seen.launches if seen is not None else None,
        ActivityField.TASKS: seen.tasks if seen is not None else None,
        ActivityField.LAST_TASK: list(seen.last_task) if seen and seen.last_task else None,
        ActivityField.IN_FLIGHT: seen.in_flight if seen is not None else None,
        ActivityField.LAST_STEP: list(seen.last_step) if seen and seen.last_step else None,
    }


def _slo_json(info: ContainerInfo) -> dict[str, Any] | None:
    if info.slo is None:
        return None
    return {
        SloField.METRIC: info.slo.metric,
        SloField.TARGET_S: info.slo.target_s,
        SloField.OBJECTIVE: info.slo.objective,
        SloField.PORT: info.slo.port,
    }


def task_json(task: TaskView, snap: PollSnapshot) -> dict[str, Any]:
    """One task; finished tasks also get ``ended_at``, ``run_s`` and ``met_deadline`` (null
    unless its ``boundary`` is ``exact``: busy time and tasks without a kernel are not judged).
    """
    info = snap.containers.get(task.container_id) if task.container_id else None
    doc: dict[str, Any] = {
        TaskField.TASK_ID: task.task_id,
        TaskField.CONTAINER_ID: task.container_id,
        TaskField.CONTAINER: info.name if info is not None else task.container_name,
        TaskField.PID: task.pid,
        TaskField.GPU: task.gpu_index,
        TaskField.MIG_INDEX: task.mig_index,
        TaskField.MODE: task.mode,
        TaskField.PHASE: task.phase,
        TaskField.STARTED_AT: task.started_at,
        TaskField.PROC_START_TICKS: task.proc_start_ticks,
        TaskField.ELAPSED_S: task.elapsed_s(snap.timestamp),
        TaskField.MEMORY_BYTES: task.memory_bytes,
        TaskField.SM_RATIO: task.sm_ratio,
        TaskField.DEADLINE_S: task.deadline_s,
        TaskField.ABSOLUTE_DEADLINE: task.absolute_deadline,
        TaskField.SLACK_S: task.slack_s(snap.timestamp),
        TaskField.OVERRUN: task.overrun,
        TaskField.BOUNDARY: task.boundary,
        TaskField.PAUSED: bool(info is not None and info.paused),
        TaskField.TIMED_BY: task.timed_by,
    }
    if task.ended_at is not None:
        doc[TaskField.ENDED_AT] = task.ended_at
        doc[TaskField.RUN_S] = task.run_s
        doc[TaskField.MET_DEADLINE] = task.met_deadline
    return doc


def state_json(snap: PollSnapshot) -> dict[str, Any]:
    """The whole state document for one poll."""
    devices = process_devices(snap.joined)
    gpus = []
    if snap.sample is not None:
        device_sm = snap.joined.device_sm_ratio if snap.joined is not None else {}
        for device in snap.sample.devices:
            gpus.append(
                {
                    GpuField.INDEX: device.index,
                    GpuField.MIG_INDEX: device.mig_index,
                    GpuField.UUID: device.uuid,
                    GpuField.NAME: device.name,
                    GpuField.MEMORY_TOTAL_BYTES: device.memory_total_bytes,
                    GpuField.MEMORY_USED_BYTES: device.memory_used_bytes,
                    GpuField.UTILIZATION_RATIO: device.utilization_ratio,
                    GpuField.SM_RATIO: device_sm.get(device.key, 0.0),
                    GpuField.SAMPLE_PERIOD_S: device.sample_period_s,
                }
            )
    return {
        StateField.NODE: snap.node,
        StateField.SEQ: snap.seq,
        StateField.TIMESTAMP: snap.timestamp,
        StateField.POLL_INTERVAL_S: snap.poll_interval_s,
        StateField.SOURCES: {name: status.success for name, status in snap.sources.items()},
        StateField.GPUS: gpus,
        StateField.CONTAINERS: [
            _container_json(c, snap, devices.get(c.id, ())) for c in snap.containers.values()
        ],
        StateField.TASKS: [task_json(t, snap) for t in snap.tasks],
        StateField.RECENT: [task_json(t, snap) for t in snap.recent],
        StateField.NODE_RECORD: snap.record.to_json() if snap.record is not None else None,
    }
