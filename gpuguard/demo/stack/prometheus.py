"""Run Prometheus on 127.0.0.1 with a configuration rendered from ``deploy/prometheus/``
(``gpuguard/deployconfig.py`` renders it with the stack's own targets and ports)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import requests

from gpuguard.demo.stack.process import ConfiguredHttpService, ServiceError
from gpuguard.deployconfig import Targets, render_prometheus_config

LISTEN_HOST = "127.0.0.1"


class PrometheusService(ConfiguredHttpService):
    """``prometheus`` in its own directory, listening on 127.0.0.1 only; stopped by PID.

    Give ``config_text`` to run a config of your own, else the ``profile`` file from
    ``deploy/prometheus/`` is rendered with the given targets (see
    :func:`render_prometheus_config`).
    """

    name = "prometheus"
    config_name = "prometheus.yml"
    listen_host = LISTEN_HOST

    def __init__(
        self,
        directory: Path,
        config_text: str | None = None,
        *,
        port: int | None = None,
        profile: str = "fast",
        exporters: Targets = ("127.0.0.1:10835",),
        actuators: Targets = ("127.0.0.1:10836",),
        alertmanagers: Sequence[str] = ("127.0.0.1:9093",),
        rule_files: Sequence[Path] | None = None,
        external_labels: Mapping[str, str] | None = None,
        tenant_engines: Sequence[str] = (),
        scrape_http_config: Mapping[str, Any] | None = None,
    ) -> None:
        if config_text is None:
            config_text = render_prometheus_config(
                profile=profile,
                exporters=exporters,
                actuators=actuators,
                alertmanagers=alertmanagers,
                rule_files=rule_files,
                external_labels=external_labels,
                tenant_engines=tenant_engines,
                scrape_http_config=scrape_http_config,
            )
        super().__init__(directory, config_text, port)

    def argv(self) -> list[str]:
        binary = shutil.which("prometheus")
        if binary is None:
            raise ServiceError("prometheus not found: install Debian's prometheus (make setup)")
        return [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address={self.address}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1d",
        ]

    def reload(self, config_text: str | None = None) -> None:
        """Write a new config (if given) and ask Prometheus to reload it."""
        if config_text is not None:
            self.config_text = config_text
            self.config_path.write_text(config_text)
        response = requests.post(f"{self.url}/-/reload", timeout=10)
        if response.status_code != 200:
            raise ServiceError(f"prometheus reload failed: {response.text.strip()}")

    def _api(self, path: str, params: dict[str, str] | None = None) -> Any:
        response = requests.get(f"{self.url}{path}", params=params, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise ServiceError(f"prometheus {path}: {body.get('error', response.text)}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the result list of ``/api/v1/query`` (``metric``, ``value``)."""
        data = self._api("/api/v1/query", {"query": expr})
        if data["resultType"] not in ("vector", "matrix"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_value(self, expr: str) -> float | None:
        """The value of a query with one result, None when it has none."""
        result = self.query(expr)
        if not result:
            return None
        if len(result) > 1:
            raise ServiceError(f"{expr!r} has {len(result)} results, expected one")
        return float(result[0]["value"][1])

    def page(self, name: str) -> str:
        """The URL of the web UI's page ``name`` (``alerts``, ``targets``, ``graph``), as this
        server serves it.

        Debian's Prometheus 2.42 ships only the classic UI, under ``/classic/``: ``/alerts``
        is a 404 there and ``/`` redirects to ``/classic/graph``. Upstream 2.x builds serve
        ``/alerts`` (the classic pages too) and 3.x only ``/alerts``: so ask.
        """
        for path in (f"/{name}", f"/classic/{name}"):
            try:
                if requests.get(self.url + path, timeout=5).status_code == 200:
                    return self.url + path
            except requests.RequestException:
                break
        return f"{self.url}/{name}"

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts (``/api/v1/alerts``)."""
        alerts: list[dict[str, Any]] = self._api("/api/v1/alerts")["alerts"]
        return alerts

    def targets(self) -> list[dict[str, Any]]:
        """Active scrape targets with their health (``/api/v1/targets``)."""
        targets: list[dict[str, Any]] = self._api("/api/v1/targets")["activeTargets"]
        return targets
