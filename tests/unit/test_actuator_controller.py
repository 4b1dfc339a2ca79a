"""The controller's bookkeeping: skip counting, node-scoped and idempotent fail-open."""

from __future__ import annotations

from pathlib import Path

from gpuguard.actuator.controller import Controller
from gpuguard.actuator.policy import Decision, Skip
from gpuguard.contract import SkipReason, TriggerSource
from tests.unit.actuator_support import make_controller


def skipped(controller: Controller, reason: str) -> float | None:
    registry = controller.metrics.registry
    value: float | None = registry.get_sample_value(
        "gpuguard_actuator_skipped_total", {"reason": reason}
    )
    return value


def test_a_policy_skip_is_counted_once(tmp_path: Path) -> None:
    controller = make_controller(tmp_path)
    skip = Skip(SkipReason.KERNEL_RUNNING, "kernel already runs", "c" * 64, "t1", 0)
    controller._execute(Decision(skips=(skip,)), TriggerSource.FAST)
    assert skipped(controller, "kernel_running") == 1
    # The same skip again within the audit interval: not counted again.
    controller._execute(Decision(skips=(skip,)), TriggerSource.FAST)
    assert skipped(controller, "kernel_running") == 1
    controller.audit.close()
