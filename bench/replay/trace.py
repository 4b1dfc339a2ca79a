"""Production inference traces: checked, cut into windows, turned into server schedules (pure).

The traces are subsets of the Azure LLM inference traces 2023 (``bench/traces/README.md``
says where they come from, under which licence, and how they were cut): one hour of a
code-completion service and one of a conversation service, each request's arrival and its
context and generated token counts. Nothing is downloaded: each file is read from a
directory on disk and checked against its sha256 before use.

A request's GPU time is modelled from its tokens as ``context + decode_cost x generated``
units: prefill is compute-bound and linear in the context; each generated token is one
decode step, memory-bound, whose cost a batch of requests shares (at the default
``decode_cost`` of 10, one generated token costs the GPU what ten context tokens do). The
units are then scaled so that the server keeps ``share`` of the GPU busy over its window.
A window is a slice of one trace replayed ``compress`` times faster than it happened.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuguard.gpusim.workload.server import percentile

#: the subsets' header (``bench/traces/README.md``: TIMESTAMP as seconds after the first row)
HEADER = "offset_s,context_tokens,generated_tokens"


class TraceError(Exception):
    """A trace that is missing, altered or malformed: one line saying which and why."""


@dataclass(frozen=True)
class TraceFile:
    """One shipped subset: its name in the bench, its file, and what it must hash to."""

    name: str
    file: str
    sha256: str
    rows: int


TRACE_FILES: tuple[TraceFile, ...] = (
    TraceFile(
        "conv", "azure-llm-2023-conv.csv",
        "d2291a23df7b3cd5d7b4a90c4042e91d5ef20064b9f286b5ed014df37ba17359", 19366,
    ),
    TraceFile(
        "code", "azure-llm-2023-code.csv",
        "a8710de531a9fc8f3b54186001433fdf624134d2129159dc11dccc5c6c774307", 8819,
    ),
)  # fmt: skip


@dataclass(frozen=True)
class Request:
    """One request of a trace: seconds after the trace's first, and its token counts."""

    offset: float
    context: int
    generated: int


@dataclass(frozen=True)
class Job:
    """One request as a server replays it: wall seconds after its start, kernel wall seconds."""

    offset: float
    work: float


@dataclass(frozen=True)
class Window:
    """A slice of one trace (trace seconds), and the seed its draws use."""

    index: int
    trace: str
    start: float
    length: float
    seed: int

    def label(self) -> str:
        return f"w{self.index}"


def trace_dirs(repo: Path) -> list[Path]:
    """Where the subsets are looked for: beside the bench, then a ``shared/traces`` inside the
    checkout, then the one beside it (the steering repository's ``shared/``), then, for a
    ``git worktree`` checkout, the one beside its main checkout."""
    dirs = [
        repo / "bench" / "traces",
        repo / "shared" / "traces",
        repo.parent / "shared" / "traces",
    ]
    main = main_checkout(repo)
    if main is not None and main.parent != repo.parent:
        dirs.append(main.parent / "shared" / "traces")
    return dirs


def main_checkout(repo: Path) -> Path | None:
    """The main working tree of a ``git worktree`` checkout, whose ``.git`` is a file naming
    ``<main>/.git/worktrees/<name>``; None for any other checkout."""
    try:
        text = (repo / ".git").read_text().strip()
    except OSError:  # a directory (a plain clone) or nothing
        return None
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(text.removeprefix("gitdir:").strip())
    gitdir = gitdir if gitdir.is_absolute() else repo / gitdir
    if gitdir.parent.name != "worktrees" or gitdir.parent.parent.name != ".git":
        return None
    return gitdir.parent.parent.parent


def find_trace_dir(candidates: Sequence[Path]) -> Path:
    """The first directory holding every subset (raises TraceError naming where it looked)."""
    for directory in candidates:
        if all((directory / t.file).is_file() for t in TRACE_FILES):
            return directory
    files = ", ".join(t.file for t in TRACE_FILES)
    where = ", ".join(str(d) for d in candidates)
    raise TraceError(
        f"the trace subsets ({files}) are in none of {where}; bench/traces/README.md says "
        "where they come from (or give --trace-dir)"
    )


#: the synthetic stand-in's shape per trace: requests a second, and the median context and
#: generated tokens (lognormal, sigma 1): read off the production subsets' own statistics
_SYNTHETIC_SHAPE = {"conv": (5.4, 1000, 200), "code": (2.45, 2000, 20)}


def synthetic_traces(seed: int, span_s: float = 3600.0) -> dict[str, list[Request]]:
    """A seeded stand-in with the subsets' names, rates and heavy-tailed token counts, for a
    checkout that lacks the production subsets (the workplace keeps fetched data out of the
    project's commits): it exercises the bench end to end, and says nothing about production
    traffic. Arrivals are Poisson at a rate that swings between 0.2x and 1.8x its mean over
    five minutes (by thinning), as the traces' busy and quiet spells do."""
    rng = random.Random(seed)
    out: dict[str, list[Request]] = {}
    for name, (rate, context, generated) in _SYNTHETIC_SHAPE.items():
        requests: list[Request] = []
        t = rng.expovariate(1.8 * rate)
        while t < span_s:
            if rng.random() < (1 + 0.8 * math.sin(2 * math.pi * t / 300.0)) / 1.8:
                requests.append(
                    Request(
                        round(t, 3),
                        max(1, int(rng.lognormvariate(math.log(context), 1.0))),
                        max(1, int(rng.lognormvariate(math.log(generated), 1.0))),
                    )
                )
            t += rng.expovariate(1.8 * rate)
        out[name] = requests
    return out


def load_traces(directory: Path) -> dict[str, list[Request]]:
    """Every subset in ``directory``, each checked against its sha256 first."""
    return {t.name: load_trace(directory / t.file, t.sha256) for t in TRACE_FILES}


def load_trace(path: Path, sha256: str) -> list[Request]:
    """One subset, refused unless its bytes hash to ``sha256``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise TraceError(
            f"{path}: sha256 {digest}, expected {sha256}: not the subset "
            "bench/traces/README.md describes"
        )
    return parse_trace_csv(data.decode("utf-8", errors="replace").splitlines(), path.name)


def parse_trace_csv(lines: Iterable[str], name: str) -> list[Request]:
    """``offset_s,context_tokens,generated_tokens`` rows in time order (raises TraceError)."""
    rows = iter(lines)
    header = next(rows, "").strip()
    if header != HEADER:
        raise TraceError(f"{name}: line 1: expected the header {HEADER!r}, got {header!r}")
    requests: list[Request] = []
    for number, line in enumerate(rows, 2):
        if not line.strip():
            continue
        fields = line.split(",")
        try:
            if len(fields) != 3:
                raise ValueError(f"3 fields expected, got {len(fields)}")
            offset, context, generated = float(fields[0]), int(fields[1]), int(fields[2])
            if not math.isfinite(offset) or offset < 0 or context < 0 or generated < 0:
                raise ValueError("values must be >= 0")
        except ValueError as exc:
            raise TraceError(f"{name}: line {number}: {exc}") from None
        if requests and offset < requests[-1].offset:
            raise TraceError(f"{name}: line {number}: offset goes back in time")
        requests.append(Request(offset, context, generated))
    if not requests:
        raise TraceError(f"{name}: no requests")
    return requests


def plan_windows(count: int, spans: dict[str, float], length: float, seed: int) -> list[Window]:
    """``count`` windows of ``length`` trace seconds, taking the traces in turn (in the order
    of ``spans``), each trace's windows spread evenly over its span: the j-th of m centred at
    (j + 1/2)/m of it, so that no part of a trace is chosen for how it behaves."""
    names = list(spans)
    per_trace = {name: len(range(i, count, len(names))) for i, name in enumerate(names)}
    windows = []
    for index in range(count):
        name = names[index % len(names)]
        j, m = index // len(names), per_trace[name]
        centre = (j + 0.5) * spans[name] / m
        start = min(max(0.0, centre - length / 2), max(0.0, spans[name] - length))
        windows.append(Window(index, name, round(start, 3), length, seed + index))
    return windows


def requests_in(requests: Sequence[Request], window: Window) -> list[Request]:
    """The requests that arrived within the window."""
    end = window.start + window.length
    return [r for r in requests if window.start <= r.offset < end]


def draw(requests: Sequence[Request], count: int | None, seed: int) -> list[Request]:
    """``count`` of them at random (all when None or too few), in time order: the requests
    one GPU of a fleet serves, when a balancer spreads them."""
    if count is None or count >= len(requests):
        return list(requests)
    chosen = sorted(random.Random(seed).sample(range(len(requests)), count))
    return [requests[i] for i in chosen]


def units(request: Request, decode_cost: float) -> float:
    """A request's GPU time in context-token units."""
    return request.context + decode_cost * request.generated


def schedule(
    requests: Sequence[Request],
    window: Window,
    compress: float,
    share: float,
    decode_cost: float,
) -> list[Job]:
    """The requests as a server replays them: arrivals ``compress`` times faster, kernel
    times in proportion to ``units`` and summing to ``share`` of the window's wall length."""
    if not requests:
        return []
    wall = window.length / compress
    total = sum(units(r, decode_cost) for r in requests)
    # a request of 0 tokens still costs a launch: never a job of no work
    per_unit = share * wall / total if total > 0 else 0.0
    floor = 1e-4
    return [
        Job(round((r.offset - window.start) / compress, 6),
            round(max(floor, per_unit * units(r, decode_cost)), 6))
        for r in requests
    ]  # fmt: skip


def fifo_latencies(jobs: Sequence[Job]) -> list[float]:
    """Each job's latency if the server ran alone with nothing else on its GPU: it answers in
    arrival order, one at a time (what its schedule costs before anything else does)."""
    latencies, free = [], 0.0
    for job in jobs:
        free = max(job.offset, free) + job.work
        latencies.append(free - job.offset)
    return latencies


def deadline_ms(jobs: Sequence[Job], factor: float, floor_s: float) -> int:
    """A request deadline the server meets alone with room: ``factor`` x its own p99 alone
    (``fifo_latencies``), at least ``floor_s``, rounded up to 10 ms."""
    p99 = percentile(fifo_latencies(jobs), 0.99) or 0.0
    return 10 * math.ceil(100 * max(floor_s, factor * p99))
