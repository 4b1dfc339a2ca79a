"""Fixtures for the integration tests: the exporter on gpusim, and the alerting stack (real
Prometheus and Alertmanager on 127.0.0.1).

``sim`` and ``exporter`` run at ``exporter_support.SCALE`` with default flags on one GPU; a
module changes that by overriding ``sim_time_scale`` or ``exporter_flags``, a test its
devices by parametrizing ``sim_options``.

Each factory starts a service in its own temporary directory and stops every service it
started by PID at teardown, even when the test failed. A missing binary or a service that
does not come up fails the test under ``CI=true`` and skips it elsewhere (``tests/prereq.py``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from containerd_support import (  # noqa: F401 - the containerd fixtures
    containerd,
    k8s_exporter,
    k8s_exporter_flags,
    pods,
)
from exporter_support import SCALE, ExporterProcess

from gpuguard.demo.stack.alertmanager import BINARIES, AlertmanagerService
from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.prometheus import PrometheusService
from tests.prereq import Services, require_binary, unavailable


@pytest.fixture
def sim_time_scale() -> float:
    """gpusim's time scale for ``sim``: a kernel of W device-seconds lasts W * scale s."""
    return SCALE


@pytest.fixture
def exporter_flags() -> tuple[str, ...]:
    """Command-line flags ``exporter`` adds to those of ExporterProcess."""
    return ()


@pytest.fixture
def sim_options() -> dict[str, object]:
    """More ``gpusim serve`` flags for ``sim`` (a test parametrizes it: devices, MIG)."""
    return {}


@pytest.fixture
def sim(
    gpusim_daemon: Callable[..., GpusimService],
    sim_time_scale: float,
    sim_options: dict[str, object],
) -> GpusimService:
    return gpusim_daemon(time_scale=sim_time_scale, **sim_options)


@pytest.fixture
def exporter(
    dockerd: PrivateDockerd, sim: GpusimService, tmp_path: Path, exporter_flags: tuple[str, ...]
) -> Iterator[ExporterProcess]:
    process = ExporterProcess(tmp_path, dockerd.url, sim.socket, *exporter_flags).start()
    yield process
    process.stop()


@pytest.fixture
def prometheus_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., PrometheusService]]:
    """Start ``PrometheusService(dir, **kwargs)`` (fast profile unless told otherwise)."""
    services = Services()

    def start(**kwargs: Any) -> PrometheusService:
        require_binary("prometheus")
        directory = tmp_path_factory.mktemp("prometheus")
        return services.start(PrometheusService(directory, **kwargs), "prometheus")

    yield start
    services.stop_all()


@pytest.fixture
def alertmanager_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., AlertmanagerService]]:
    """Start ``AlertmanagerService(dir, webhook_url, token_file, **kwargs)``."""
    services = Services()

    def start(webhook_url: str, token_file: Path | None, **kwargs: Any) -> AlertmanagerService:
        if not any(shutil.which(name) for name in BINARIES):
            unavailable("prometheus-alertmanager not installed (make setup installs it)")
        directory = tmp_path_factory.mktemp("alertmanager")
        service = AlertmanagerService(directory, webhook_url, token_file, **kwargs)
        return services.start(service, "alertmanager")

    yield start
    services.stop_all()
