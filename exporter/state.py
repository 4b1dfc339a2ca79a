"""``/api/v1/state`` (docs/interfaces.md §3): a PollSnapshot as a JSON-ready dict (pure)."""

from __future__ import annotations

from typing import Any

from gpuguard.exporter.model import ContainerInfo
from gpuguard.exporter.poller import PollSnapshot
from gpuguard.exporter.tracker import TaskView


def program_name(command: str) -> str:
    """What ``/api/v1/state`` shows of a command line: the program alone, never arguments.

    The state is open to anyone who can connect, and arguments carry secrets (passwords,
    tokens, URLs with credentials) often enough; ``docker inspect`` still has the rest.
    """
    return command.split(" ", 1)[0].rsplit("/", 1)[-1]


def _container_json(info: ContainerInfo, snap: PollSnapshot) -> dict[str, Any]:
    return {
        "id": info.id,
        "name": info.name,
        "image": info.image,
        "command": program_name(info.command),
        "state": info.state,
        "paused": info.paused,
        "managed": info.managed,
        "deadline_s": info.deadline_s,
        "deadline_error": info.deadline_error,
        "gpus": list(info.gpus),
        "role": info.role,
        "task_mode": info.task_mode or snap.default_task_mode,
        "task_mode_error": info.task_mode_error,
        "class": info.priority_class,
        "class_error": info.class_error,
        "demand_sm_ratio": snap.demand.get(info.id),
        "typical_run_s": snap.typical_run.get(info.id),
        "slo": _slo_json(info),
        # Kubernetes identity (containerd source); null on a Docker host
        "namespace": info.pod_namespace,
        "pod": info.pod_name,
        "pod_uid": info.pod_uid,
        # the operator's trust policy replaced these claims (exporter/trust.py)
        "claims_rejected": [{"label": lbl, "why": why} for lbl, why in info.claims_rejected],
        # whether its deadline counts toward the node record and node marks
        "deadline_vouched": info.deadline_vouched,
    }


def _slo_json(info: ContainerInfo) -> dict[str, Any] | None:
    if info.slo is None:
        return None
    return {
        "metric": info.slo.metric,
        "target_s": info.slo.target_s,
        "objective": info.slo.objective,
        "port": info.slo.port,
    }


def task_json(task: TaskView, snap: PollSnapshot) -> dict[str, Any]:
    """One task; finished tasks also get ``ended_at``, ``run_s`` and ``met_deadline`` (null
    unless its ``boundary`` is ``exact``: busy time and tasks without a kernel are not judged).
    """
    info = snap.containers.get(task.container_id) if task.container_id else None
    doc: dict[str, Any] = {
        "task_id": task.task_id,
        "container_id": task.container_id,
        "container": info.name if info is not None else task.container_name,
        "pid": task.pid,
        "gpu": task.gpu_index,
        "mig_index": task.mig_index,
        "mode": task.mode,
        "phase": task.phase,
        "started_at": task.started_at,
        "proc_start_ticks": task.proc_start_ticks,
        "elapsed_s": task.elapsed_s(snap.timestamp),
        "memory_bytes": task.memory_bytes,
        "sm_ratio": task.sm_ratio,
        "deadline_s": task.deadline_s,
        "absolute_deadline": task.absolute_deadline,
        "slack_s": task.slack_s(snap.timestamp),
        "overrun": task.overrun,
        "boundary": task.boundary,
        "paused": bool(info is not None and info.paused),
    }
    if task.ended_at is not None:
        doc.update(ended_at=task.ended_at, run_s=task.run_s, met_deadline=task.met_deadline)
    return doc


def state_json(snap: PollSnapshot) -> dict[str, Any]:
    """The whole state document for one poll."""
    gpus = []
    if snap.sample is not None:
        device_sm = snap.joined.device_sm_ratio if snap.joined is not None else {}
        for device in snap.sample.devices:
            gpus.append(
                {
                    "index": device.index,
                    "mig_index": device.mig_index,
                    "uuid": device.uuid,
                    "name": device.name,
                    "memory_total_bytes": device.memory_total_bytes,
                    "memory_used_bytes": device.memory_used_bytes,
                    "utilization_ratio": device.utilization_ratio,
                    "sm_ratio": device_sm.get(device.key, 0.0),
                }
            )
    return {
        "node": snap.node,
        "seq": snap.seq,
        "timestamp": snap.timestamp,
        "poll_interval_s": snap.poll_interval_s,
        "sources": {name: status.success for name, status in snap.sources.items()},
        "gpus": gpus,
        "containers": [_container_json(c, snap) for c in snap.containers.values()],
        "tasks": [task_json(t, snap) for t in snap.tasks],
        "recent": [task_json(t, snap) for t in snap.recent],
        "node_record": snap.record.to_json() if snap.record is not None else None,
    }
