"""prometheus_client's way to expose the exporter's series: the tests' and the benchmark's
reference for the exporter's own ``TextRenderer``.

A custom collector whose ``collect()`` builds fresh metric families from the newest
``PollSnapshot`` on every scrape, and whose ``describe()`` lists them without reading
anything. ``generate_latest`` over it must give the same exposition as ``TextRenderer``
(tests/unit/test_collector.py); bench/exporter_cost.py times both. Part of the harness, never
imported by the runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from gpuguard.exporter.collector import BUCKET_BOUNDS, SPECS, LabelCache, Rows, build_rows
from gpuguard.exporter.poller import PollSnapshot

_FAMILY_TYPES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}


class GpuguardCollector:
    """Collector over ``snapshot()`` (the poller's newest ``PollSnapshot``, or None)."""

    def __init__(self, snapshot: Callable[[], PollSnapshot | None]) -> None:
        self._snapshot = snapshot
        self._cache = LabelCache()

    def describe(self) -> Iterator[Metric]:
        return iter(_to_families(Rows(self._cache)))

    def collect(self) -> Iterator[Metric]:
        return iter(_to_families(build_rows(self._snapshot(), self._cache)))


def _to_families(rows: Rows) -> list[Metric]:
    families: list[Metric] = []
    for name, (kind, doc, labels) in SPECS.items():
        if kind == "histogram":
            hist = HistogramMetricFamily(name, doc, labels=list(labels))
            for label_set, buckets, total in rows.histograms[name]:
                hist.add_metric(
                    list(label_set.values), list(zip(BUCKET_BOUNDS, buckets, strict=True)), total
                )
            families.append(hist)
            continue
        family = _FAMILY_TYPES[kind](name, doc, labels=list(labels))
        for label_set, value in rows.gauges[name]:
            family.add_metric(list(label_set.values), value)
        families.append(family)
    return families
