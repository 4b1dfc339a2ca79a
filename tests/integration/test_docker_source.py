"""An exporter that may not open the Docker socket says so instead of serving a quiet,
unattributed view: /healthz names the failure and collector_success{source="docker"} is 0.

The exporter runs as root without CAP_DAC_OVERRIDE (``setpriv``) against a socket owned by
another user with mode 0600: the permission error a missing supplementary group gives.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

import pytest
import requests

from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.process import ManagedProcess, free_port
from tests.prereq import unavailable
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def test_exporter_without_access_to_docker_reports_it(
    sim: GpusimService, short_tmp: Path, tmp_path: Path
) -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        unavailable("needs root and setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
    path = short_tmp / f"denied-{os.getpid()}.sock"
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    os.chown(path, 4242, 4242)
    path.chmod(0o600)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        setpriv, "--bounding-set=-dac_override,-dac_read_search", "--",
        sys.executable, "-m", "gpuguard.cli", "exporter",
        f"--web.listen-address=127.0.0.1:{port}", "--gpu.backend=gpusim",
        f"--gpusim.socket={sim.socket}", f"--docker.host=unix://{path}",
        "--node.name=itest", "--poll.interval=50ms",
    ]  # fmt: skip
    exporter = ManagedProcess("exporter", argv, tmp_path / "exporter.log").start()
    try:
        exporter.wait_ready(lambda: requests.get(url + "/healthz", timeout=1).ok, 30)

        def health() -> str:
            return requests.get(url + "/healthz", timeout=5).text

        wait_for(lambda: "docker" in health(), 10, "/healthz to name the docker source")
        reply = requests.get(url + "/healthz", timeout=5)
        assert reply.status_code == 200  # still serving GPU data; a restart would not help
        assert reply.text.startswith("degraded: docker source failing"), reply.text
        assert "Permission denied" in reply.text, reply.text
        metrics = requests.get(url + "/metrics", timeout=5).text
        assert 'gpuguard_exporter_collector_success{node="itest",source="docker"} 0.0' in metrics
        state = requests.get(url + "/api/v1/state", timeout=5).json()
        assert state["sources"]["docker"] is False
    finally:
        exporter.stop()
        listener.close()
        path.unlink(missing_ok=True)
