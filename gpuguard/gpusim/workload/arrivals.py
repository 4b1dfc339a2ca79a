"""When a server's requests arrive and how big they are: a rate, bursts or a trace (pure)."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gpuguard import loader


@dataclass(frozen=True)
class Arrival:
    """One request: seconds after the server's start, kernel work (s), bytes each way."""

    offset: float
    work: float
    nbytes: int


def rate_arrivals(
    rate: float, poisson: bool, work: float, nbytes: int, seed: int
) -> Iterator[Arrival]:
    """Endless arrivals at ``rate`` per second: exponential gaps (Poisson), or fixed ones."""
    rng = random.Random(seed)
    offset = 0.0
    for i in itertools.count():
        if poisson:
            offset += rng.expovariate(rate)
        else:
            offset = i / rate
        yield Arrival(offset, work, nbytes)


@dataclass(frozen=True)
class Bursts:
    """Bursty arrivals with heavy-tailed sizes, as inference traffic comes.

    A quiet background (Poisson at ``background_rate``) and, every ``period`` seconds (the
    start jittered by up to ``jitter`` of it), a burst of ``size`` requests (drawn uniformly
    in the range) at uniform random times within ``span`` seconds. Each request's work is
    log-normal with median ``median_work`` and shape ``sigma`` (sigma 0.8: the p99 is about
    6.4 x the median), capped at ``max_factor`` x the median.
    """

    median_work: float
    sigma: float = 0.8
    max_factor: float = 10.0
    period: float = 15.0
    jitter: float = 0.3
    span: float = 10.0
    size: tuple[int, int] = (24, 36)
    background_rate: float = 0.3
    first_burst: float = 0.0


def bursty_arrivals(bursts: Bursts, duration: float, nbytes: int, seed: int) -> list[Arrival]:
    """Every arrival of ``bursts`` within ``[0, duration)``, in time order."""
    rng = random.Random(seed)
    offsets: list[float] = []
    t = rng.expovariate(bursts.background_rate) if bursts.background_rate > 0 else duration
    while t < duration:
        offsets.append(t)
        t += rng.expovariate(bursts.background_rate)
    start = bursts.first_burst
    while start < duration:
        began = start + rng.uniform(0.0, bursts.jitter * bursts.period)
        count = rng.randint(*bursts.size)
        offsets += [began + rng.uniform(0.0, bursts.span) for _ in range(count)]
        start += bursts.period
    cap, median = bursts.max_factor * bursts.median_work, math.log(bursts.median_work)
    ordered = sorted(o for o in offsets if o < duration)
    return [Arrival(o, min(cap, rng.lognormvariate(median, bursts.sigma)), nbytes) for o in ordered]


def trace_lines(arrivals: Iterable[Arrival]) -> list[str]:
    """``arrivals`` as a trace file's lines (``--trace``; ``parse_trace`` reads them back)."""
    return [
        json.dumps({"t": round(a.offset, 6), "work": round(a.work, 6), "bytes": a.nbytes})
        for a in arrivals
    ]


def parse_trace(lines: Iterable[str], work: float, nbytes: int) -> list[Arrival]:
    """A trace: JSON lines ``{"t": seconds after start, "work": s, "bytes": n}``.

    ``work`` and ``bytes`` are optional (the server's defaults); times must not go back.
    Raises ValueError naming the bad line.
    """
    arrivals: list[Arrival] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        doc = loader.parse_json(line, f"trace line {number}")  # ConfigError: a ValueError
        try:
            arrival = Arrival(
                _number(doc, "t", None, allow_zero=True),
                _number(doc, "work", work),
                int(_number(doc, "bytes", float(nbytes), allow_zero=True)),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"trace line {number}: {exc}") from None
        if arrivals and arrival.offset < arrivals[-1].offset:
            raise ValueError(f"trace line {number}: t goes back in time")
        arrivals.append(arrival)
    if not arrivals:
        raise ValueError("the trace has no requests")
    return arrivals


def _number(doc: object, key: str, default: float | None, allow_zero: bool = False) -> float:
    if not isinstance(doc, dict):
        raise ValueError("each line must be a JSON object")
    value = doc.get(key, default)
    if value is None:
        raise ValueError(f"missing {key!r}")
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{key!r} must be a number, got {json.dumps(value)}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{key!r} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return float(value)
