"""``bench/realtime.py --smoke`` runs every scenario on a real stack (private dockerd, gpusim,
exporter, actuator, real containers) and ends with the JSON line issue 15 asks for.

Only its shape is checked: figures are the benchmark's business (the design measures
performance by benchmarks, never by timed tests), and today's policy misses most targets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.prereq import require_binary, unavailable

pytestmark = [pytest.mark.integration, pytest.mark.standalone]

REPO = Path(__file__).resolve().parents[2]
KEYS = (
    "overlap_s_unmanaged", "overlap_s_managed",
    "pair_tight_hit_rate_shared", "pair_tight_hit_rate_managed",
    "dense_rt_p99_alone_ms", "dense_rt_p99_shared_ms", "dense_rt_p99_managed_ms",
    "dense_be_steps_shared", "dense_be_steps_managed", "dense_flaps_per_min",
    "node_marked_fraction", "freeze_p95_ms_burst10",
)  # fmt: skip
#: (d) and (e) are hooks for benchmarks written elsewhere: null until they exist
MEASURED_HERE = KEYS[:-2]


def test_smoke_run_ends_with_every_key() -> None:
    require_binary("dockerd")
    if os.geteuid() != 0:
        unavailable("the benchmark's private dockerd needs root")
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "realtime.py"), "--smoke"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(KEYS) <= set(line), sorted(set(KEYS) - set(line))
    assert all(line[key] is not None for key in MEASURED_HERE), line
    assert line["mode"] == "smoke"
    # the unmanaged repeaters' kernels met on the GPU; every run's audit was read
    assert line["overlap_s_unmanaged"] > 0
    assert set(line["actions"]) == {"repeaters", "pair", "dense"}
    assert line["actuator_flags"]["pair"] == ["--policy.order=edf"]
    for key, scenario in (
        ("node_marked_fraction", "node_marks"),
        ("freeze_p95_ms_burst10", "freeze"),
    ):
        if line[key] is None:  # a hook not written yet says so
            assert any(note.startswith(f"{scenario}:") for note in line["notes"]), line["notes"]
