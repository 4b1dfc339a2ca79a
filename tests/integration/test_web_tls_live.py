"""``--web.config.file`` with real TLS against the real Prometheus and Alertmanager.

A throwaway CA signs the servers' and Prometheus' certificates. The exporter requires TLS,
a verified client certificate and basic auth; the actuator TLS and basic auth instead of a
token. Prometheus scrapes both with the shipped config's https variant, the actuator follows
the exporter with ``--exporter.http-config-file``, Alertmanager delivers a webhook with basic
auth over https, and a password rotated in the exporter's web config takes effect without a
restart. Every process is stopped by PID.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from exporter_support import ExporterProcess, sample_value

from gpuguard.actuator.audit import read_audit
from gpuguard.demo.stack.alertmanager import AlertmanagerService
from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.process import ManagedProcess, free_port
from gpuguard.demo.stack.prometheus import PrometheusService
from gpuguard.deployconfig import ACTUATOR_JOB, EXPORTER_JOB
from tests.support.tlscerts import Pki, write_web_config
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def secret(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


class TlsExporter:
    """The exporter behind a web config: TLS, client certificate and basic auth required."""

    def __init__(self, dockerd: PrivateDockerd, sim: GpusimService, tmp: Path, pki: Pki) -> None:
        self.pki = pki
        self.web = write_web_config(
            tmp / "exporter-web.yml", pki, {"prometheus": "scrape-pw", "actuator": "follow-pw"},
            client_auth="RequireAndVerifyClientCert",
        )  # fmt: skip
        self.process = ExporterProcess(
            tmp, dockerd.url, sim.socket, f"--web.config.file={self.web}"
        )
        self.url = f"https://127.0.0.1:{self.process.port}"
        self.address = f"127.0.0.1:{self.process.port}"

    def get(self, path: str, auth: tuple[str, str] | None, cert: bool = True) -> requests.Response:
        pki = self.pki
        client = (str(pki.client_cert), str(pki.client_key)) if cert else None
        return requests.get(self.url + path, verify=str(pki.ca), cert=client, auth=auth, timeout=5)

    def start(self) -> TlsExporter:
        self.process.process.start()
        self.process.process.wait_ready(
            lambda: self.get("/healthz", ("prometheus", "scrape-pw")).ok, 30
        )
        return self


@pytest.fixture
def tls_exporter(
    dockerd: PrivateDockerd, sim: GpusimService, tmp_path: Path, pki: Pki
) -> Iterator[TlsExporter]:
    exporter = TlsExporter(dockerd, sim, tmp_path, pki)
    try:
        yield exporter.start()
    finally:
        exporter.process.stop()


class TlsActuator:
    """The actuator with TLS and basic auth instead of a token, following the TLS exporter."""

    def __init__(self, exporter: TlsExporter, docker_url: str, tmp: Path) -> None:
        pki = exporter.pki
        self.pki = pki
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.address = f"127.0.0.1:{self.port}"
        self.state_dir = tmp / "actuator"
        self.state_dir.mkdir()
        web = write_web_config(
            tmp / "actuator-web.yml", pki,
            {"alertmanager": "hook-pw", "prometheus": "scrape-pw"},
        )  # fmt: skip
        client = tmp / "exporter-client.yml"
        secret(tmp / "actuator.password", "follow-pw")
        client.write_text(
            yaml.safe_dump(
                {
                    "tls_config": {
                        "ca_file": str(pki.ca),
                        "cert_file": str(pki.client_cert),
                        "key_file": str(pki.client_key),
                    },
                    "basic_auth": {"username": "actuator", "password_file": "actuator.password"},
                }
            )
        )
        argv = [
            sys.executable, "-m", "gpuguard.cli", "actuator",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--web.config.file={web}",
            f"--exporter.url={exporter.url}",
            f"--exporter.http-config-file={client}",
            "--exporter.timeout=2s",
            f"--docker.host={docker_url}",
            f"--state.dir={self.state_dir}",
            "--node.name=itest",
            f"--rules.actions={REPO / 'rules' / 'actions.yml'}",
            f"--rules.files={REPO / 'rules' / '*.rules.yml'}",
        ]  # fmt: skip
        self.process = ManagedProcess("actuator", argv, tmp / f"actuator-{self.port}.log")

    def get(self, path: str, auth: tuple[str, str] | None) -> requests.Response:
        return requests.get(self.url + path, verify=str(self.pki.ca), auth=auth, timeout=5)

    def start(self) -> TlsActuator:
        self.process.start()
        self.process.wait_ready(lambda: self.get("/healthz", ("prometheus", "scrape-pw")).ok, 30)
        return self


@pytest.fixture
def tls_actuator(
    tls_exporter: TlsExporter, dockerd: PrivateDockerd, tmp_path: Path
) -> Iterator[TlsActuator]:
    actuator = TlsActuator(tls_exporter, dockerd.url, tmp_path)
    try:
        yield actuator.start()
    finally:
        actuator.process.stop()


def scrape_http_config(pki: Pki, password_file: Path, cert: bool = True) -> dict[str, Any]:
    """The https variant of the shipped scrape jobs (deploy/prometheus/prometheus.yml)."""
    tls: dict[str, str] = {"ca_file": str(pki.ca)}
    if cert:
        tls.update(cert_file=str(pki.client_cert), key_file=str(pki.client_key))
    basic_auth = {"username": "prometheus", "password_file": str(password_file)}
    return {"scheme": "https", "tls_config": tls, "basic_auth": basic_auth}


def targets(prometheus: PrometheusService) -> dict[str, dict[str, Any]]:
    reply = requests.get(prometheus.url + "/api/v1/targets", timeout=5).json()
    return {t["labels"]["job"]: t for t in reply["data"]["activeTargets"]}


def up(prometheus: PrometheusService, job: str) -> float | None:
    return prometheus.query_value(f'up{{job="{job}"}}')


def test_prometheus_scrapes_over_tls_and_a_rotated_password_applies_without_restart(
    tls_exporter: TlsExporter,
    tls_actuator: TlsActuator,
    prometheus_factory: Callable[..., PrometheusService],
    tmp_path: Path,
) -> None:
    pki = tls_exporter.pki
    password = secret(tmp_path / "prometheus.password", "scrape-pw")
    wrong = secret(tmp_path / "wrong.password", "not-the-password")
    prometheus = prometheus_factory(
        exporters=(tls_exporter.address,),
        actuators=(tls_actuator.address,),
        alertmanagers=(),
        scrape_http_config=scrape_http_config(pki, password),
    )
    config = yaml.safe_load(prometheus.config_text)
    for job, http in (
        ("wrong-password", scrape_http_config(pki, wrong)),
        ("no-client-cert", scrape_http_config(pki, password, cert=False)),
    ):
        config["scrape_configs"].append(
            {"job_name": job, "static_configs": [{"targets": [tls_exporter.address]}], **http}
        )
    prometheus.reload(yaml.safe_dump(config, sort_keys=False))

    wait_for(lambda: up(prometheus, EXPORTER_JOB) == 1, 30, "the exporter scraped over TLS")
    wait_for(lambda: up(prometheus, ACTUATOR_JOB) == 1, 30, "the actuator scraped over TLS")
    assert prometheus.query_value('count(gpuguard_gpu_info{node="itest"})') == 1
    # the actuator follows the exporter through its own https client (client cert + basic)
    wait_for(
        lambda: prometheus.query_value("gpuguard_actuator_exporter_up") == 1,
        30, "the actuator reaching the exporter over TLS",
    )  # fmt: skip
    wait_for(lambda: up(prometheus, "wrong-password") == 0, 30, "a wrong password refused")
    wait_for(lambda: up(prometheus, "no-client-cert") == 0, 30, "no client cert refused")
    found = targets(prometheus)
    # Prometheus's words for a refused password; an address in the error may hold "401" too
    assert "HTTP status 401" in found["wrong-password"]["lastError"]
    assert found["no-client-cert"]["lastError"]  # a handshake failure, in Go's words
    assert "HTTP status 401" not in found["no-client-cert"]["lastError"]
    # nothing in clear: the TLS port does not speak plain HTTP
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{tls_exporter.address}/metrics", timeout=5)

    # Rotate the password: a new hash in the web config, no restart.
    pid = tls_exporter.process.process.pid
    write_web_config(
        tls_exporter.web, pki, {"prometheus": "rotated-pw", "actuator": "follow-pw"},
        client_auth="RequireAndVerifyClientCert",
    )  # fmt: skip
    wait_for(
        lambda: tls_exporter.get("/metrics", ("prometheus", "rotated-pw")).status_code == 200,
        10, "the new password accepted",
    )  # fmt: skip
    assert tls_exporter.get("/metrics", ("prometheus", "scrape-pw")).status_code == 401
    with pytest.raises(requests.ConnectionError):  # no client certificate: no connection
        tls_exporter.get("/metrics", ("prometheus", "rotated-pw"), cert=False)
    wait_for(lambda: up(prometheus, EXPORTER_JOB) == 0, 30, "Prometheus' old password refused")
    password.write_text("rotated-pw\n")  # Prometheus reads password_file on every scrape
    wait_for(lambda: up(prometheus, EXPORTER_JOB) == 1, 30, "Prometheus back with the new one")
    assert tls_exporter.process.process.pid == pid and tls_exporter.process.process.alive()
    metrics = tls_exporter.get("/metrics", ("prometheus", "rotated-pw")).text
    assert "gpuguard_web_config_last_reload_successful 1.0" in metrics


def post_alert(alertmanager: AlertmanagerService, labels: dict[str, str]) -> None:
    now = dt.datetime.now(dt.UTC)
    alert = {
        "labels": labels,
        "annotations": {"summary": "TLS webhook test"},
        "startsAt": now.isoformat(),
        "endsAt": (now + dt.timedelta(minutes=5)).isoformat(),
    }
    reply = requests.post(alertmanager.url + "/api/v2/alerts", json=[alert], timeout=5)
    assert reply.status_code == 200, reply.text


def test_alertmanager_delivers_to_the_actuator_over_tls_with_basic_auth(
    tls_actuator: TlsActuator,
    alertmanager_factory: Callable[..., AlertmanagerService],
    tmp_path: Path,
) -> None:
    pki = tls_actuator.pki
    http_config = {
        "tls_config": {"ca_file": str(pki.ca)},
        "basic_auth": {
            "username": "alertmanager",
            "password_file": str(secret(tmp_path / "hook.password", "hook-pw")),
        },
    }
    alertmanager = alertmanager_factory(
        tls_actuator.url + "/api/v1/alerts", None, http_config=http_config
    )
    labels = {"alertname": "GpuguardExporterStale", "node": "itest", "severity": "warning",
              "gpuguard_action": "record"}  # fmt: skip
    post_alert(alertmanager, labels)

    def recorded() -> list[dict[str, Any]]:
        return [
            r for r in read_audit(tls_actuator.state_dir / "audit.jsonl")
            if r.get("event") == "alert" and r.get("alertname") == "GpuguardExporterStale"
        ]  # fmt: skip

    records = wait_for(recorded, 60, "the webhook delivered over https with basic auth")
    assert records[0]["labels"]["node"] == "itest"

    def webhooks(code: str) -> float | None:
        metrics = tls_actuator.get("/metrics", ("prometheus", "scrape-pw")).text
        return sample_value(metrics, "gpuguard_actuator_webhooks_total", code=code)

    assert (webhooks("200") or 0) >= 1 and webhooks("401") == 0
    # without credentials (and without the token the actuator does not have) nothing gets in
    refused = requests.post(
        tls_actuator.url + "/api/v1/alerts", json={}, verify=str(pki.ca), timeout=5
    )
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Basic"
    assert webhooks("401") == 1
