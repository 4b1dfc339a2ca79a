"""Which admission decisions one webhook asks for: one per node, at most ``MAX_ADMISSION_NODES``.

The ``admission`` alerts are triggers: each names a node and, maybe, a GPU; the controller
decides for each target on fresh exporter state.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpuguard.actuator.report import Report
from gpuguard.actuator.webhook import Alert
from gpuguard.contract import SkipReason

log = logging.getLogger("gpuguard.actuator")

#: distinct ``node`` labels one webhook may ask admission for (a real group names one)
MAX_ADMISSION_NODES = 16


def admission_targets(
    alerts: Sequence[Alert], max_nodes: int = MAX_ADMISSION_NODES
) -> tuple[list[tuple[str | None, int | None, str]], int]:
    """(node, gpu, alert name) to decide for, one per node, and how many nodes were dropped.

    Linear in the alerts. Alerts for several GPUs of one node, or for the node as a whole,
    become one decision for the whole node (it covers every GPU), so a webhook naming
    12,000 GPUs costs one state read, not 12,000.
    """
    gpus: dict[str | None, set[int | None]] = {}
    names: dict[str | None, str] = {}
    for alert in alerts:
        if alert.firing:
            node = alert.labels.get("node")
            gpus.setdefault(node, set()).add(alert.gpu)
            names.setdefault(node, alert.name)
    targets = [
        (node, next(iter(wanted)) if len(wanted) == 1 else None, names[node])
        for node, wanted in gpus.items()
    ]
    return targets[:max_nodes], max(0, len(targets) - max_nodes)


def dropped_report(dropped: int) -> Report:
    """The report's start for a webhook naming ``dropped`` nodes too many (logged)."""
    report = Report()
    if dropped:
        log.warning("webhook names %d nodes too many: ignored", dropped)
        report.skips.append(
            {
                "reason": SkipReason.IRRELEVANT_ALERT,
                "detail": f"{dropped} more nodes than one webhook may name",
            }
        )
    return report
