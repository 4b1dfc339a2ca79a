"""deploy/kubernetes/alertmanagerconfig.yaml as the Prometheus Operator merges it into the
Alertmanager it runs, beside kube-prometheus-stack's default configuration.

The operator (v0.6x, default ``alertmanagerConfigMatcherStrategy: OnNamespace``) renames each
receiver ``<namespace>/<object>/<receiver>``, adds a ``namespace="<namespace>"`` matcher to the
object's top route, to its inhibit rules' source and target, and puts that route first under
the root with ``continue: true``. A Secret reference becomes the token's value.
"""

from __future__ import annotations

import copy
from typing import Any

# kube-prometheus-stack's values.yaml `alertmanager.config` (the chart's defaults).
KUBE_PROMETHEUS_STACK_INHIBIT_RULES: list[dict[str, Any]] = [
    {
        "source_matchers": ["severity = critical"],
        "target_matchers": ["severity =~ warning|info"],
        "equal": ["namespace", "alertname"],
    },
    {
        "source_matchers": ["severity = warning"],
        "target_matchers": ["severity = info"],
        "equal": ["namespace", "alertname"],
    },
    {
        "source_matchers": ["alertname = InfoInhibitor"],
        "target_matchers": ["severity = info"],
        "equal": ["namespace"],
    },
    {"target_matchers": ["alertname = InfoInhibitor"]},
]

_ROUTE_KEYS = {
    "receiver": "receiver",
    "groupBy": "group_by",
    "groupWait": "group_wait",
    "groupInterval": "group_interval",
    "repeatInterval": "repeat_interval",
    "continue": "continue",
}


def matcher(item: dict[str, Any]) -> str:
    """``{name, matchType, value}`` as Alertmanager's matcher syntax."""
    value = str(item["value"]).replace("\\", "\\\\").replace('"', '\\"')
    return f'{item["name"]}{item.get("matchType", "=")}"{value}"'


def route(spec: dict[str, Any], prefix: str) -> dict[str, Any]:
    """One AlertmanagerConfig route in alertmanager.yml's spelling."""
    result: dict[str, Any] = {}
    if spec.get("matchers"):
        result["matchers"] = [matcher(m) for m in spec["matchers"]]
    for key, name in _ROUTE_KEYS.items():
        if key in spec:
            result[name] = prefix + spec[key] if key == "receiver" else spec[key]
    if spec.get("routes"):
        result["routes"] = [route(sub, prefix) for sub in spec["routes"]]
    return result


def merged(
    document: dict[str, Any], secrets: dict[tuple[str, str], str]
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(top route, receivers, inhibit rules) of ``document`` as the operator renders them.

    ``secrets`` maps (Secret name, key) to the value the operator would read.
    """
    namespace = document["metadata"]["namespace"]
    prefix = f"{namespace}/{document['metadata']['name']}/"
    own = f'namespace="{namespace}"'
    spec = document["spec"]
    top = route(spec["route"], prefix)
    top["matchers"] = [own, *top.get("matchers", [])]
    top["continue"] = True
    receivers = []
    for receiver in spec["receivers"]:
        webhooks = []
        for webhook in receiver.get("webhookConfigs", []):
            auth = webhook["httpConfig"]["authorization"]
            ref = auth["credentials"]
            webhooks.append(
                {
                    "url": webhook["url"],
                    "send_resolved": webhook.get("sendResolved", True),
                    "max_alerts": webhook.get("maxAlerts", 0),
                    "http_config": {
                        "authorization": {
                            "type": auth.get("type", "Bearer"),
                            "credentials": secrets[(ref["name"], ref["key"])],
                        }
                    },
                }
            )
        receivers.append({"name": prefix + receiver["name"], "webhook_configs": webhooks})
    inhibit = [
        {
            "source_matchers": [own, *(matcher(m) for m in rule["sourceMatch"])],
            "target_matchers": [own, *(matcher(m) for m in rule["targetMatch"])],
            "equal": list(rule.get("equal", [])),
        }
        for rule in spec.get("inhibitRules", [])
    ]
    return top, receivers, inhibit


def kube_prometheus_stack_config(
    document: dict[str, Any],
    secrets: dict[tuple[str, str], str],
    webhook_urls: list[str] | None = None,
) -> dict[str, Any]:
    """kube-prometheus-stack's default Alertmanager configuration (root receiver "null",
    Watchdog to "null", its default inhibit rules) with ``document`` merged in.

    ``webhook_urls`` replaces the example nodes' actuator URLs of every receiver.
    """
    top, receivers, inhibit = merged(document, secrets)
    if webhook_urls is not None:
        for receiver in receivers:
            template = receiver["webhook_configs"][0]
            receiver["webhook_configs"] = [
                {**copy.deepcopy(template), "url": url} for url in webhook_urls
            ]
    return {
        "global": {"resolve_timeout": "5m"},
        "route": {
            "receiver": "null",
            "group_by": ["namespace"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "12h",
            "routes": [top, {"receiver": "null", "matchers": ['alertname = "Watchdog"']}],
        },
        "receivers": [{"name": "null"}, *receivers],
        "inhibit_rules": [*inhibit, *copy.deepcopy(KUBE_PROMETHEUS_STACK_INHIBIT_RULES)],
    }
