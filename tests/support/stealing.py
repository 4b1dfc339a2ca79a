"""What a hostile tenant's labels take from honest neighbours (issue 26), for the pure
fuzz (``tests/unit/test_trust_fuzz.py``) and the one through a running exporter
(``tests/integration/test_trust_live.py``).

Containers come in as the exporter's ``/api/v1/state`` shows them (``_container_json`` of
``container_info``, or a live exporter's document) and reach the actuator's real policy
through its own parser, beside honest tenants that were there first:

- A, class normal with a 9 s deadline, computing, due within 0.5 s; B, a best-effort
  trainer, computing; C, like A, started after it and waiting (paused by the actuator), due
  within 0.8 s;
- scene ``busy``: A holds the GPU, C waits behind it, the hostile tenant's task starts now;
  scene ``free``: A is gone, so C's turn has come while the hostile tenant computes (since
  0.1 s). Either way the honest tasks are due within 1 s of the hostile task's start, so no
  deadline the built-in default lets it hold (1 s or more) goes before them under EDF: that
  is the bound the floor sets.

``held_back`` says which honest tenants one decision pauses, or leaves waiting while the
hostile tenant keeps the GPU, with an SLO alert firing wherever the exporter publishes the
hostile tenant's SLO (its own histogram makes it fire at will). A **steal** is what the
hostile tenant's claims add to that over the same container without claims.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuguard import labels
from gpuguard.actuator.admission.policy.decide import decide
from gpuguard.actuator.admission.pressure import SloPressure
from gpuguard.actuator.decision import Ledger, PolicyConfig, Trigger
from gpuguard.actuator.webhook import Alert
from gpuguard.contract import Phase, TaskBoundary, TaskMode, TriggerSource, Verb
from gpuguard.statedoc import ExporterState, parse_state

NOW = 1_800_000_000.0
NODE = "fuzz"
GIB = 1 << 30
SCENES = [(scene, order) for scene in ("busy", "free") for order in ("fifo", "edf")]
HOSTILE = "hostile"

#: What a tenant may write, odd spellings included (None: no such label).
CHOICES: dict[str, list[str | None]] = {
    labels.CLASS: [None, "real-time", "normal", "best-effort", "REAL-TIME", "real-time ",
                   "realtime", "", "\u0440eal-time"],
    labels.DEADLINE: [None, "0.0000000001ms", "1e-13s", "0", "-1s", "1ms", "20ms", "999ms",
                      "1s", "1.5s", "9s", "9", "30s", "1000h", " 1 ms", "\u0661s", "nan",
                      "inf", "", "0.5"],
    labels.MANAGED: [None, "true", "TRUE", " true ", "false", "yes"],
    labels.ROLE: [None, None, "exporter", "actuator", "guard", "EXPORTER", "tenant"],
    labels.TASK: [None, "process", "memory", "burst", "Burst"],
    "io.kubernetes.pod.namespace": [None, None, "inference-x", "kube-system"],
    "slo": [None, None, "valid", "junk"],
}  # fmt: skip
SLO_LABELS = {
    "valid": {labels.SLO_METRIC: "vllm:e2e_request_latency_seconds", labels.SLO_TARGET: "1ms",
              labels.SLO_OBJECTIVE: "0.999", labels.SLO_PORT: "8000"},
    "junk": {labels.SLO_METRIC: "x_bucket", labels.SLO_TARGET: "-1"},
}  # fmt: skip
#: The labels that claim something of others; the rest say who the container is.
CLAIMS = (labels.CLASS, labels.DEADLINE, "io.kubernetes.pod.namespace", *labels.SLO_LABELS)
HONEST = {
    "honest-a": {labels.DEADLINE: "9s", labels.CLASS: "normal", labels.MANAGED: "true"},
    "honest-b": {labels.CLASS: "best-effort", labels.MANAGED: "true"},
    "honest-c": {labels.DEADLINE: "9s", labels.CLASS: "normal", labels.MANAGED: "true"},
}


def hostile_labels(rng: random.Random, **fixed: str | None) -> dict[str, str]:
    """One label set: ``fixed`` values where given (None: no such label), else drawn."""
    out: dict[str, str] = {}
    for key, values in CHOICES.items():
        value = fixed[key] if key in fixed else rng.choice(values)
        if value is None:
            continue
        if key == "slo":
            out.update(SLO_LABELS[value])
        else:
            out[key] = value
    return out


def without_claims(container_labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in container_labels.items() if k not in CLAIMS}


@dataclass(frozen=True)
class Run:
    """One of a container's tasks on GPU 0, as the tracker would report it."""

    phase: Phase
    started: float
    sm: float | None
    mode: str = TaskMode.PROCESS


def state_of(containers: Mapping[str, tuple[Mapping[str, Any], Run]]) -> ExporterState:
    """The exporter's ``/api/v1/state`` with these containers, parsed by the actuator."""
    tasks = []
    for pid, (name, (doc, run)) in enumerate(containers.items(), start=100):
        deadline = doc["deadline_s"]
        boundary = TaskBoundary.OPEN if run.mode == TaskMode.BURST else TaskBoundary.EXACT
        tasks.append({
            "task_id": f"{doc['id'][:12]}:{pid}", "container_id": doc["id"], "container": name,
            "pid": pid, "gpu": 0, "mig_index": None, "mode": run.mode, "phase": run.phase,
            "started_at": run.started, "proc_start_ticks": pid, "elapsed_s": NOW - run.started,
            "memory_bytes": GIB, "sm_ratio": run.sm, "deadline_s": deadline,
            "absolute_deadline": None if deadline is None else run.started + deadline,
            "overrun": False, "boundary": boundary, "paused": False,
        })  # fmt: skip
    return parse_state({
        "node": NODE, "seq": 1, "timestamp": NOW, "sources": {"docker": True, "gpu": True},
        "gpus": [{"index": 0, "uuid": "GPU-0", "memory_total_bytes": 24 * GIB,
                  "memory_used_bytes": 4 * GIB, "utilization_ratio": 0.9}],
        "containers": [dict(doc, paused=False, state="running") for doc, _ in containers.values()],
        "tasks": tasks, "recent": [],
    })  # fmt: skip


def slo_alert(doc: Mapping[str, Any]) -> Alert:
    """GpuguardSloViolated for the container on GPU 0."""
    when = datetime(2027, 1, 15, tzinfo=UTC)
    return Alert(
        status="firing",
        labels={"alertname": "GpuguardSloViolated", "node": NODE, "gpu": "0",
                "container": doc["name"], "container_id": doc["id"][:12]},
        annotations={}, starts_at=when, ends_at=when, generator_url="", fingerprint="slo-1",
        gpu=0,
    )  # fmt: skip


def held_back(
    honest: Mapping[str, Mapping[str, Any]], hostile: Mapping[str, Any], scene: str, order: str
) -> set[str]:
    """The honest tenants one decision pauses, or leaves waiting while the hostile one keeps
    the GPU (container documents as ``/api/v1/state`` shows them, keyed by honest name)."""
    a, b, c = honest["honest-a"], honest["honest-b"], honest["honest-c"]
    runs = {
        "honest-b": (b, Run(Phase.COMPUTING, NOW - 60, 0.9, TaskMode.BURST)),
        "honest-c": (c, Run(Phase.INPUT, NOW - 8.2, None)),
    }
    mode = hostile["task_mode"]
    if scene == "busy":
        runs["honest-a"] = (a, Run(Phase.COMPUTING, NOW - 8.5, 0.9))
        runs[HOSTILE] = (hostile, Run(Phase.INPUT, NOW - 0.01, None, mode))
        ledger = Ledger(paused={c["id"]: NOW - 2}, admitted={a["id"]: NOW - 8.5})
    else:
        runs[HOSTILE] = (hostile, Run(Phase.COMPUTING, NOW - 0.1, 0.9, mode))
        ledger = Ledger(paused={c["id"]: NOW - 2})
    state = state_of(runs)
    pressure = SloPressure(NODE)
    if hostile["slo"] is not None:
        pressure.apply([slo_alert(hostile)], NOW)
    decision = decide(
        state, Trigger(TriggerSource.FAST, NOW), PolicyConfig(order=order), ledger,
        slo_pressure=pressure.devices(state),
    )  # fmt: skip
    paused = {step.container for step in decision.steps if step.verb == Verb.PAUSE}
    admitted = {step.container for step in decision.steps if step.verb == Verb.UNPAUSE}
    out = {name for name in honest if name in paused}
    if scene == "free" and "honest-c" not in admitted and HOSTILE not in paused:
        out.add("honest-c")  # its turn, but it waits while the hostile tenant keeps the GPU
    return out


def taken(
    honest: Mapping[str, Mapping[str, Any]],
    hostile: Mapping[str, Any],
    plain: Mapping[str, Any],
) -> list[tuple[str, str, set[str]]]:
    """(scene, order, honest tenants) wherever ``hostile`` holds back more than ``plain``,
    the same container without its claims."""
    found = []
    for scene, order in SCENES:
        extra = held_back(honest, hostile, scene, order) - held_back(honest, plain, scene, order)
        if extra:
            found.append((scene, order, extra))
    return found
