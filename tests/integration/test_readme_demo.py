"""README's "Your own container on the demo stack", run as written against a real stack.

The stack is the demo's (``LocalStack``: private dockerd, gpusim, exporter, guard, actuator,
Prometheus, Alertmanager) in ``<tmp>/.stack``, on free ports; the commands are the ``$``
lines of the README's example, run by bash from ``<tmp>`` with ``.venv/bin`` on ``PATH``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.contract import RUNNING_PHASES
from gpuguard.demo.stack.localstack import USER_RUN_EXAMPLE, LocalStack
from gpuguard.demo.stack.process import ServiceError
from tests.prereq import unavailable
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "### Your own container on the demo stack"


def readme_example() -> tuple[list[str], list[str]]:
    """The example's commands, and the output README shows for ``gpuguard ps``."""
    text = README.read_text().split(SECTION, 1)[1]
    block = re.search(r"```\n(.*?)```", text, re.S)
    assert block, "README's demo section has no example block"
    commands: list[str] = []
    shown: list[str] = []
    for line in block.group(1).splitlines():
        if line.startswith("$ "):
            commands.append(line[2:])
        elif commands and commands[-1] == "gpuguard ps":
            shown.append(line)
    return commands, shown


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


@pytest.fixture
def demo_dir(short_tmp: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        unavailable("the demo stack needs root (a private dockerd)")
    work = Path(tempfile.mkdtemp(prefix="readme-", dir=short_tmp))
    stack = LocalStack(work / ".stack", time_scale=0.1, default_ports=False)
    try:
        stack.start()
        stack.prepare_user_workloads()
    except ServiceError as exc:
        stack.stop()
        unavailable(f"the demo stack did not start: {exc}")
    yield work
    stack.stop()  # removes every container, rt-1 included


def bash(script: str, cwd: Path) -> str:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("DOCKER_HOST", None)
    done = subprocess.run(
        ["bash", "-c", f"set -e\n{script}"], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_readme_run_and_ps_against_the_demo_stack(demo_dir: Path) -> None:
    """rt-1 and rt-2 started back to back: rt-2 shows ``PAUSED yes`` then ``no``, both
    finish their three tasks, and their kernels overlap at most by what was already launched
    when a task was first seen (one kernel per hand-over)."""
    commands, shown = readme_example()
    assert commands[0] == ". .stack/env"
    assert commands[1] == USER_RUN_EXAMPLE  # what `gpuguard demo` prints, too
    assert commands[2] == USER_RUN_EXAMPLE.replace("rt-1", "rt-2")
    assert commands[-1] == "gpuguard ps"
    header = cells(shown[0])
    rows = {r["NAME"]: r for r in (dict(zip(header, cells(x), strict=True)) for x in shown[1:])}
    running = {phase.value for phase in RUNNING_PHASES}

    def ps_rows() -> dict[str, dict[str, str]]:
        lines = bash(f"{commands[0]}\n{commands[-1]}", demo_dir).splitlines()
        assert cells(lines[0]) == header, lines[0]
        found = (dict(zip(header, cells(line), strict=True)) for line in lines[1:])
        return {r["NAME"]: r for r in found if r["PHASE"] in running}

    bash("\n".join(commands[:3]), demo_dir)  # back to back, as a user types them
    seen = wait_for(lambda: ps_rows().get("rt-1"), 60, "rt-1 computing", interval=0.2)
    for column in ("NAME", "COMMAND", "DEADLINE", "GPU"):
        assert seen[column] == rows["rt-1"][column], (column, seen, rows)
    assert re.fullmatch(r"[0-9a-f]{12}", seen["CONTAINER ID"])
    paused_states: list[str] = []

    def both_done() -> bool:
        now = ps_rows()
        if "rt-2" in now:
            for column in ("NAME", "COMMAND", "DEADLINE", "GPU"):
                assert now["rt-2"][column] == rows["rt-2"][column], (column, now, rows)
            if not paused_states or paused_states[-1] != now["rt-2"]["PAUSED"]:
                paused_states.append(now["rt-2"]["PAUSED"])
        states = bash(f"{commands[0]}\ndocker ps -a --format '{{{{.Names}}}} {{{{.State}}}}'",
                      demo_dir)  # fmt: skip
        return all(f"{name} exited" in states for name in ("rt-1", "rt-2"))

    wait_for(both_done, 120, "rt-1 and rt-2 finishing their three tasks", interval=0.2)
    assert "yes" in paused_states, paused_states
    assert paused_states[paused_states.index("yes") :].count("no") >= 1, paused_states
    kernels = {name: kernel_spans(bash(f"{commands[0]}\ndocker logs {name}", demo_dir))
               for name in ("rt-1", "rt-2")}  # fmt: skip
    assert [len(k) for k in kernels.values()] == [3, 3], kernels
    longest = max(end - start for spans in kernels.values() for start, end in spans)
    overlaps = [
        min(e1, e2) - max(s1, s2)
        for s1, e1 in kernels["rt-1"]
        for s2, e2 in kernels["rt-2"]
        if min(e1, e2) > max(s1, s2)
    ]
    # each overlap is one kernel launched before its task could be seen: it drains, no
    # more (unmanaged, all six overlap pairwise; bench/realtime.py measures both)
    assert all(o <= longest for o in overlaps), (overlaps, kernels)


def kernel_spans(log: str) -> list[tuple[float, float]]:
    """(kernel_start, kernel_end) times from a workload's JSON-lines log."""
    starts: list[float] = []
    spans = []
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if event.get("event") == "kernel_start":
            starts.append(event["t"])
        elif event.get("event") == "kernel_end" and starts:
            spans.append((starts.pop(0), event["t"]))
    return spans
