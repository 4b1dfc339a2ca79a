"""Durations and byte sizes as gpuguard reads them everywhere (pure, one grammar each).

A **duration** is a Go duration (``time.ParseDuration``, which Kubernetes' ``metav1.Duration``
and kube-scheduler's own configuration use), unsigned and ASCII, with digits on both sides of
any point: one or more of a number and its unit (``ns``, ``us``, ``ms``, ``s``, ``m``,
``h``) with nothing between, e.g. ``9s``, ``1500ms``, ``0.5s``, ``2m``, ``1m30s``. Refused:
``9 s``, ``.5s``, ``5.s``, ``1e3s``, a sign, a unit alone. A bare number (``9``, ``0.5``) is
seconds only where the caller allows it (container labels, whose documented forms include it).
Zero is well formed but no duration (``NotPositive``, so a caller with a floor can say so).

A **byte size** is a Kubernetes quantity (``resource.Quantity``) without sign or fraction of
a byte: a number then ``Ki``, ``Mi``, ``Gi``, ``Ti``, ``Pi``, ``Ei`` (powers of 1024),
``k``, ``M``, ``G``, ``T``, ``P``, ``E`` (powers of 1000) or an exponent (``2e9``), or
nothing (bytes); gpuguard's own ``B``, ``KiB`` ... ``TiB``, ``KB`` ... ``TB`` read the same.
A fraction is rounded up to a whole byte, as Kubernetes does (``1.5Gi``).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

#: Longer text is no duration or size anyone writes; bounded before any regex runs.
MAX_TEXT = 64
_NUMBER = r"[0-9]{1,18}(?:\.[0-9]{1,18})?"
_DURATION_PART = re.compile(rf"({_NUMBER})(ns|us|ms|s|m|h)", re.ASCII)
_DURATION = re.compile(rf"(?:{_NUMBER}(?:ns|us|ms|s|m|h))+", re.ASCII)
_BARE_SECONDS = re.compile(_NUMBER, re.ASCII)
_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE = re.compile(
    rf"({_NUMBER})(?:[eE]([0-9]{{1,2}})|(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|"
    r"B|KiB|MiB|GiB|TiB|KB|MB|GB|TB))?",
    re.ASCII,
)
_BYTES = {
    None: 1, "B": 1,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}  # fmt: skip


class UnitError(ValueError):
    """A duration or size that cannot be read: ``what`` ("duration", "size"), the ``text``
    given and ``why``; the message is one line."""

    def __init__(self, what: str, text: str, why: str) -> None:
        super().__init__(f"invalid {what} {text[:40]!r}: {why}")
        self.text, self.why = text, why


class NotPositive(UnitError):
    """A duration that reads as zero (``0s``, ``0.0ms``): well formed, but no duration."""


def parse_duration(text: str, *, bare_seconds: bool = False) -> float:
    """Seconds (> 0, finite) from a duration (module docstring); with ``bare_seconds`` a plain
    number is seconds too. UnitError otherwise.

    >>> parse_duration("1m30s")
    90.0
    """
    if not isinstance(text, str):
        raise UnitError("duration", repr(text), f"must be text, not {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise UnitError("duration", text, f"longer than {MAX_TEXT} characters")
    if bare_seconds and _BARE_SECONDS.fullmatch(text):
        seconds = float(text)
    elif _DURATION.fullmatch(text):
        seconds = sum(
            float(number) * _SECONDS[unit] for number, unit in _DURATION_PART.findall(text)
        )
    else:
        hint = _DURATION_HINT + (" (or seconds alone: 9)" if bare_seconds else "")
        if text.startswith("-") and _DURATION.fullmatch(text[1:]):
            hint = "must be greater than zero"
        raise UnitError("duration", text, hint)
    if seconds <= 0:
        raise NotPositive("duration", text, "must be greater than zero")
    if not math.isfinite(seconds):
        raise UnitError("duration", text, "too long")
    return seconds


_DURATION_HINT = (
    "write digits and a unit (ns, us, ms, s, m or h) with nothing between, "
    "e.g. 9s, 1500ms, 0.5s or 1m30s"
)


def format_duration(seconds: float) -> str:
    """Seconds as ``parse_duration`` reads them back: ``250ms`` under 1 s when whole, else
    ``9s``, ``1.5s`` (``ns`` under a millisecond)."""
    if seconds < 1 and (seconds * 1000).is_integer():
        return f"{int(seconds * 1000)}ms"
    if seconds < 1e-3:
        return f"{seconds * 1e9:.9f}".rstrip("0").rstrip(".") + "ns"
    return f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"


def parse_bytes(text: str) -> int:
    """Whole bytes (>= 0) from a byte size (module docstring); UnitError otherwise.

    >>> parse_bytes("20Gi"), parse_bytes("20G"), parse_bytes("512MiB")
    (21474836480, 20000000000, 536870912)
    """
    if not isinstance(text, str):
        raise UnitError("size", repr(text), f"must be text, not {type(text).__name__}")
    match = _SIZE.fullmatch(text) if len(text) <= MAX_TEXT else None
    if match is None:
        raise UnitError(
            "size",
            text,
            "write a number and a unit with nothing between, e.g. 20Gi, 20G, 512Mi or 2GiB "
            "(Kubernetes quantities; bytes without a unit)",
        )
    number, exponent, unit = match.groups()
    scale = 10 ** int(exponent) if exponent is not None else _BYTES[unit]
    return math.ceil(Fraction(number) * scale)
