"""The actuator's own metrics (docs/interfaces.md section 8), every label value pre-created.

Sample exposition::

    # HELP gpuguard_actuator_actions_total Actions by kind and result.
    # TYPE gpuguard_actuator_actions_total counter
    gpuguard_actuator_actions_total{action="pause",result="ok"} 12.0
    gpuguard_actuator_skipped_total{reason="vanished"} 1.0
    gpuguard_actuator_node_provisionable{node="host-a"} 1.0
    gpuguard_actuator_journal_writable 1.0
    gpuguard_actuator_state_write_failures_total{file="journal",reason="no_space"} 0.0
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from gpuguard.actuator.admission.history import ControlStep
from gpuguard.actuator.admission.ratecontrol import RateStep
from gpuguard.actuator.safety.statewrites import StateWrites, StateWritesCollector
from gpuguard.contract import Result, SkipReason, TriggerSource, Verb

VERBS = tuple(Verb)
RESULTS = tuple(Result)
SKIP_REASONS = tuple(SkipReason)
TRIGGERS = tuple(TriggerSource)
RATE_STEPS = tuple(RateStep)
#: how a query of rate control's SLO signal went (``slosignal.SloSignal``)
QUERY_OK, QUERY_FAILED = "ok", "failed"
QUERY_RESULTS = (QUERY_OK, QUERY_FAILED)
WEBHOOK_CODES = ("200", "400", "401", "413", "415", "503")
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ActuatorMetrics:
    """Holds the metric objects in their own registry (served on ``/metrics``)."""

    def __init__(
        self,
        node: str,
        registry: CollectorRegistry | None = None,
        writes: StateWrites | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        #: failed writes to the state directory (``statewrites``), by file and reason
        r.register(
            StateWritesCollector("gpuguard_actuator_state_write_failures", writes or StateWrites())
        )
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes...
        self.actions = Counter(
            "gpuguard_actuator_actions",
            "Actions by kind and result.",
            ["action", "result"],
            registry=r,
        )
        self.skipped = Counter(
            "gpuguard_actuator_skipped", "Actions not taken, by reason.", ["reason"], registry=r
        )
        self.decision_seconds = Histogram(
            "gpuguard_actuator_decision_seconds",
            "Trigger to actions done (fresh state, decide, execute).",
            ["trigger"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.paused_containers = Gauge(
            "gpuguard_actuator_paused_containers",
            "Containers this actuator holds paused.",
            registry=r,
        )
        self.node_provisionable = Gauge(
            "gpuguard_actuator_node_provisionable",
            "1 while new real-time containers may be placed on the node.",
            ["node"],
            registry=r,
        )
        self.guard_lease_age = Gauge(
            "gpuguard_actuator_guard_lease_age_seconds",
            "Seconds since the guard last renewed its lease in the state directory (+Inf: never).",
            ["node"],
            registry=r,
        )
        self.exporter_up = Gauge(
            "gpuguard_actuator_exporter_up", "1 while the exporter answers.", registry=r
        )
        self.fail_open = Counter(
            "gpuguard_actuator_fail_open",
            "Times everything this actuator paused was resumed because it could not see.",
            registry=r,
        )
        self.journal_writable = Gauge(
            "gpuguard_actuator_journal_writable",
            "1 while the journal can be written; 0: nothing is paused, what is paused resumed.",
            registry=r,
        )
        self.journal_writable.set(1)  # until the controller reads its journal's
        self.webhooks = Counter(
            "gpuguard_actuator_webhooks", "Webhook requests by HTTP status.", ["code"], registry=r
        )
        self.run_fraction = Gauge(
            "gpuguard_actuator_besteffort_run_fraction",
            "Rate control: the share of each period best-effort work runs beside active "
            "real-time work on the device.",
            ["gpu"],
            registry=r,
        )
        self.control_steps = Counter(
            "gpuguard_actuator_besteffort_control_steps",
            "Rate control: control steps of a device's run fraction, by what they did.",
            ["result"],
            registry=r,
        )
        self.slo_queries = Counter(
            "gpuguard_actuator_slo_queries",
            "Rate control: queries of the SLO signal from Prometheus, by result (failed: "
            "the readings age).",
            ["result"],
            registry=r,
        )
        for kind in VERBS:
            for result in RESULTS:
                self.actions.labels(kind, result)
        for reason in SKIP_REASONS:
            self.skipped.labels(reason)
        for trigger in TRIGGERS:
            self.decision_seconds.labels(trigger)
        for code in WEBHOOK_CODES:
            self.webhooks.labels(code)
        for step in RATE_STEPS:
            self.control_steps.labels(step)
        for query_result in QUERY_RESULTS:
            self.slo_queries.labels(query_result)
        self.node_provisionable.labels(node).set(1)
        self.guard_lease_age.labels(node).set(math.inf)
        self.node = node

    def guard_seen(self, age_s: float) -> None:
        """The guard lease's age (``GpuguardGuardMissing`` fires when it grows)."""
        self.guard_lease_age.labels(self.node).set(age_s)

    def rate_stepped(self, steps: Iterable[ControlStep]) -> None:
        """Count control steps and show each device's run fraction (``gpu``: 0, or 0:1)."""
        for step in steps:
            self.control_steps.labels(step.step).inc()
            gpu, mig = step.device
            self.run_fraction.labels(str(gpu) if mig is None else f"{gpu}:{mig}").set(
                step.run_fraction
            )

    def skip(self, reason: str | None) -> None:
        """Count a skip; reasons outside the contract's list are audited only."""
        if reason in SKIP_REASONS:
            self.skipped.labels(reason).inc()
