"""Run Alertmanager on 127.0.0.1 with ``deploy/alertmanager/alertmanager.yml`` rendered
(by ``gpuguard/deployconfig.py``)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import requests

from gpuguard.demo.stack.process import ConfiguredHttpService, ServiceError
from gpuguard.demo.stack.prometheus import LISTEN_HOST
from gpuguard.deployconfig import render_alertmanager_config

# Debian names the binary prometheus-alertmanager; upstream tarballs name it alertmanager.
BINARIES = ("prometheus-alertmanager", "alertmanager")


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
