"""Writes to the state directory that fail: counted, logged once per change, never fatal.

Why: docs/design-notes.md, "Failed writes to the state directory".
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuguard.files import FileRefused

#: what is written there: the journal, a lease, ``journal.lock`` (its holder's PID), the
#: audit log
FILES = ("journal", "lease", "lock", "audit")
#: why a write failed
REASONS = ("no_space", "read_only", "not_a_file", "other")

#: how a log line names each
_SAID = {"journal": "journal", "lease": "lease", "lock": "lock file", "audit": "audit log"}
_REASON_BY_ERRNO = {
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "no_space",
    errno.EFBIG: "no_space",
    errno.EROFS: "read_only",
    errno.EACCES: "read_only",
    errno.EPERM: "read_only",
    errno.EISDIR: "not_a_file",
    errno.ENOTDIR: "not_a_file",
    errno.ELOOP: "not_a_file",
    errno.ENXIO: "not_a_file",
}


def reason_of(exc: OSError) -> str:
    """The ``reason`` label of a failed write (pure)."""
    if isinstance(exc, FileRefused):
        return "not_a_file"
    return _REASON_BY_ERRNO.get(exc.errno or 0, "other")


@dataclass(frozen=True)
class Failing:
    """A file whose last write failed: why, since when (monotonic), how often since."""

    reason: str
    detail: str
    since: float
    failures: int


class StateWrites:
    """Every write to one state directory, as its writers report them; thread-safe."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("gpuguard.state")
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {(f, r): 0 for f in FILES for r in REASONS}
        self._failing: dict[str, Failing] = {}

    def ok(self, file: str) -> None:
        """``file`` was written; logged when it failed before."""
        with self._lock:
            was = self._failing.pop(file, None)
        if was is not None:
            self.log.info(
                "%s written again, after %d failed write(s) over %.0fs",
                _SAID.get(file, file), was.failures, time.monotonic() - was.since,
            )  # fmt: skip

    def failed(self, file: str, path: Path, exc: OSError) -> None:
        """A write of ``file`` at ``path`` failed; counted, and logged when it is news."""
        reason = reason_of(exc)
        detail = f"{path}: {exc.strerror or exc}"
        with self._lock:
            self._counts[(file, reason)] = self._counts.get((file, reason), 0) + 1
            was = self._failing.get(file)
            news = was is None or was.reason != reason
            since = time.monotonic() if was is None else was.since
            failures = 1 if was is None else was.failures + 1
            self._failing[file] = Failing(reason, detail, since, failures)
        if news:
            said = _SAID.get(file, file)
            self.log.error("cannot write the %s (%s): %s; retrying", said, reason, detail)

    def failing(self) -> dict[str, Failing]:
        """The files whose last write failed."""
        with self._lock:
            return dict(self._failing)

    def counts(self) -> dict[tuple[str, str], int]:
        """Failed writes so far by (file, reason), every pair present."""
        with self._lock:
            return dict(self._counts)


def failures_family(name: str, writes: StateWrites) -> CounterMetricFamily:
    """``<name>_total{file,reason}``, every label pair from the start."""
    family = CounterMetricFamily(
        name, "Failed writes to the state directory, by file and why.", labels=["file", "reason"]
    )
    for (file, reason), count in sorted(writes.counts().items()):
        family.add_metric([file, reason], count)
    return family


class StateWritesCollector(Collector):
    """The failures counter of ``writes``, fresh on every scrape."""

    def __init__(self, name: str, writes: StateWrites) -> None:
        self.name = name
        self.writes = writes

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        yield failures_family(self.name, self.writes)
