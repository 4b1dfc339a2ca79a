"""The trade-off picture of ``bench/traces.py``: per scenario, the real-time server's p99 over
its alone p99 against the best-effort trainer's throughput over its ideal, one point per
window and arm (shared; managed with the exporter on NVML's samples only, and with the launch
probe; the ideal), the medians marked, for one or more runs of the bench (each a points
file: the actuator's defaults, another controller setting, a fixed duty cycle), so an
operator sees where each sits between "the server as if alone" (y = 1) and "the trainer gets
all the server leaves" (x = 1). A run whose probe did not attach says so in its legend.

    python bench/replay/picture.py POINTS.json [POINTS.json ...] --out docs/img

writes ``traces-<scenario>.png`` for every scenario with a trainer (sparse, dense).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: arms in the order drawn: a points file has shared, nvml, probe and ideal (one written
#: before the probe arm existed has managed)
ARMS = ("shared", "managed", "nvml", "probe", "ideal")
MARKERS = {"shared": "s", "managed": "o", "nvml": "o", "probe": "D", "ideal": "*"}
NAMES = {"shared": "shared", "managed": "managed", "nvml": "NVML only",
         "probe": "launch probe", "ideal": "ideal"}  # fmt: skip


def label_of(doc: dict[str, Any], path: Path) -> str:
    """How a run is named in the legend: its actuator flags, else the defaults."""
    args = doc.get("actuator_args") or []
    return " ".join(a.removeprefix("--") for a in args) if args else f"defaults ({path.stem})"


def arm_label(doc: dict[str, Any], arm: str, run: str) -> str:
    """An arm's legend entry: what it is, the run's label, and a probe that did not attach."""
    if arm == "ideal":
        return "ideal"
    name = NAMES.get(arm, arm)
    if arm == "probe" and doc.get("probe_attached") is False:
        name += " (NOT attached: NVML only)"
    return f"{name}: {run}"


def series(doc: dict[str, Any], scenario: str) -> dict[str, list[tuple[float, float]]]:
    """(be_over_ideal, rt_p99_over_alone) per arm, for one scenario of one points file."""
    out: dict[str, list[tuple[float, float]]] = {}
    for point in (doc.get("points") or {}).get(scenario, {}).get("windows", []):
        x, y = point.get("be_over_ideal"), point.get("rt_p99_over_alone")
        if isinstance(x, int | float) and isinstance(y, int | float):
            out.setdefault(str(point.get("arm")), []).append((float(x), float(y)))
    return out


def draw(runs: Sequence[tuple[str, dict[str, Any]]], scenario: str, out: Path) -> Path | None:
    """One scenario's picture; None when no run has points for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, (label, doc) in enumerate(runs):
        found = series(doc, scenario)
        for arm, points in sorted(found.items(), key=lambda item: _order(item[0])):
            if arm == "ideal" and n > 0:
                continue  # one ideal: the same trainer alone and the same server share
            colour = colours[(n * len(ARMS) + _order(arm)) % len(colours)]
            xs, ys = zip(*points, strict=True)
            name = arm_label(doc, arm, label)
            ax.scatter(xs, ys, marker=MARKERS.get(arm, "x"), alpha=0.35, color=colour, s=20)
            ax.scatter([statistics.median(xs)], [statistics.median(ys)], color=colour, s=120,
                       marker=MARKERS.get(arm, "x"), edgecolors="black", label=name)  # fmt: skip
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_yscale("log")
    ax.set_xlabel("best-effort throughput / ideal (1 = all the server leaves)")
    ax.set_ylabel("real-time p99 / alone (log)")
    ax.set_title(f"bench/traces.py, {scenario}: each window faint, the median bold")
    ax.axhline(1.0, color="grey", linewidth=0.5)
    ax.axvline(1.0, color="grey", linewidth=0.5)
    ax.legend(fontsize=7, loc="upper left")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"traces-{scenario}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _order(arm: str) -> int:
    return ARMS.index(arm) if arm in ARMS else len(ARMS)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/replay/picture.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("points", nargs="+", type=Path, help="points files of bench/traces.py runs")
    p.add_argument("--out", type=Path, default=Path("docs/img"), help="the pictures' folder")
    args = p.parse_args(argv)
    runs = []
    for path in args.points:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            p.exit(2, f"bench/replay/picture.py: error: {path}: {exc}\n")
        if not isinstance(doc, dict):
            p.exit(2, f"bench/replay/picture.py: error: {path}: not a points file\n")
        runs.append((label_of(doc, path), doc))
    for scenario in ("sparse", "dense"):
        made = draw(runs, scenario, args.out)
        if made is not None:
            print(made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
