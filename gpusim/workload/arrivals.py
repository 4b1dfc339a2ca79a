"""When a server's requests arrive and how big they are: a rate, or a trace file (pure)."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


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


def parse_trace(lines: Iterable[str], work: float, nbytes: int) -> list[Arrival]:
    """A trace: JSON lines ``{"t": seconds after start, "work": s, "bytes": n}``.

    ``work`` and ``bytes`` are optional (the server's defaults); times must not go back.
    Raises ValueError naming the bad line.
    """
    arrivals: list[Arrival] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            arrival = Arrival(
                _number(doc, "t", None, allow_zero=True),
                _number(doc, "work", work),
                int(_number(doc, "bytes", float(nbytes), allow_zero=True)),
            )
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
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
