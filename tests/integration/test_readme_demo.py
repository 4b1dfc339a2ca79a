"""README's getting-started path, run as written: ``make demo``, then "Your own container"
against the stack it leaves up, then ``make stop``.

``make demo`` and ``make stop`` run ``.venv/bin/gpuguard demo`` and ``gpuguard demo
--stop`` (``tests/unit/test_readme.py`` checks the recipes); here they run from a scratch
directory standing for the repository root (``<tmp>``, so the demo's ``.stack`` is
``<tmp>/.stack`` and a developer's own demo is left alone), by bash with ``.venv/bin`` on
``PATH``. The ``$`` lines of the README's example run in a new shell's ``PATH``, without the
venv: ``. .stack/env`` is all they have (issue 26: the demo's closing hint failed there).
``tests/readme.py`` lists which README command runs where.
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
import requests

from gpuguard.contract import RUNNING_PHASES
from gpuguard.demo.stack.localstack import USER_RUN_EXAMPLE
from tests.prereq import unavailable
from tests.readme import HOW, By, block_in, blocks, section
from tests.readme import commands as commands_of
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

OWN_CONTAINER = "### 2. Your own container"
#: README's make targets, and what they run here (tests/unit/test_readme.py checks the recipes)
MAKE = {"make demo": "gpuguard demo", "make stop": "gpuguard demo --stop"}
DEMO_TIMEOUT_S = 600
#: a login shell's PATH on Debian: nothing of gpuguard's
NEW_SHELL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def readme_example() -> tuple[list[str], list[str]]:
    """The example's commands, and the output README shows for ``gpuguard ps``."""
    commands: list[str] = []
    shown: list[str] = []
    for line in block_in(OWN_CONTAINER, "console").text.splitlines():
        if line.startswith("$ "):
            commands.append(line[2:])
        elif commands and commands[-1] == "gpuguard ps":
            shown.append(line)
    return commands, shown


def readme_finished() -> tuple[str, list[str]]:
    """The example's second console block: ``gpuguard ps -a --tasks 3`` and its output."""
    block = [b for b in blocks(section(OWN_CONTAINER)) if b.lang == "console"][1]
    (command,) = commands_of(block)
    return command, [line for line in block.text.splitlines() if not line.startswith("$ ")]


def readme_report() -> list[str]:
    """What README's "What the demo shows" says the report holds: each line's label."""
    text = block_in("## What the demo shows", "text").text
    return [re.split(r"\s{2,}", line.strip())[0] for line in text.splitlines() if line.strip()]


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


@pytest.fixture
def demo_dir(short_tmp: Path) -> Iterator[Path]:
    """``make demo`` run from ``<tmp>``; ``make stop`` afterwards, whatever happened."""
    if os.geteuid() != 0:
        unavailable("the demo needs root (a private dockerd)")
    work = Path(tempfile.mkdtemp(prefix="readme-", dir=short_tmp))
    try:
        out = bash(MAKE["make demo"], work, timeout=DEMO_TIMEOUT_S)
        check_report(out)
        yield work
    finally:
        stopped = bash(MAKE["make stop"], work)
        assert "stopped" in stopped or "nothing running" in stopped, stopped
        assert not (work / ".stack" / "stack.json").exists()


def check_report(out: str) -> None:
    """The demo printed the report README shows (its labels, in order) and its URLs."""
    lines = [line.strip() for line in out.splitlines()]
    at = 0
    for label in readme_report():
        found = [i for i in range(at, len(lines)) if lines[i].startswith(label)]
        assert found, f"README shows {label!r}; the demo did not print it after line {at}:\n{out}"
        at = found[0] + 1
    assert "The stack is up on 127.0.0.1:" in out, out


def bash(script: str, cwd: Path, timeout: float = 120, new_shell: bool = False) -> str:
    """``script`` run by bash in ``cwd``; with the venv on ``PATH``, or as a new shell."""
    path = NEW_SHELL_PATH if new_shell else f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = dict(os.environ, PATH=path)
    env.pop("DOCKER_HOST", None)
    done = subprocess.run(
        ["bash", "-c", f"set -e\n{script}"], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_readme_run_and_ps_against_the_demo_stack(demo_dir: Path) -> None:
    """rt-1 and rt-2 started back to back, in a new shell: rt-2 shows ``PAUSED yes`` then
    ``no``, both finish their three tasks, each seen by the exporter as a task of its own, and
    their kernels overlap at most by what was already launched when a task was first seen
    (one kernel per hand-over)."""
    commands, shown = readme_example()
    assert commands[0] == ". .stack/env"
    assert commands[1] == USER_RUN_EXAMPLE  # what `gpuguard demo` prints, too
    assert commands[2] == USER_RUN_EXAMPLE.replace("rt-1", "rt-2")
    assert commands[-1] == "gpuguard ps"
    header = cells(shown[0])
    rows = {r["NAME"]: r for r in (dict(zip(header, cells(x), strict=True)) for x in shown[1:])}
    running = {phase.value for phase in RUNNING_PHASES}

    def ps_rows() -> dict[str, dict[str, str]]:
        lines = bash(f"{commands[0]}\n{commands[-1]}", demo_dir, new_shell=True).splitlines()
        assert cells(lines[0]) == header, lines[0]
        found = (dict(zip(header, cells(line), strict=True)) for line in lines[1:])
        return {r["NAME"]: r for r in found if r["PHASE"] in running}

    bash("\n".join(commands[:3]), demo_dir, new_shell=True)  # as a user types them
    seen = wait_for(lambda: ps_rows().get("rt-1"), 60, "rt-1 computing", interval=0.2)
    for column in ("NAME", "COMMAND", "DEADLINE", "GPU"):
        assert seen[column] == rows["rt-1"][column], (column, seen, rows)
    assert re.fullmatch(r"[0-9a-f]{12}", seen["CONTAINER ID"])
    # each container's PAUSED values in turn, and the phases a paused task showed
    paused_states: dict[str, list[str]] = {"rt-1": [], "rt-2": []}
    paused_phases: set[str] = set()

    def both_done() -> bool:
        now = ps_rows()
        for name, row in now.items():
            for column in ("NAME", "COMMAND", "DEADLINE", "GPU"):
                assert row[column] == rows[name][column], (column, now, rows)
            states = paused_states[name]
            if not states or states[-1] != row["PAUSED"]:
                states.append(row["PAUSED"])
            if row["PAUSED"] == "yes":
                paused_phases.add(row["PHASE"])
        states = bash(f"{commands[0]}\ndocker ps -a --format '{{{{.Names}}}} {{{{.State}}}}'",
                      demo_dir, new_shell=True)  # fmt: skip
        return all(f"{name} exited" in states for name in ("rt-1", "rt-2"))

    wait_for(both_done, 120, "rt-1 and rt-2 finishing their three tasks", interval=0.2)
    print(f"PAUSED in turn: {paused_states}; phases while paused: {sorted(paused_phases)}")
    # README: whichever task starts while the other computes waits (yes, then no)
    waited = [s for s in paused_states.values() if "yes" in s and "no" in s[s.index("yes") :]]
    assert waited, paused_states
    assert paused_phases <= set(PAUSED_PHASES), paused_phases
    check_finished(demo_dir, commands[0])
    kernels = {name: kernel_spans(bash(f"{commands[0]}\ndocker logs {name}", demo_dir, True))
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
    # README: with --sleep-between 1 each repetition is a task of its own, judged against
    # the 9 s (back to back, rt-2's three were timed as one: issue 26)
    exporter = env_value(demo_dir, "GPUGUARD_EXPORTER_URL")

    def judged() -> dict[str, list[tuple[str, bool | None]]] | None:
        recent = requests.get(exporter + "/api/v1/state", timeout=5).json()["recent"]
        tasks = {name: [(str(t["boundary"]), t.get("met_deadline")) for t in recent
                        if t.get("container") == name and t.get("boundary") != "no_kernel"]
                 for name in ("rt-1", "rt-2")}  # fmt: skip
        return tasks if all(len(v) >= 3 for v in tasks.values()) else None

    tasks = wait_for(judged, 10, "the exporter's three tasks of rt-1 and rt-2", interval=0.5)
    for name, seen in tasks.items():
        assert len(seen) == 3, (name, tasks)
        assert all(b == "exact" and met is not None for b, met in seen), (name, tasks)

    (remove,) = commands_of(block_in(OWN_CONTAINER, "sh"))
    assert remove == "docker rm -f rt-1 rt-2"
    bash(f"{commands[0]}\n{remove}", demo_dir, new_shell=True)
    names = bash(f"{commands[0]}\ndocker ps -a --format '{{{{.Names}}}}'", demo_dir, True)
    assert "rt-" not in names
    ran = {*MAKE, *commands, readme_finished()[0], remove}
    assert not [c for c, how in HOW.items() if how.by is By.DEMO and c not in ran]


#: the phases README says a paused task shows
PAUSED_PHASES = ("starting", "input", "computing")


def check_finished(demo_dir: Path, env: str) -> None:
    """README's ``gpuguard ps -a --tasks 3`` once both exited: the columns it shows, MET and
    MISSED adding up to three tasks each, and the three listed with a verdict."""
    command, shown = readme_finished()
    out = bash(f"{env}\n{command}", demo_dir, new_shell=True)
    print(out)
    table, _, tasks = out.partition("\n\n")
    shown_table, _, shown_tasks = "\n".join(shown).partition("\n\n")
    header = cells(shown_table.splitlines()[0])
    lines = table.splitlines()
    assert cells(lines[0]) == header, lines[0]
    found = {r["NAME"]: r for r in (dict(zip(header, cells(x), strict=True)) for x in lines[1:])}
    for name in ("rt-1", "rt-2"):
        assert int(found[name]["MET"]) + int(found[name]["MISSED"]) == 3, found
    task_lines = tasks.splitlines()
    assert task_lines[0] == shown_tasks.splitlines()[0]  # the line that says what follows
    task_header = cells(shown_tasks.splitlines()[1])
    assert cells(task_lines[1]) == task_header, task_lines[1]
    verdicts = [dict(zip(task_header, cells(x), strict=True)) for x in task_lines[2:]]
    for name in ("rt-1", "rt-2"):
        mine = [v["VERDICT"] for v in verdicts if v["NAME"] == name]
        assert len(mine) == 3 and set(mine) <= {"met", "MISSED"}, verdicts
        assert mine.count("met") == int(found[name]["MET"]), (mine, found)


def env_value(demo_dir: Path, name: str) -> str:
    """A value ``.stack/env`` exports, as a new shell sees it after sourcing it."""
    return bash(f'. .stack/env\nprintf %s "${name}"', demo_dir, new_shell=True)


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
