"""The exporter's ``/api/v1/state`` and ``/api/v1/events`` as the actuator reads them.

One typed reader serves the actuator and ``gpuguard ps``: it lives in the shared layer,
beside the field names the exporter writes (``gpuguard/statedoc.py``). The actuator's
modules import its types from here.
"""

from __future__ import annotations

from gpuguard.statedoc import (
    Activity,
    Container,
    DeviceKey,
    EndedTask,
    Event,
    EventBatch,
    ExporterState,
    Gpu,
    Task,
    parse_events,
    parse_state,
)

__all__ = [
    "Activity",
    "Container",
    "DeviceKey",
    "EndedTask",
    "Event",
    "EventBatch",
    "ExporterState",
    "Gpu",
    "Task",
    "parse_events",
    "parse_state",
]
