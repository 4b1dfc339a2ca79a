"""Sizes and numbers from command-line and profile strings (pure)."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes from ``"24GiB"``, ``"300MiB"``, ``"1.5GB"`` or a plain integer."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"invalid size {text!r} (examples: 24GiB, 300MiB, 1048576)")
    return int(float(match.group(1)) * _UNITS[unit])


def positive_float(text: str, what: str) -> float:
    """A finite float > 0, or ValueError naming ``what``."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be > 0, got {text!r}")
    return value
