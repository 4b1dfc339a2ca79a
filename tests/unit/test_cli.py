"""The ``gpuguard`` command: its subcommands, and a help text for each.

argparse formats help texts with ``%``, so a literal ``%`` in one (``100%``) breaks
``--help`` only when it is asked for: every subcommand's help is rendered here.
"""

from __future__ import annotations

import argparse

import pytest

from gpuguard.cli import build_parser, main

SUBCOMMANDS = ("exporter", "ps", "run", "actuator", "guard", "nodes", "placer", "demo")


def _subcommands() -> list[str]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_the_command_lists_its_subcommands_in_order() -> None:
    assert tuple(_subcommands()) == SUBCOMMANDS


def test_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert all(f"    {name}" in out for name in SUBCOMMANDS)


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_a_help_text(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main([command, "--help"])  # `run` passes -h on to docker's usage: it returns
    except SystemExit as exited:
        status = exited.code
    assert status == 0
    assert "usage: " in capsys.readouterr().out
