"""Every benchmark refuses a number it cannot run with: one line, exit 2, nothing started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

CASES = [
    ("colocation.py", ["--time-scale", "-1"], "--time-scale: must be above 0, got '-1'"),
    ("colocation.py", ["--duration", "0"], "--duration: must be above 0"),
    ("colocation.py", ["--rate", "nan"], "--rate: must be above 0"),
    ("colocation.py", ["--request-work", "-5"], "--request-work: must be above 0"),
    ("colocation.py", ["--kernels", "0"], "--kernels: must be an integer of at least 1"),
    ("colocation.py", ["--deadline", "soon"], "--deadline: 'soon' is not a number"),
    ("colocation.py", ["--step-work", "-0.4"], "--step-work: must be above 0"),
    ("colocation.py", ["--sync-every", "-1"], "--sync-every: must be an integer of at least 1"),
    ("colocation.py", ["--lead-in", "-3"], "--lead-in: must be above 0"),
    ("contention.py", ["--time-scale", "-0.1"], "--time-scale: must be above 0"),
    ("contention_model.py", ["--time-scale", "0"], "--time-scale: must be above 0"),
    ("contention_model.py", ["--max-n", "0"], "--max-n: must be an integer of at least 1"),
    ("realtime.py", ["--time-scale", "0"], "--time-scale: must be above 0"),
    ("gpu_truth.py", ["--time-scale", "-1"], "--time-scale: must be above 0"),
    ("node_marks.py", ["--time-scale", "-1"], "--time-scale: must be above 0"),
    ("node_marks.py", ["--duration", "-8"], "--duration: must be above 0"),
    ("node_marks.py", ["--burst-requests", "0"], "--burst-requests: must be an integer"),
    ("node_marks.py", ["--median-work", "0"], "--median-work: must be above 0"),
    ("node_marks.py", ["--deadline", "-1"], "--deadline: must be above 0"),
    ("alert_pipeline.py", ["--rounds", "0"], "--rounds: must be an integer of at least 1"),
    ("freeze.py", ["--rounds", "-2"], "--rounds: must be an integer of at least 1"),
]


@pytest.mark.parametrize(
    ("bench", "args", "needle"), CASES, ids=[f"{b} {a[0]}" for b, a, _ in CASES]
)
def test_a_bad_number_is_one_line_and_exit_2(
    bench: str, args: list[str], needle: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / bench), *args],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []
