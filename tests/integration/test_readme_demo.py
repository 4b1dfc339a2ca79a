"""README's "Your own container on the demo stack", run as written against a real stack.

The stack is the demo's (``LocalStack``: private dockerd, gpusim, exporter, guard, actuator,
Prometheus, Alertmanager) in ``<tmp>/.stack``, on free ports; the commands are the ``$``
lines of the README's example, run by bash from ``<tmp>`` with ``.venv/bin`` on ``PATH``.
"""

from __future__ import annotations

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
    commands, shown = readme_example()
    assert commands[0] == ". .stack/env"
    assert commands[1] == USER_RUN_EXAMPLE  # what `gpuguard demo` prints, too
    assert commands[-1] == "gpuguard ps"
    bash("\n".join(commands[:-1]), demo_dir)
    header, row = cells(shown[0]), dict(zip(cells(shown[0]), cells(shown[1]), strict=True))
    running = {phase.value for phase in RUNNING_PHASES}

    def ps_row() -> dict[str, str] | None:
        lines = bash(f"{commands[0]}\n{commands[-1]}", demo_dir).splitlines()
        assert cells(lines[0]) == header, lines[0]
        for line in lines[1:]:
            found = dict(zip(header, cells(line), strict=True))
            if found["NAME"] == "rt-1" and found["PHASE"] in running:
                return found
        return None

    seen = wait_for(ps_row, 60, "rt-1 running a GPU task in `gpuguard ps`", interval=0.3)
    for column in ("NAME", "COMMAND", "DEADLINE", "GPU", "PAUSED"):
        assert seen[column] == row[column], (column, seen, row)
    assert re.fullmatch(r"[0-9a-f]{12}", seen["CONTAINER ID"])
