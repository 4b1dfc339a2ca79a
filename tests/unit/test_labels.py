from __future__ import annotations

import pytest

from gpuguard.labels import (
    DEADLINE,
    MANAGED,
    ROLE,
    LabelError,
    format_duration,
    parse_duration,
    parse_managed,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("9", 9.0), ("9s", 9.0), ("1500ms", 1.5), ("2m", 120.0), ("0.5s", 0.5), (".5", 0.5),
     (" 3s ", 3.0), ("1h", 3600.0)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "0", "0s", "-1s", "9x", "s", "nan", "inf", "1e3", "9 s s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(LabelError):
        parse_duration(text)


def test_parse_duration_rejects_non_strings() -> None:
    with pytest.raises(LabelError):
        parse_duration(9)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "managed"),
    [("true", True), ("TRUE", True), (" true ", True), ("yes", False), ("1", False),
     ("", False), (None, False), ("false", False)],
)  # fmt: skip
def test_parse_managed(value: str | None, managed: bool) -> None:
    assert parse_managed(value) is managed


@pytest.mark.parametrize("seconds", [9.0, 1.5, 0.5, 0.25, 120.0, 0.001])
def test_format_duration_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


def test_label_names() -> None:
    assert (DEADLINE, MANAGED, ROLE) == ("gpuguard.deadline", "gpuguard.managed", "gpuguard.role")
