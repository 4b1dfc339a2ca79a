"""The exporter survives its Docker engine restarting under it: reconnect and resync."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from exporter_support import SCALE, ExporterProcess, restart_dockerd_process

from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.gpusim import GpusimService
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def names(exporter: ExporterProcess) -> dict[str, str]:
    return {c["name"]: c["state"] for c in exporter.state()["containers"]}


def test_reconnects_and_resyncs_after_dockerd_restart(
    dockerd: PrivateDockerd,
    gpusim_daemon: Callable[..., GpusimService],
    run_python_container: Callable[..., Any],
    tmp_path: Path,
) -> None:
    sim = gpusim_daemon(time_scale=SCALE)
    exporter = ExporterProcess(tmp_path, dockerd.url, sim.socket).start()
    try:
        before = run_python_container(["http.server", "--help"], name="before-restart")
        wait_for(
            lambda: "before-restart" in names(exporter),
            timeout=20,
            what="first container seen",
            interval=0.05,
        )
        errors = exporter.metric("gpuguard_exporter_errors_total", source="docker") or 0

        restart_dockerd_process(dockerd)
        after = run_python_container(["http.server", "--help"], name="after-restart")

        wait_for(
            lambda: "after-restart" in names(exporter),
            timeout=20,
            what="container made after restart",
            interval=0.05,
        )
        assert exporter.metric("gpuguard_exporter_collector_success", source="docker") == 1
        restarted_errors = exporter.metric("gpuguard_exporter_errors_total", source="docker")
        assert restarted_errors is not None and restarted_errors > errors
        assert exporter.process.alive()
        # events flow again: removing a container is seen without another resync
        before.remove(force=True)
        wait_for(
            lambda: "before-restart" not in names(exporter),
            timeout=20,
            what="removal after restart",
            interval=0.05,
        )
        after.remove(force=True)
    finally:
        exporter.stop()
