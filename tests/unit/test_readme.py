"""The README for its readers (issue 19 item 4): the two commands first, every command in it
run as written by some test (``tests/readme.py`` says which) or said why not, the papers
named with full references once, and every folder in its map."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.readme import HOW, README, REPO, By, blocks, readme_commands

DOCS = sorted((REPO / "docs").glob("*.md"))
#: The papers' titles: named once, in the README's "The papers"; elsewhere "paper A" etc.
TITLES = (
    "Deadline information management techniques to support real-time GPU tasks",
    "GPU Resource Contention Management Technique for Simultaneous GPU Tasks",
    "Real-Time GPU Task Monitoring and Node List Management Techniques",
)


def test_the_first_screen_gives_the_two_commands() -> None:
    text = README.read_text()
    first = blocks(text)[0]
    assert first.lang == "sh"
    assert first.text.splitlines() == ["make demo", "make test"]
    assert first.line < 20, "the two commands must be on the first screen"


def test_the_readme_stays_a_place_to_learn() -> None:
    """Reference and benchmark material belongs in docs/, linked from the README."""
    assert len(README.read_text().splitlines()) <= 300


def test_every_readme_command_is_run_by_a_test_or_says_why_not() -> None:
    found = readme_commands()
    assert len(found) == len(set(found)), "a command twice: say it once"
    untested = [c for c in found if c not in HOW]
    assert not untested, f"add each to tests/readme.py's HOW, with its test: {untested}"
    stale = [c for c in HOW if c not in found]
    assert not stale, f"no longer in the README, remove from HOW: {stale}"
    for how in HOW.values():
        assert how.why
        if how.by not in (By.CI, By.NOT_HERE):
            assert (REPO / how.by.value).is_file(), how.by


def _dry_run(target: str) -> str:
    done = subprocess.run(["make", "-n", "-s", target], cwd=REPO, capture_output=True,
                          text=True, timeout=30, check=True)  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


#: the last step of ``make integration`` and ``make test``: the tests on real services
SERVICES = (
    '.venv/bin/python -m pytest tests/integration -m "not standalone" -n 2 --dist loadfile '
    "--durations=15"
)


@pytest.mark.parametrize(("target", "runs"), [
    ("demo", ".venv/bin/gpuguard demo"),
    ("stop", ".venv/bin/gpuguard demo --stop"),
    ("unit", ".venv/bin/python -m pytest tests/unit -n auto -q"),
    ("rules", ".venv/bin/python -m pytest tests/rules -q"),
    ("integration", SERVICES),
    ("test", SERVICES),
])  # fmt: skip
def test_make_targets_run_what_the_tests_run(target: str, runs: str) -> None:
    """test_readme_demo runs ``gpuguard demo`` and ``gpuguard demo --stop`` for ``make
    demo`` and ``make stop``: this binds them to the Makefile's recipes."""
    if not (REPO / ".venv" / "bin" / "gpuguard").exists():
        pytest.skip("no .venv: make setup makes it")
    assert _dry_run(target) == runs


def test_make_test_runs_every_test_folder() -> None:
    """``make test`` splits the suite (unit and rules, benchmarks, tests on real services):
    every folder of tests/ is still run by one of its pytest commands."""
    if not (REPO / ".venv" / "bin" / "gpuguard").exists():
        pytest.skip("no .venv: make setup makes it")
    done = subprocess.run(["make", "-n", "-s", "test"], cwd=REPO, capture_output=True,
                          text=True, timeout=30, check=True)  # fmt: skip
    runs = [line.split() for line in done.stdout.splitlines() if " -m pytest " in line]
    folders = {f"tests/{test.parent.name}" for test in (REPO / "tests").glob("*/test_*.py")}
    assert folders <= {word for run in runs for word in run}, runs


def test_ci_runs_the_readme_test_command() -> None:
    script = (REPO / ".ci" / "run").read_text().splitlines()
    assert script[-1] == "make test"


def test_the_gpu_host_check_says_what_is_missing_without_a_gpu() -> None:
    """``.venv/bin/gpuguard exporter --gpu.backend nvml`` as the README writes it: on a
    host without an NVIDIA driver, one line naming NVML and what to install, exit 1, at
    once; on a GPU host it serves, and is stopped after a few seconds."""
    command = ".venv/bin/gpuguard exporter --gpu.backend nvml"
    assert command in HOW
    if not (REPO / ".venv" / "bin" / "gpuguard").exists():
        pytest.skip("no .venv: make setup makes it")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.Popen(command.split(), cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:  # a GPU: the exporter serves until stopped
        proc.terminate()
        proc.communicate(timeout=15)
        return
    assert proc.returncode == 1, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "NVML" in lines[0] and "driver" in lines[0], err


def test_the_papers_are_named_in_full_once() -> None:
    readme = " ".join(README.read_text().split())  # titles wrap across lines
    for title in TITLES:
        assert readme.count(title) == 1, title
        assert not [d.name for d in DOCS if title in " ".join(d.read_text().split())], title
    papers = README.read_text().split("\n## The papers\n", 1)[1].split("\n## ", 1)[0]
    for paper in ("Paper A", "Paper B", "Paper C"):
        assert f"**{paper}**" in papers
    assert papers.count("doi:") == 2  # paper A, in conference proceedings, has none


def test_the_folder_map_names_every_folder() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.splitlines()  # fmt: skip
    folders = {path.split("/", 1)[0] for path in tracked if "/" in path}
    folders = {f for f in folders if not f.startswith(".")}
    layout = README.read_text().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    missing = [f for f in sorted(folders) if f"| `{f}/` |" not in layout]
    assert not missing, f"README's Layout lacks {missing}"


def _scratch_checkout(tmp_path: Path) -> tuple[Path, subprocess.Popen[bytes]]:
    """The Makefile in a scratch directory standing for a checkout after ``make demo``: the
    venv's ``gpuguard`` (a link to this checkout's) and a ``.stack/`` that records one live
    process the way the demo records its gpusim (by PID and a name in its command line)."""
    if not (REPO / ".venv" / "bin" / "gpuguard").exists():
        pytest.skip("no .venv: make setup makes it")
    (tmp_path / "Makefile").write_bytes((REPO / "Makefile").read_bytes())
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "gpuguard").symlink_to(REPO / ".venv" / "bin" / "gpuguard")
    stack = tmp_path / ".stack"
    (stack / "logs").mkdir(parents=True)
    (stack / "logs" / "gpusim.log").write_text("serving\n")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "gpusim"])
    entry = {"kind": "process", "name": "gpusim", "pid": proc.pid}
    (stack / "stack.json").write_text(json.dumps([entry]))
    return tmp_path, proc


def test_make_clean_stops_the_demo_and_removes_its_stack(tmp_path: Path) -> None:
    """Issue 26: ``make clean`` left ``.stack/`` (199 MB) and the demo running."""
    checkout, proc = _scratch_checkout(tmp_path)
    try:
        done = subprocess.run(["make", "-s", "clean"], cwd=checkout, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "stopped 1 processes" in done.stdout
        assert proc.wait(timeout=10) == -signal.SIGTERM  # stopped by the demo's --stop
        assert sorted(p.name for p in checkout.iterdir()) == ["Makefile"]
        assert (REPO / ".venv" / "bin" / "gpuguard").exists()  # only the link went
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_make_clean_leaves_a_stack_with_something_mounted_in_it(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    checkout, proc = _scratch_checkout(tmp_path)
    mount = checkout / ".stack" / "exec" / "netns"
    mount.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True,
                   timeout=10)  # fmt: skip
    try:
        (mount / "default").write_text("a namespace dockerd left bound\n")
        done = subprocess.run(["make", "-s", "clean"], cwd=checkout, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode != 0
        assert "something is still mounted under .stack/" in done.stderr, done.stderr
        assert (mount / "default").exists() and (checkout / ".venv").exists()
    finally:
        subprocess.run(["umount", str(mount)], check=True, timeout=10)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
