"""The demo's timeline pictures: each container's tasks as bars, its pauses shaded, its
deadlines marked, one panel per run (unmanaged above managed). Harness only.

The bars come from the workloads' own logs (a one-shot task from its start to its end, a
server's request from its arrival to its answer, a training loop's steps as the device ran
them); the pauses from the exporter's ``container_paused``/``container_resumed`` events.
matplotlib (the ``bench`` extra) is imported only to draw.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuguard.contract import EventType
from gpuguard.demo.stack.scenario import ScenarioResult, StepResult

#: steps closer than this on the device are drawn as one bar
STEP_MERGE_S = 0.05
Span = tuple[float, float]

COLORS = {True: "#2e8b57", False: "#d62728", None: "#4682b4"}  # met, missed, no deadline


@dataclass(frozen=True)
class Bar:
    """A task (or a request, or a run of training steps) on the timeline."""

    start: float
    end: float
    met: bool | None  # None: no deadline


@dataclass(frozen=True)
class Lane:
    """One container's row."""

    name: str
    bars: tuple[Bar, ...]
    pauses: tuple[Span, ...]
    deadlines: tuple[float, ...]  # absolute deadlines (wall clock)


@dataclass(frozen=True)
class Panel:
    """One run of a scene: its lanes, times drawn from ``origin``."""

    title: str
    origin: float
    lanes: tuple[Lane, ...]


def pause_spans(events: Iterable[Mapping[str, Any]], until: float) -> dict[str, list[Span]]:
    """Each container's paused intervals from the exporter's events (open ones end at
    ``until``)."""
    spans: dict[str, list[Span]] = {}
    since: dict[str, float] = {}
    for event in sorted(events, key=lambda e: float(e["ts"])):
        name = event.get("container")
        if not name:
            continue
        if event["type"] == EventType.CONTAINER_PAUSED:
            since.setdefault(name, float(event["ts"]))
        elif event["type"] == EventType.CONTAINER_RESUMED and name in since:
            spans.setdefault(name, []).append((since.pop(name), float(event["ts"])))
    for name, start in since.items():
        spans.setdefault(name, []).append((start, max(start, until)))
    return spans


def step_bars(steps: Sequence[StepResult]) -> list[Bar]:
    """A training loop's steps as the device ran them, neighbours merged into one bar."""
    bars: list[Bar] = []
    previous_end: float | None = None
    for step in sorted(steps, key=lambda s: s.end):
        start = step.launched if previous_end is None else max(step.launched, previous_end)
        previous_end = step.end
        if bars and start - bars[-1].end <= STEP_MERGE_S:
            bars[-1] = Bar(bars[-1].start, step.end, None)
        else:
            bars.append(Bar(start, step.end, None))
    return bars


def lanes(result: ScenarioResult, names: Sequence[str], pauses: Mapping[str, list[Span]]) -> Panel:
    """The lanes of one run, in ``names`` order (its containers)."""
    out = []
    for name in names:
        bars = [Bar(t.start, t.end, t.met_deadline) for t in result.tasks if t.container == name]
        deadlines = [t.start + t.deadline_s for t in result.tasks if t.container == name and
                     t.deadline_s is not None]  # fmt: skip
        for r in result.requests:
            if r.container == name:
                bars.append(Bar(r.arrival, r.end, r.met_deadline))
                if r.deadline_s is not None:
                    deadlines.append(r.arrival + r.deadline_s)
        bars += step_bars([s for s in result.steps if s.container == name])
        out.append(Lane(name, tuple(bars), tuple(pauses.get(name, [])), tuple(deadlines)))
    return Panel(result.name, result.released_at, tuple(out))


def draw(path: Path, title: str, panels: Sequence[Panel]) -> str:
    """Write the picture; returns a line saying where (or why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError:
        return f"timeline not drawn: matplotlib missing (pip install 'gpuguard[bench]'): {path}"
    rows = [len(p.lanes) for p in panels]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(12, 1.6 + 0.55 * sum(rows)), sharex=True, squeeze=False,
        gridspec_kw={"height_ratios": [max(r, 1) for r in rows]},
    )  # fmt: skip
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        _panel(ax, panel)
    ends = [b.end - p.origin for p in panels for lane in p.lanes for b in lane.bars]
    ends += [d - p.origin for p in panels for lane in p.lanes for d in lane.deadlines]
    axes[-1, 0].set_xlim(-0.5, max(ends, default=1.0) + 0.5)  # from the release on
    axes[-1, 0].set_xlabel("seconds since the scenario's release")
    fig.suptitle(title, fontsize=12)
    legend = [
        Patch(color=COLORS[True], label="task met its deadline"),
        Patch(color=COLORS[False], label="task missed its deadline"),
        Patch(color=COLORS[None], label="no deadline (batch, training)"),
        Patch(facecolor="#bbbbbb", edgecolor="#555555", hatch="///", label="container paused"),
        Line2D(
            [],
            [],
            color="black",
            marker="|",
            linestyle="",
            markersize=12,
            markeredgewidth=2,
            label="deadline",
        ),
    ]
    fig.legend(handles=legend, loc="lower center", ncol=5, frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"timeline: {path}"


def _panel(ax: Any, panel: Panel) -> None:
    t0 = panel.origin
    names = [lane.name for lane in panel.lanes]
    for row, lane in enumerate(reversed(panel.lanes)):
        y = row
        for bar in lane.bars:
            ax.broken_barh([(bar.start - t0, max(bar.end - bar.start, 0.01))], (y - 0.3, 0.6),
                           facecolor=COLORS[bar.met], edgecolor="white", linewidth=0.4,
                           zorder=2)  # fmt: skip
        for start, end in lane.pauses:  # over the bars: the task waits, frozen
            ax.broken_barh([(start - t0, end - start)], (y - 0.3, 0.6), facecolor="#d9d9d9",
                           edgecolor="#444444", hatch="///", linewidth=0.6, alpha=0.9,
                           zorder=3)  # fmt: skip
        if lane.deadlines:
            xs = [d - t0 for d in lane.deadlines]
            ax.plot(xs, [y] * len(xs), linestyle="", marker="|", markersize=16,
                    markeredgewidth=2, color="black", zorder=4)  # fmt: skip
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(list(reversed(names)), fontsize=9)
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.set_title(panel.title, loc="left", fontsize=10)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
