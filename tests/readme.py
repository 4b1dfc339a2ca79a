"""The README's shell commands, and how each is tested (issue 19 item 4).

Every command in a fenced ``sh`` or ``console`` block of README.md is run as written by a
test, or is listed here with the reason it cannot run where the tests run. ``HOW`` is that
list; ``tests/unit/test_readme.py`` checks it against the README both ways, and the test
each entry names checks that it ran the command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


class By(StrEnum):
    """Where a README command is run."""

    UNIT = "tests/unit/test_readme.py"
    DEMO = "tests/integration/test_readme_demo.py"
    CI = ".ci/run"
    NOT_HERE = "not runnable here"


@dataclass(frozen=True)
class How:
    by: By
    why: str


#: Every README command, and which test runs it as written (or why none can).
HOW: dict[str, How] = {
    "make demo": How(
        By.DEMO,
        "runs `.venv/bin/gpuguard demo` (test_readme checks the recipe), from a scratch "
        "directory standing for the repository root",
    ),
    "make test": How(
        By.CI,
        "the whole suite: CI runs it (`.ci/run`); test_readme checks the recipe and that "
        "`.ci/run` calls it",
    ),
    "make stop": How(
        By.DEMO, "runs `.venv/bin/gpuguard demo --stop` (test_readme checks the recipe)"
    ),
    ". .stack/env": How(By.DEMO, "the demo's env file"),
    'gpuguard run --deadline 9s --managed -d --name rt-1 -v "$GPUSIM_DIR:/run/gpusim" '
    "gpuguard/workload:local --size 13312 --repeat 3 --sleep-between 1": How(
        By.DEMO, "rt-1 on the demo stack"
    ),
    'gpuguard run --deadline 9s --managed -d --name rt-2 -v "$GPUSIM_DIR:/run/gpusim" '
    "gpuguard/workload:local --size 13312 --repeat 3 --sleep-between 1": How(
        By.DEMO, "rt-2 on the demo stack"
    ),
    "gpuguard ps": How(By.DEMO, "its output compared with the README's"),
    "gpuguard ps -a --tasks 3": How(
        By.DEMO, "once both exited: its columns compared with the README's, three verdicts each"
    ),
    "docker rm -f rt-1 rt-2": How(By.DEMO, "removes both"),
    ".venv/bin/gpuguard exporter --gpu.backend nvml": How(
        By.UNIT,
        "needs an NVIDIA GPU and driver to serve: without one, test_readme runs it as written "
        "and checks it stops at once with one line saying what is missing",
    ),
}


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # where the block's first line is in the README (1-based)


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, in order."""
    return [
        Block(m.group(1), m.group(2), text[: m.start()].count("\n") + 2)
        for m in _BLOCK.finditer(text)
    ]


def commands(block: Block) -> list[str]:
    """The shell commands of an ``sh`` block (every line, continuations joined) or a
    ``console`` block (the ``$`` lines); none for any other block."""
    if block.lang == "console":
        return [line[2:] for line in block.text.splitlines() if line.startswith("$ ")]
    if block.lang != "sh":
        return []
    found: list[str] = []
    pending = ""
    for line in block.text.splitlines():
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        line, pending = pending + line, ""
        if line.strip() and not line.lstrip().startswith("#"):
            found.append(line.strip())
    return found


def readme_commands() -> list[str]:
    return [c for b in blocks(README.read_text()) for c in commands(b)]


def section(heading: str) -> str:
    """The README's text under ``heading`` (a whole heading line), to the next heading of
    the same or a higher level."""
    text = README.read_text()
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", text[start:], re.M)]
    return text[start : start + ends[0]] if ends else text[start:]


def block_in(heading: str, lang: str) -> Block:
    """The first ``lang`` block under ``heading``."""
    found = [b for b in blocks(section(heading)) if b.lang == lang]
    assert found, f"README's {heading!r} has no {lang} block"
    return found[0]
