"""The benchmarks' command lines: a bad number is one line and exit 2, before anything starts."""

from __future__ import annotations

import argparse
from typing import NoReturn


class BenchParser(argparse.ArgumentParser):
    """argparse whose usage error is one line naming the bench and its ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def positive(text: str) -> float:
    """A number above 0 (a time scale, a duration, a rate)."""
    value = _number(text, float)
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer of at least 1 (a count of rounds, kernels, requests)."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 1, got {text!r}")
    return value


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
