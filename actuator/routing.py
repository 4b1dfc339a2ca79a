"""Webhook routing: each alert goes to the handler of the action ``rules/actions.yml`` gives it.

The table itself (``Controller.routes``: one handler per ``AlertAction``) is the
controller's; this holds what the handlers share (``Delivery``) and the grouping of one
webhook's alerts by action.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpuguard.actuator.report import Report
from gpuguard.actuator.webhook import Alert, WebhookMessage
from gpuguard.contract import AlertAction


@dataclass
class Delivery:
    """One webhook's fresh alerts, as its handlers see them in the table's order.

    ``partial``: some alerts of the group were left out (late duplicates), or what they
    say is not known (no fresh state), so the node marks must not take the message as the
    whole group. ``protect_slo`` leaves in ``message`` only those of its firing alerts that
    nothing on their GPUs can relieve, and names its alerts in ``mark_also``: those then
    mark the node like ``mark_node`` alerts.
    """

    message: WebhookMessage
    partial: bool
    now: float
    mark_also: frozenset[str] = frozenset()


#: what one alert action does with its alerts of a webhook (all of them, maybe none)
Handler = Callable[[list[Alert], Delivery], Report]


def by_action(
    alerts: Iterable[Alert], actions: Mapping[str, AlertAction]
) -> tuple[dict[AlertAction, list[Alert]], list[Alert]]:
    """The alerts by the action ``actions`` (alert name -> action) gives them, in order, and
    those it names no action for (irrelevant: answered 200 and skipped)."""
    routed: dict[AlertAction, list[Alert]] = {}
    irrelevant: list[Alert] = []
    for alert in alerts:
        action = actions.get(alert.name)
        if action is None:
            irrelevant.append(alert)
        else:
            routed.setdefault(action, []).append(alert)
    return routed, irrelevant
