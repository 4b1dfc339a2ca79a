"""``gpuguard run`` and ``gpuguard ps`` as an operator runs them, on the private engine."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from exporter_support import ExporterProcess

from gpuguard.demo.stack.dockerd import PrivateDockerd
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def gpuguard(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "gpuguard.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_run_labels_the_container_and_ps_shows_its_deadline(
    exporter: ExporterProcess, dockerd: PrivateDockerd, docker_client: Any, base_image: str
) -> None:
    done = gpuguard(
        "run", "--deadline", "9s", "--managed", f"--docker.host={dockerd.url}",
        "-d", "--name", "ps-rt", "--network", "none", base_image, "sleep", "60",
    )  # fmt: skip
    try:
        assert done.returncode == 0, done.stderr
        container = docker_client.containers.get("ps-rt")
        assert container.labels == {"gpuguard.deadline": "9s", "gpuguard.managed": "true"}
        wait_for(
            lambda: any(c["name"] == "ps-rt" for c in exporter.state()["containers"]),
            timeout=20,
            interval=0.05,
        )
        table = gpuguard("ps", f"--exporter.url={exporter.url}")
        assert table.returncode == 0, table.stderr
        header, *rows = table.stdout.splitlines()
        assert header.split()[:3] == ["CONTAINER", "ID", "NAME"] and "DEADLINE" in header
        row = next(r for r in rows if "ps-rt" in r)
        assert container.id[:12] in row and " 9s " in row
        as_json = json.loads(gpuguard("ps", f"--exporter.url={exporter.url}", "--json").stdout)
        assert next(r for r in as_json if r["NAME"] == "ps-rt")["DEADLINE"] == "9s"
    finally:
        for c in docker_client.containers.list(all=True, filters={"name": "ps-rt"}):
            c.remove(force=True)


def test_run_rejects_a_bad_deadline_before_starting_anything(dockerd: PrivateDockerd) -> None:
    done = gpuguard("run", "--deadline", "soon", f"--docker.host={dockerd.url}", "img")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--deadline" in done.stderr


def test_ps_says_when_the_exporter_is_unreachable() -> None:
    from gpuguard.demo.stack.process import free_port

    done = gpuguard("ps", f"--exporter.url=http://127.0.0.1:{free_port()}")
    assert done.returncode == 1 and "no exporter at http://127.0.0.1:" in done.stderr


def test_bad_exporter_config_is_one_line_and_exit_2() -> None:
    done = gpuguard("exporter", "--poll.interval", "often")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("gpuguard exporter: --poll.interval")
