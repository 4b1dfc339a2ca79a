"""Rate control's step at each decision: each device's run fraction, where a step is due."""

from __future__ import annotations

from gpuguard.actuator.admission.history import RateHistory
from gpuguard.actuator.admission.ratecontrol import besteffort_demand
from gpuguard.actuator.admission.slosignal import SloSignal, device_readings
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.metrics import ActuatorMetrics
from gpuguard.actuator.state import ExporterState


def step_rates(
    rates: RateHistory,
    slo_signal: SloSignal | None,
    state: ExporterState,
    now: float,
    metrics: ActuatorMetrics,
    audit: AuditLog,
) -> None:
    """A control step of each device's run fraction where one is due (once a period), on the
    readings the SLO poller last got (never a query under the lock), or where no SLO is
    declared (or no ``slo_signal``), on the best-effort side's measured demand."""
    attainments = slo_signal.latest() if slo_signal is not None else []
    readings, declared = device_readings(state, attainments)
    if slo_signal is None:
        declared = frozenset()  # no SLO signal can come: interference or open loop
    steps = rates.control(readings, declared, now, besteffort_demand(state))
    metrics.rate_stepped(steps)
    for step in steps:
        if step.changed:
            gpu, mig = step.device
            audit.write(
                "run_fraction",
                gpu=gpu if mig is None else f"{gpu}:{mig}",
                run_fraction=round(step.run_fraction, 4),
                step=step.step,
                signal=step.signal,
            )
