from __future__ import annotations

import pytest

from gpuguard.contract import PriorityClass, TaskMode
from gpuguard.labels import (
    CLASS,
    DEADLINE,
    MANAGED,
    ROLE,
    TASK,
    LabelError,
    format_duration,
    parse_duration,
    parse_managed,
    parse_priority_class,
    parse_task_mode,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("9", 9.0), ("9s", 9.0), ("1500ms", 1.5), ("2m", 120.0), ("0.5s", 0.5), ("0.5", 0.5),
     ("1h", 3600.0), ("1m30s", 90.0), ("1h2m3.5s", 3723.5), ("250us", 0.00025),
     ("2000000ns", 0.002)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: float) -> None:
    """The documented label forms: a Go duration, or seconds alone."""
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    ["", "0", "0s", "-1s", "9x", "s", "nan", "inf", "1e3", "9 s s", "9 s", " 3s ", "3s ",
     ".5s", ".5", "5.s", "5.", "1e3s", "+1s", "1m 30s", "1S", "1sec", "µs", "1µs", "ms"],
)  # fmt: skip
def test_parse_duration_rejects(text: str) -> None:
    """One spelling everywhere: no spaces, digits on both sides of a point, no exponent."""
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


@pytest.mark.parametrize("seconds", [9.0, 1.5, 0.5, 0.25, 120.0, 0.001, 1e-13, 3.6e6, 1e-4])
def test_format_duration_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


def test_label_names() -> None:
    assert (DEADLINE, MANAGED, ROLE) == ("gpuguard.deadline", "gpuguard.managed", "gpuguard.role")
    assert (TASK, CLASS) == ("gpuguard.task", "gpuguard.class")


@pytest.mark.parametrize("mode", ["process", "memory", "burst"])
def test_parse_task_mode(mode: str) -> None:
    assert parse_task_mode(mode) is TaskMode(mode)


@pytest.mark.parametrize("klass", ["real-time", "normal", "best-effort"])
def test_parse_priority_class(klass: str) -> None:
    assert parse_priority_class(klass) is PriorityClass(klass)


@pytest.mark.parametrize("text", ["", "Burst", " burst", "bursts", "kernel", "none"])
def test_parse_task_mode_rejects(text: str) -> None:
    with pytest.raises(LabelError, match=r"gpuguard\.task"):
        parse_task_mode(text)


@pytest.mark.parametrize("text", ["", "realtime", "best_effort", "BEST-EFFORT", "low"])
def test_parse_priority_class_rejects(text: str) -> None:
    with pytest.raises(LabelError, match="use one of real-time, normal, best-effort"):
        parse_priority_class(text)


def test_parse_choice_rejects_non_strings() -> None:
    with pytest.raises(LabelError):
        parse_task_mode(1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    ["9s\n", "9\n", "\n9s", "9s\t", "\u0669s", "1\u0660s", "\uff19s", "9" * 65, "9\r"],
    ids=["newline", "bare-newline", "leading-newline", "tab", "arabic-indic", "mixed-digits",
         "fullwidth", "long", "carriage-return"],
)  # fmt: skip
def test_parse_duration_takes_ascii_digits_on_one_line(text: str) -> None:
    # int() and \d accept Arabic-Indic or full-width digits and `$` matches before a trailing
    # newline: a deadline label or flag like "9s\n" must not be silently accepted.
    with pytest.raises(LabelError):
        parse_duration(text)
