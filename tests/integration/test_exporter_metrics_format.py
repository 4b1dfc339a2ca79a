"""/metrics is valid Prometheus exposition: a golden file and live output, by promtool.

Regenerate the golden file after an intended change with
``GPUGUARD_UPDATE_GOLDEN=1 pytest tests/integration/test_exporter_metrics_format.py``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from exporter_support import SCALE, ExporterProcess

from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.exporter.collector import TextRenderer, build_rows
from gpuguard.exporter.poller import SourceStatus
from gpuguard.slo import SloDeclaration
from tests.prereq import require_binary

# the unit tests' fakes, shared on purpose: the golden scene is built from the same parts
from tests.unit.exporter_fakes import GIB, sample, three_container_poller
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "exporter_metrics.prom"


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool")
    return subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )


def golden_text(tmp_path: Path) -> str:
    """The exposition of a fixed scene: every metric family has at least one series but
    the busy-time counters (present once a container had a merged burst: none here)."""
    backend, containers, poller = three_container_poller(
        tmp_path / "proc", ("rt-1", "batch", 'odd"name')
    )
    rt, batch, odd = containers.snapshot().values()
    slo = SloDeclaration("vllm:e2e_request_latency_seconds", 1.0, 0.99, 8000)
    # batch runs in a Kubernetes pod (the containerd source): namespace and pod on its series
    pod = {"pod_namespace": "team-a", "pod_name": "batch-0", "pod_uid": "5f3c2a1e-7d1b"}
    containers.set(
        replace(rt, slo=slo),
        replace(batch, **pod),
        replace(odd, task_mode_error="invalid gpuguard.task 'x'"),
    )
    procs = {100: GIB, 200: 2 * GIB, 300: GIB}
    backend.next = sample(1_763_775_999.9, {})  # the tasks are seen to begin: exact
    poller.poll_once()
    for t in (1_763_776_000.0, 1_763_776_000.2):  # a whole sample period: its demand
        backend.next = sample(t, procs, sm={100: 0.5})
        poller.poll_once()
    backend.next = sample(1_763_776_000.5, {200: 2 * GIB, 300: GIB})
    poller.poll_once()  # rt-1's task ended: a run time for the histogram
    backend.next = sample(1_763_776_001.0, procs, sm={100: 0.5, 200: 0.25})
    snap = poller.poll_once()
    # the durations are measured; pin them so the file is stable

    snap = replace(
        snap,
        poll_duration_s=0.0004,
        sources={k: SourceStatus(v.success, 0.0001, v.errors) for k, v in snap.sources.items()},
    )
    return TextRenderer().render(build_rows(snap)).decode()


def test_golden_metrics_pass_promtool(tmp_path: Path) -> None:
    text = golden_text(tmp_path)
    if os.environ.get("GPUGUARD_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "rendering changed: regenerate the golden file"
    checked = promtool_check(text)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_live_metrics_pass_promtool(
    dockerd: PrivateDockerd, gpusim_daemon: Callable[..., GpusimService], tmp_path: Path
) -> None:
    sim = gpusim_daemon(time_scale=SCALE)
    exporter = ExporterProcess(tmp_path, dockerd.url, sim.socket).start()
    try:
        wait_for(
            lambda: (exporter.metric("gpuguard_exporter_polls_total") or 0) > 2,
            timeout=20,
            interval=0.05,
        )
        reply = exporter.get("/metrics")
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        checked = promtool_check(reply.text)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    finally:
        exporter.stop()
