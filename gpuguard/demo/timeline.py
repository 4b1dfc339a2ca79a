"""The demo's timeline pictures: one panel per run (unmanaged above managed), one lane per
container. Harness only.

From the workloads' own logs: a one-shot task is a bar from its start to its end; a server's
requests are bars numbered from 1, each queued (pale) from its arrival until served (solid),
neighbours in alternating shades, overlapping ones stacked in sub-rows; a training loop's
steps are columns, each as high as the steps it ended in its ``RATE_BIN_S``. Every deadline
is a tick on its own request's (or task's) sub-row, joined to its bar by a dotted line. The
frozen spans come from the actuator's audit log (``pause`` and ``unpause`` actions), hatched
over the lane. The layout here is pure; matplotlib (the ``bench`` extra) is imported only to
draw.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuguard.contract import Result, Verb
from gpuguard.demo.stack.scenario import RequestResult, ScenarioResult, StepResult

Span = tuple[float, float]
#: a training loop's steps are counted per this many seconds
RATE_BIN_S = 0.5

#: per outcome (met, missed, no deadline): the two alternating shades, then a request's
#: queued part
COLORS = {
    True: ("#2e8b57", "#145a32", "#a9dfbf"),
    False: ("#e03131", "#8b1a1a", "#f5b7b1"),
    None: ("#4682b4", "#1f4e79", "#aed6f1"),
}


@dataclass(frozen=True)
class Bar:
    """A task or a request on its lane: queued from ``start`` until ``served`` (None: it
    ran from its start), done at ``end``."""

    start: float
    end: float
    met: bool | None  # None: no deadline
    row: int = 0  # sub-row within the lane: overlapping requests stack
    deadline: float | None = None  # its own absolute deadline
    served: float | None = None
    label: str = ""  # a request's number
    shade: int = 0  # 0 or 1, alternating between neighbours


@dataclass(frozen=True)
class Rate:
    """A training loop's steps ended on the device within ``[start, end)``."""

    start: float
    end: float
    steps: int


@dataclass(frozen=True)
class Lane:
    """One container's row."""

    name: str
    bars: tuple[Bar, ...]
    pauses: tuple[Span, ...]
    rows: int = 1
    rates: tuple[Rate, ...] = ()

    @property
    def deadlines(self) -> tuple[float, ...]:
        """Absolute deadlines, one per bar that has one."""
        return tuple(b.deadline for b in self.bars if b.deadline is not None)


@dataclass(frozen=True)
class Panel:
    """One run of a scene: its lanes, times drawn from ``origin``."""

    title: str
    origin: float
    lanes: tuple[Lane, ...]


def frozen_spans(audit: Iterable[Mapping[str, Any]], until: float) -> dict[str, list[Span]]:
    """Each container's frozen intervals from the actuator's audit log: from a pause that
    took (when its processes were all frozen) to the unpause that followed (open ones end at
    ``until``)."""
    spans: dict[str, list[Span]] = {}
    since: dict[str, float] = {}
    actions = [r for r in audit if r.get("event") == "action" and r.get("container")]
    for record in sorted(actions, key=lambda r: float(r["ts"])):
        name = str(record["container"])
        if record.get("result") != Result.OK:
            continue
        if record.get("action") == Verb.PAUSE:
            since.setdefault(name, float(record.get("frozen") or record["ts"]))
        elif record.get("action") == Verb.UNPAUSE and name in since:
            thawed = float(record.get("started") or record["ts"])
            spans.setdefault(name, []).append((since.pop(name), thawed))
    for name, start in since.items():
        spans.setdefault(name, []).append((start, max(start, until)))
    return spans


def pack_rows(spans: Sequence[Span]) -> list[int]:
    """A sub-row for each span (in the order given) such that no two spans on one row
    overlap: the first row free at its start."""
    ends: list[float] = []
    rows = []
    for start, end in spans:
        row = next((i for i, last in enumerate(ends) if last <= start), len(ends))
        if row == len(ends):
            ends.append(end)
        else:
            ends[row] = end
        rows.append(row)
    return rows


def request_bars(requests: Sequence[RequestResult]) -> list[Bar]:
    """A server's requests by arrival, numbered from 1, shades alternating, each with its
    own deadline; stacked where one (with the line out to its deadline) would cross
    another, so that no tick lands on another request's bar."""
    ordered = sorted(requests, key=lambda r: r.arrival)
    reach = [max(r.end, r.arrival + (r.deadline_s or 0.0)) for r in ordered]
    rows = pack_rows([(r.arrival, end) for r, end in zip(ordered, reach, strict=True)])
    return [
        Bar(
            r.arrival,
            r.end,
            r.met_deadline,
            row=row,
            deadline=None if r.deadline_s is None else r.arrival + r.deadline_s,
            served=r.start,
            label=str(r.id + 1),
            shade=i % 2,
        )
        for i, (r, row) in enumerate(zip(ordered, rows, strict=True))
    ]


def step_rates(steps: Sequence[StepResult], bin_s: float = RATE_BIN_S) -> list[Rate]:
    """A training loop's steps counted per ``bin_s`` from its first launch to its last end
    (bins without a step included: a frozen or starved trainer shows as a gap)."""
    if not steps:
        return []
    first = min(s.launched for s in steps)
    count = max(1, math.ceil((max(s.end for s in steps) - first) / bin_s + 1e-9))
    counts = [0] * count
    for step in steps:
        counts[min(int((step.end - first) / bin_s), count - 1)] += 1
    return [Rate(first + i * bin_s, first + (i + 1) * bin_s, n) for i, n in enumerate(counts)]


def lanes(result: ScenarioResult, names: Sequence[str], pauses: Mapping[str, list[Span]]) -> Panel:
    """The lanes of one run, in ``names`` order (its containers)."""
    out = []
    for name in names:
        bars = [
            Bar(t.start, t.end, t.met_deadline, shade=i % 2,
                deadline=None if t.deadline_s is None else t.start + t.deadline_s)
            for i, t in enumerate(x for x in result.tasks if x.container == name)
        ]  # fmt: skip
        bars += request_bars([r for r in result.requests if r.container == name])
        rates = step_rates([s for s in result.steps if s.container == name])
        rows = 1 + max((b.row for b in bars), default=0)
        out.append(Lane(name, tuple(bars), tuple(pauses.get(name, [])), rows, tuple(rates)))
    return Panel(result.name, result.released_at, tuple(out))


def draw(path: Path, title: str, panels: Sequence[Panel]) -> str:
    """Write the picture; returns a line saying where (or why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"timeline not drawn: matplotlib missing (pip install 'gpuguard[bench]'): {path}"
    heights = [sum(_lane_height(lane) for lane in p.lanes) for p in panels]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(13, 2.0 + 0.6 * sum(heights)), sharex=True, squeeze=False,
        gridspec_kw={"height_ratios": [max(h, 1.0) for h in heights]},
    )  # fmt: skip
    # one scale for every trainer's columns: unmanaged and managed compare by height
    full = max((r.steps for p in panels for lane in p.lanes for r in lane.rates), default=0)
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        _panel(ax, panel, full)
    ends = [b.end - p.origin for p in panels for lane in p.lanes for b in lane.bars]
    ends += [d - p.origin for p in panels for lane in p.lanes for d in lane.deadlines]
    ends += [r.end - p.origin for p in panels for lane in p.lanes for r in lane.rates]
    axes[-1, 0].set_xlim(-0.5, max(ends, default=1.0) + 0.5)  # from the release on
    axes[-1, 0].set_xlabel("t: seconds since the run's release")
    fig.suptitle(title, fontsize=12)
    fig.legend(handles=_legend(panels), loc="lower center", ncol=4, frameon=False, fontsize=8.5)
    fig.tight_layout(rect=(0, 0.09, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"timeline: {path}"


def _lane_height(lane: Lane) -> float:
    return 1.0 + 0.45 * (lane.rows - 1)


def _legend(panels: Sequence[Panel]) -> list[Any]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    lanes_ = [lane for p in panels for lane in p.lanes]
    handles: list[Any] = [
        Patch(color=COLORS[True][0], label="met its deadline (neighbours alternate shades)"),
        Patch(color=COLORS[False][0], label="missed its deadline"),
        Patch(color=COLORS[None][0], label="no deadline (batch)"),
        Line2D([], [], color="#333333", marker="|", linestyle=":", markersize=11,
               markeredgewidth=2, label="its deadline, dotted from its own bar"),
    ]  # fmt: skip
    if any(b.served is not None for lane in lanes_ for b in lane.bars):
        handles.append(
            Patch(color=COLORS[True][2], label="request queued (pale, thin), then served")
        )
    if any(lane.rates for lane in lanes_):
        handles.append(
            Patch(color=COLORS[None][0], label=f"training steps per {RATE_BIN_S:g} s (height)")
        )
    if any(lane.pauses for lane in lanes_):
        handles.append(
            Patch(facecolor="#d9d9d9", edgecolor="#444444", hatch="///",
                  label="frozen by the actuator (its audit log)")
        )  # fmt: skip
    return handles


def _panel(ax: Any, panel: Panel, full_rate: int) -> None:
    t0 = panel.origin
    base = 0.0  # the lanes stack upwards, each ``_lane_height`` high
    ticks, names = [], []
    for lane in reversed(panel.lanes):
        height = _lane_height(lane)
        sub = 0.7 * height / lane.rows  # each sub-row's share of the lane's box
        bottom = base + 0.15 * height
        for bar in lane.bars:
            _bar(ax, bar, t0, bottom + (lane.rows - 1 - bar.row) * sub, sub)
        _rates(ax, lane.rates, t0, bottom, 0.7 * height, full_rate)
        for start, end in lane.pauses:  # over the lane: it waits, frozen
            ax.broken_barh([(start - t0, end - start)], (bottom, 0.7 * height),
                           facecolor="#d9d9d9", edgecolor="#444444", hatch="///",
                           linewidth=0.6, alpha=0.85, zorder=3)  # fmt: skip
        ticks.append(base + height / 2)
        names.append(lane.name)
        base += height
    ax.set_yticks(ticks)
    ax.set_yticklabels(names, fontsize=9)
    ax.set_ylim(0.0, base)
    ax.set_title(panel.title, loc="left", fontsize=10)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)


def _bar(ax: Any, bar: Bar, t0: float, bottom: float, height: float) -> None:
    box = (bottom + 0.08 * height, 0.84 * height)
    served = bar.start if bar.served is None else max(bar.start, min(bar.served, bar.end))
    if served > bar.start:  # queued: pale and thin
        ax.broken_barh([(bar.start - t0, served - bar.start)],
                       (box[0] + 0.3 * box[1], 0.4 * box[1]), facecolor=COLORS[bar.met][2],
                       edgecolor="none", zorder=2)  # fmt: skip
    color = COLORS[bar.met][bar.shade]
    ax.broken_barh([(served - t0, max(bar.end - served, 0.01))], box, facecolor=color,
                   edgecolor="white", linewidth=1.0, zorder=2)  # fmt: skip
    middle = box[0] + box[1] / 2
    if bar.label and bar.end - served >= 0.2:
        ax.text((served + bar.end) / 2 - t0, middle, bar.label, ha="center", va="center",
                fontsize=7, color="white", zorder=5)  # fmt: skip
    if bar.deadline is not None:
        if bar.deadline > bar.end:  # the slack left, up to its own deadline
            ax.plot([bar.end - t0, bar.deadline - t0], [middle, middle], linestyle=":",
                    linewidth=1.0, color="#555555", zorder=4)  # fmt: skip
        ax.plot([bar.deadline - t0], [middle], linestyle="", marker="|",
                markersize=max(6.0, 40 * box[1]), markeredgewidth=2, color="#222222",
                zorder=4)  # fmt: skip


def _rates(
    ax: Any, rates: Sequence[Rate], t0: float, bottom: float, height: float, full: int
) -> None:
    for rate in rates:
        if rate.steps:
            ax.broken_barh([(rate.start - t0, rate.end - rate.start)],
                           (bottom, height * rate.steps / full), facecolor=COLORS[None][0],
                           edgecolor="white", linewidth=0.5, zorder=2)  # fmt: skip
