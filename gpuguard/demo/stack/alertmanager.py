"""Run Alertmanager on 127.0.0.1 with ``deploy/alertmanager/alertmanager.yml`` rendered."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import requests
import yaml

from gpuguard import loader, resources
from gpuguard.demo.stack.process import ConfiguredHttpService, ServiceError
from gpuguard.demo.stack.prometheus import LISTEN_HOST

ALERTMANAGER_CONFIG = resources.ALERTMANAGER_DIR / "alertmanager.yml"
# Debian names the binary prometheus-alertmanager; upstream tarballs name it alertmanager.
BINARIES = ("prometheus-alertmanager", "alertmanager")


def render_alertmanager_config(
    webhook_url: str,
    token_file: Path | None,
    source: Path = ALERTMANAGER_CONFIG,
    node_webhooks: Mapping[str, str] | None = None,
    http_config: Mapping[str, Any] | None = None,
) -> str:
    """The deploy config with every webhook pointed at ``webhook_url``, bearer token from
    ``token_file``; routes, timings and inhibitions stay as deployed.

    ``http_config`` (e.g. ``tls_config`` and ``basic_auth`` for an actuator behind
    ``--web.config.file``) replaces the webhooks' ``http_config`` and the token.

    ``node_webhooks`` (node name -> that node's actuator URL) adds one route per node in
    front, each with the deployed sub-routes (the admission timing), as the multi-node
    example in the deploy file describes; alerts without a known node still go to
    ``webhook_url``.
    """
    config: dict[str, Any] = loader.read_yaml(source, "Alertmanager config")
    webhooks = [
        webhook
        for receiver in config.get("receivers", [])
        for webhook in receiver.get("webhook_configs", [])
    ]
    if not webhooks:
        raise ValueError(f"{source} has no webhook receiver to point at the actuator")
    for webhook in webhooks:
        webhook["url"] = webhook_url
        if http_config is not None:
            webhook["http_config"] = copy.deepcopy(dict(http_config))
            continue
        if token_file is None:
            raise ValueError("a token file or an http_config is needed")
        webhook.setdefault("http_config", {})["authorization"] = {
            "type": "Bearer",
            "credentials_file": str(Path(token_file).resolve()),
        }
    if node_webhooks:
        _add_node_routes(config, node_webhooks)
    return yaml.safe_dump(config, sort_keys=False)


def _add_node_routes(config: dict[str, Any], node_webhooks: Mapping[str, str]) -> None:
    route = config["route"]
    template = next(r for r in config["receivers"] if r["name"] == route["receiver"])
    node_routes = []
    for node, url in node_webhooks.items():
        receiver = copy.deepcopy(template)
        receiver["name"] = f"{template['name']}-{node}"
        for webhook in receiver["webhook_configs"]:
            webhook["url"] = url
        config["receivers"].append(receiver)
        # The actuator's sub-routes go to this node's actuator; others (the operators'
        # receiver) stay as they are.
        sub_routes = [
            {
                **copy.deepcopy(sub),
                "receiver": receiver["name"]
                if sub.get("receiver", template["name"]) == template["name"]
                else sub["receiver"],
            }
            for sub in route.get("routes", [])
        ]
        # json.dumps quotes the node name the way Alertmanager's matcher syntax expects.
        node_route: dict[str, Any] = {
            "matchers": [f"node={json.dumps(node)}"],
            "receiver": receiver["name"],
        }
        if sub_routes:
            node_route["routes"] = sub_routes
        node_routes.append(node_route)
    route["routes"] = node_routes + route.get("routes", [])


def alertmanager_binary() -> str:
    for name in BINARIES:
        path = shutil.which(name)
        if path is not None:
            return path
    raise ServiceError(
        "Alertmanager not found: install Debian's prometheus-alertmanager (make setup)"
    )


class AlertmanagerService(ConfiguredHttpService):
    """Alertmanager in its own directory: 127.0.0.1 only, no cluster gossip; stopped by PID."""

    name = "alertmanager"
    config_name = "alertmanager.yml"
    listen_host = LISTEN_HOST

    def __init__(
        self,
        directory: Path,
        webhook_url: str = "http://127.0.0.1:10836/api/v1/alerts",
        token_file: Path | None = None,
        *,
        port: int | None = None,
        config_text: str | None = None,
        node_webhooks: Mapping[str, str] | None = None,
        http_config: Mapping[str, Any] | None = None,
    ) -> None:
        if config_text is None:
            if token_file is None and http_config is None:
                raise ValueError("token_file is required when rendering the deploy config")
            config_text = render_alertmanager_config(
                webhook_url, token_file, node_webhooks=node_webhooks, http_config=http_config
            )
        super().__init__(directory, config_text, port)

    def argv(self) -> list[str]:
        return [
            alertmanager_binary(),
            f"--config.file={self.config_path}",
            f"--storage.path={self.dir / 'data'}",
            f"--web.listen-address={self.address}",
            # Empty: no gossip listener at all, so nothing but the web port is opened.
            "--cluster.listen-address=",
        ]

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts Alertmanager holds now (``/api/v2/alerts``)."""
        response = requests.get(f"{self.url}/api/v2/alerts", timeout=10)
        response.raise_for_status()
        alerts: list[dict[str, Any]] = response.json()
        return alerts
