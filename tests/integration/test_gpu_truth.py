"""The real-GPU truth kit, run here on gpusim (no GPU): every section runs through the same
code a GPU machine runs, and the freezer really freezes a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from gputruth.freezer import CgroupFreezer, FreezerError  # noqa: E402

from gpuguard.gpusim.profile import load_profile  # noqa: E402
from tests.prereq import unavailable  # noqa: E402

KEYS = (
    "backend", "gpu_name", "start_err_mean_s", "end_err_mean_s", "burst_start_err_mean_s",
    "burst_end_err_mean_s", "freeze_drain_ms_p95", "contention_max_rel_error_vs_gpusim",
)  # fmt: skip


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_cgroup_freezer_freezes_and_thaws_a_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        try:
            freezer = CgroupFreezer(f"gpuguard-test-{os.getpid()}")
        except (FreezerError, OSError) as exc:
            unavailable(f"no cgroup freezer here: {exc}")
        with freezer:
            freezer.add(child.pid)
            freezer.freeze()
            assert freezer.frozen()
            ticks = Path(f"/proc/{child.pid}/stat").read_text().split()[13]
            time.sleep(0.3)
            assert Path(f"/proc/{child.pid}/stat").read_text().split()[13] == ticks
            freezer.thaw()
            assert not freezer.frozen()
        assert not freezer.path.exists()
        assert _state(child.pid) in "RS"
    finally:
        child.kill()
        child.wait()


@pytest.mark.standalone
def test_kit_runs_every_section_on_gpusim(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_truth.py"), "--quick", "--backend", "gpusim",
         "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(result.get(key) is not None for key in KEYS), result
    assert result["backend"] == "gpusim"
    for name, found in result["detection"].items():
        assert found["tasks"] > 0, (name, found)
        # A server's request is a 200 ms burst on gpusim, about one NVML sample: now and then
        # (once in about eight runs, alone or under the suite's load) one of the four is not
        # seen at all, with the other three found within 20 ms. The kit reports it as a
        # figure; the test allows that one, and no more.
        missed = 1 if name.startswith("server_burst") else 0
        assert found["tasks"] - missed <= found["matched"] <= found["tasks"], (name, found)
    assert result["nvml"]["process_listed_from"] == "context"
    assert result["nvml"]["freed_memory_stays_listed"] is True
    assert result["freeze"]["freeze_drain_ms_p95"] > 0  # queued kernels ran on after the freeze
    # gpusim measured against its own model: the kit's contention path adds no error
    assert result["contention_max_rel_error_vs_gpusim"] < 0.05
    probe = result["launch_probe"]
    if probe["attached"]:  # root with clang here; the kit says why where not
        assert probe["runs_matched"] == probe["runs"] > 0
        # a uprobe's trap costs microseconds; an unprobed call well under one
        assert probe["query_ns_unprobed"] < 2_000 < probe["probe_ns_per_query"]
    saved = json.loads((tmp_path / "gpu-truth-gpusim.json").read_text())
    assert saved["backend"] == "gpusim"
    profile = load_profile(str(tmp_path / "profile-gpusim.json"))
    assert len(profile.concurrent_kernel_s) == len(result["contention"]["rows"])
