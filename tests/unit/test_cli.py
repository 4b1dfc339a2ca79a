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


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_takes_version(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuguard import __version__

    try:  # `run` would otherwise say --deadline is required
        status = main([command, "--version"])
    except SystemExit as exited:
        status = exited.code
    captured = capsys.readouterr()
    assert (status, captured.out, captured.err) == (0, f"gpuguard {__version__}\n", "")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(command: str) -> list[argparse.Action]:
    return [a for a in _subparsers()[command]._actions if a.option_strings and a.dest != "help"]


@pytest.mark.parametrize("command", [c for c in SUBCOMMANDS if c != "run"])
def test_every_option_has_a_help_and_names_the_type_of_its_value(command: str) -> None:
    for action in _options(command):
        name = action.option_strings[-1]
        assert action.help, f"{command} {name}: no help"
        if action.nargs == 0:
            continue  # a switch
        metavar = action.metavar or ""
        assert action.choices or metavar, f"{command} {name}: argparse's default metavar"
        assert metavar not in ("VALUE", "TEXT"), f"{command} {name}: {metavar} names no type"


@pytest.mark.parametrize("command", [c for c in SUBCOMMANDS if c != "run"])
def test_every_option_with_a_default_says_it(command: str) -> None:
    parser = _subparsers()[command]
    text = parser.format_help()
    for action in _options(command):
        if isinstance(action, argparse._StoreTrueAction | argparse._VersionAction):
            continue
        if action.dest == "config_file":
            continue
        if _default(command, action) is None:
            continue  # nothing is used when it is not given
        help_text = parser._get_formatter()._expand_help(action)
        shown = "default" in help_text or "required" in help_text
        assert shown, f"{command} {action.option_strings[-1]}: {help_text!r} hides its default"
    assert "(default: None)" not in text


def _default(command: str, action: argparse.Action) -> object:
    """An option's default; a dotted flag's is its ``Flag``'s (argparse holds SUPPRESS)."""
    from gpuguard.actuator import config as actuator_config
    from gpuguard.actuator.guard import program as guard
    from gpuguard.exporter import config as exporter_config
    from gpuguard.placer import config as placer_config

    if action.default is not argparse.SUPPRESS:
        return action.default
    services = {"exporter": exporter_config.FLAGS, "actuator": actuator_config.FLAGS,
                "guard": guard.FLAGS, "placer": placer_config.FLAGS}  # fmt: skip
    (flag,) = (f for f in services[command] if f"--{f.name}" in action.option_strings)
    return flag.default


def test_a_required_flag_says_so() -> None:
    (token,) = (a for a in _options("actuator") if "--web.token-file" in a.option_strings)
    assert "required" in (token.help or "")


def test_the_actuator_describes_what_it_does() -> None:
    description = _subparsers()["actuator"].description or ""
    assert "one at a time" not in description  # headroom is the default, one at a time an option
    assert "headroom" in description and "preempt" in description


def test_a_switch_on_by_default_can_be_turned_off() -> None:
    args = build_parser().parse_args(["actuator", "--policy.preempt=false", "--dry-run"])
    assert (args.policy_preempt, args.dry_run) == (False, True)
    assert "(default: on)" in _subparsers()["actuator"].format_help()


def test_run_help_explains_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for needle in ("--deadline DURATION", "--task MODE", "--managed", "--placer.url URL",
                   "--memory BYTES", "docker run", "example:"):  # fmt: skip
        assert needle in out
    assert len(out.splitlines()) > 10
