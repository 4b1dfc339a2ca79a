"""Builders of the admission policy's table tests: an exporter state of containers and tasks
as the actuator parses it, a ledger of the actuator's own pauses, and a decision's actions
by container name."""

from __future__ import annotations

from typing import Any

from gpuguard.actuator.decision import Decision, Ledger
from gpuguard.actuator.state import parse_state

NOW = 1_000_000.0
GIB = 2**30


def container(
    name: str,
    managed: bool = True,
    paused: bool = False,
    role: str | None = None,
    klass: str | None = None,
    demand: float | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    return {
        "id": cid(name),
        "name": name,
        "image": "gpuguard/base:local",
        "state": "paused" if paused else "running",
        "paused": paused,
        "managed": managed,
        "deadline_s": deadline,
        "deadline_error": None,
        "gpus": ["0"],
        "role": role,
        "task_mode": "burst",
        "task_mode_error": None,
        "class": klass or ("normal" if deadline is None else "real-time"),
        "class_error": None,
        "demand_sm_ratio": demand,
    }


def cid(name: str) -> str:
    return (name.encode().hex() * 64)[:64]


def task(
    name: str | None,
    phase: str,
    started: float,
    gpu: int = 0,
    deadline: float | None = None,
    paused: bool = False,
    pid: int = 0,
    age: float | None = None,
    mig: int | None = None,
    sm: float | None = None,
    ticks: int | None = None,
) -> dict[str, Any]:
    """A task; ``started`` orders tasks, ``age`` (default about 1 s) is how long it runs."""
    pid = pid or 1000 + int(started * 10) % 9000
    started_at = NOW - (age if age is not None else 1.0 - started * 0.01)
    return {
        "task_id": f"{cid(name)[:12] if name else '-'}:{pid}:{int(started)}:{gpu}{mig}",
        "container_id": cid(name) if name else None,
        "container": name,
        "pid": pid,
        "gpu": gpu,
        "mig_index": mig,
        "mode": "burst",
        "phase": phase,
        "started_at": started_at,
        "proc_start_ticks": int(started * 100) if ticks is None else ticks,
        "elapsed_s": NOW - started_at,
        "memory_bytes": GIB,
        "sm_ratio": sm if sm is not None else (1.0 if phase == "computing" else 0.0),
        "deadline_s": deadline,
        "absolute_deadline": None if deadline is None else started_at + deadline,
        "slack_s": None,
        "overrun": False,
        "paused": paused,
    }


def state(
    containers: list[dict[str, Any]],
    tasks: list[dict[str, Any]],
    util: float | list[float] = 0.0,
    mem_used: int = 4 * GIB,
    gpus: int = 1,
    timestamp: float = NOW,
    sources_ok: bool = True,
    migs: int = 0,
    sample_period_s: float | None = None,
) -> Any:
    devices = [(i, None) for i in range(gpus)] if not migs else [(0, m) for m in range(migs)]
    utils = util if isinstance(util, list) else [util] * len(devices)
    return parse_state(
        {
            "node": "host-a",
            "seq": 7,
            "timestamp": timestamp,
            "poll_interval_s": 0.02,
            "sources": {"gpu": sources_ok, "docker": True, "procfs": True},
            "gpus": [
                {
                    "index": i,
                    "mig_index": m,
                    "uuid": f"GPU-{i}" if m is None else f"MIG-{i}-{m}",
                    "name": "gpusim",
                    "memory_total_bytes": 24 * GIB,
                    "memory_used_bytes": mem_used,
                    "utilization_ratio": u if m is None else None,
                    "sm_ratio": u,
                    "sample_period_s": sample_period_s,
                }
                for (i, m), u in zip(devices, utils, strict=True)
            ],
            "containers": containers,
            "tasks": tasks,
            "recent": [],
        }
    )


def seen(
    c: dict[str, Any],
    source: str = "launch",
    busy: bool | None = False,
    last: tuple[float, float] | None = None,
    inflight: float | None = None,
    in_flight: bool | None = None,
) -> dict[str, Any]:
    """The container with the exporter's ``activity`` block (``in_flight``: as ``busy``)."""
    c["activity"] = {
        "source": source, "reason": None if source == "launch" else "no_calls",
        "busy": busy if source == "launch" else None,
        "busy_since": NOW - 0.01 if busy and source == "launch" else None,
        "launches": 5 if source == "launch" else None, "tasks": 1,
        "last_task": list(last) if last else None,
        "inflight": inflight, "inflight_error": None,
        "in_flight": (busy if in_flight is None else in_flight) if source == "launch" else None,
    }  # fmt: skip
    return c


def ours(*names: str, at: float = NOW - 1) -> Ledger:
    return Ledger(paused={cid(n): at for n in names})


def acts(decision: Decision) -> list[tuple[str, str]]:
    names = {cid(n): n for n in "abcdefghijklmnopqrstuvwxyz"}
    names.update({cid(f"c{i}"): f"c{i}" for i in range(20)})
    return [(a.verb, names.get(a.container_id, a.container_id)) for a in decision.steps]


def reasons(decision: Decision) -> list[str]:
    return [s.reason for s in decision.skips]
