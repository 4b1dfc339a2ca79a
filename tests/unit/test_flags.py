"""The shared flag layer: precedence, the config file and each validator's one-line error."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

import gpuguard.actuator.errors
import gpuguard.exporter.errors
from gpuguard import flags
from gpuguard.flags import ConfigError, Flag

FLAGS = (
    Flag("a.name", "default-a", "a string"),
    Flag("b.count", 3, "an int", "int"),
    Flag("c.wait", "1s", "a duration", "duration"),
    Flag("d.on", False, "a switch", "bool"),
    Flag("e.unset", None, "no default"),
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    flags.add_flags(parser, FLAGS)
    return parser.parse_args(list(argv))


def config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "conf.yml"
    path.write_text(text)
    return str(path)


def test_defaults_when_nothing_is_given() -> None:
    assert flags.merge(parse(), FLAGS) == {
        "a.name": "default-a",
        "b.count": 3,
        "c.wait": "1s",
        "d.on": False,
        "e.unset": None,
    }


def test_flag_beats_file_beats_default(tmp_path: Path) -> None:
    path = config_file(tmp_path, "a.name: from-file\nb.count: 7\nd.on: true\n")
    values = flags.merge(parse("--config.file", path, "--a.name", "from-flag"), FLAGS)
    assert values["a.name"] == "from-flag"  # flag > file
    assert values["b.count"] == 7  # file > default
    assert values["d.on"] is True
    assert values["c.wait"] == "1s"  # default


def test_bool_flag_is_store_true_and_unset_flags_are_absent() -> None:
    args = parse("--d.on")
    assert args.d_on is True
    assert not hasattr(args, "a_name")  # absent, so a config file can fill it
    assert flags.merge(args, FLAGS)["d.on"] is True


def test_help_lists_every_flag_with_its_default() -> None:
    parser = argparse.ArgumentParser()
    flags.add_flags(parser, FLAGS, config_help="the file")
    text = parser.format_help()
    for flag in FLAGS:
        assert f"--{flag.name}" in text
    assert "(default: default-a)" in text and "the file" in text
    assert "(default: None)" not in text


def test_empty_config_file_is_all_defaults(tmp_path: Path) -> None:
    path = config_file(tmp_path, "")
    assert flags.merge(parse("--config.file", path), FLAGS)["a.name"] == "default-a"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a.nmae: x\nzz: 1\n", "unknown setting(s) a.nmae, zz"),
        ("- a\n- b\n", "must be a mapping of flag names to values"),
        ("a.name: [unclosed\n", "invalid YAML"),
    ],
)
def test_bad_config_file(tmp_path: Path, text: str, needle: str) -> None:
    path = config_file(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        flags.merge(parse("--config.file", path), FLAGS)
    assert str(err.value).startswith(f"--config.file {path}: ")
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_unreadable_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        flags.merge(parse("--config.file", str(tmp_path / "missing.yml")), FLAGS)


def test_read_yaml_names_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "x.yml"
    path.write_text("k: v\n")
    assert flags.read_yaml(path, "--x") == {"k": "v"}
    path.write_text("k: [\n")
    with pytest.raises(ConfigError, match=r"^--x .*invalid YAML"):
        flags.read_yaml(path, "--x")


def test_listen_address() -> None:
    assert flags.listen_address({"l": "0.0.0.0:80"}, "l", "h:1") == ("0.0.0.0", 80)
    assert flags.listen_address({"l": ":80"}, "l", "h:1") == ("0.0.0.0", 80)
    assert flags.listen_address({"l": "[::1]:80"}, "l", "h:1") == ("::1", 80)
    for bad in ("80", "h:port", "", "h:", "h:" + "9" * 19):
        with pytest.raises(ConfigError, match=r"^--l .*: use host:port \(e\.g\. h:1\)$"):
            flags.listen_address({"l": bad}, "l", "h:1")
    with pytest.raises(ConfigError) as err:  # issue 26: it said "use host:port"
        flags.listen_address({"l": "127.0.0.1:99999"}, "l", "h:1")
    assert str(err.value) == "--l '127.0.0.1:99999': port 99999 is out of range (0 to 65535)"


def test_duration() -> None:
    assert flags.duration({"d": "250ms"}, "d") == 0.25
    assert flags.duration({"d": 2}, "d") == 2.0  # a YAML number
    with pytest.raises(ConfigError, match=r"^--d: invalid duration 'soon'"):
        flags.duration({"d": "soon"}, "d")
    with pytest.raises(ConfigError, match="greater than zero"):
        flags.duration({"d": "0s"}, "d")


def test_choice() -> None:
    assert flags.choice({"c": "b"}, "c", ("a", "b")) == "b"
    with pytest.raises(ConfigError, match=r"^--c 'z': must be one of a, b$"):
        flags.choice({"c": "z"}, "c", ("a", "b"))


@pytest.mark.parametrize(
    ("value", "maximum", "needle"),
    [
        ("many", None, "--n 'many': must be an integer"),
        ("0", None, "--n '0': must be >= 1"),
        (11, 10, "--n 11: must be between 1 and 10"),
    ],
)
def test_integer_errors(value: Any, maximum: int | None, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        flags.integer({"n": value}, "n", 1, maximum)
    assert str(err.value) == needle


def test_integer() -> None:
    assert flags.integer({"n": " 5 "}, "n", 1, 10) == 5
    assert flags.integer({"n": 10**9}, "n", 1) == 10**9


@pytest.mark.parametrize("value", ["x", "0", "1.5", "nan", "inf"])
def test_ratio_errors(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^--r "):
        flags.ratio({"r": value}, "r")


def test_ratio() -> None:
    assert flags.ratio({"r": "0.5"}, "r") == 0.5
    assert flags.ratio({"r": 1}, "r") == 1.0


@pytest.mark.parametrize("value", ["x", "-0.1", "1", "nan", "inf"])
def test_share_errors(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^--s "):
        flags.share({"s": value}, "s")


def test_share() -> None:
    assert flags.share({"s": "0"}, "s") == 0.0
    assert flags.share({"s": 0.25}, "s") == 0.25


def test_boolean() -> None:
    assert flags.boolean({"b": True}, "b") is True
    with pytest.raises(ConfigError, match=r"^--b: must be true or false, got 'yes'$"):
        flags.boolean({"b": "yes"}, "b")


@pytest.mark.parametrize(
    "error", [gpuguard.exporter.errors.ConfigError, gpuguard.actuator.errors.ConfigError]
)
def test_reraise_as_the_callers_class(error: type[ConfigError]) -> None:
    @flags.reraise_as(error)
    def load() -> None:
        flags.choice({"c": "z"}, "c", ("a",))

    with pytest.raises(error, match=r"^--c 'z'"):
        load()
    assert issubclass(error, ConfigError)


# Issue 20, item 8: hostile config inputs are one line, never a traceback.


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a.name: " + "[" * 20_000 + "]" * 20_000 + "\n", "nested more than 64 deep"),
        ("b.count: " + "9" * 5000 + "\n", "invalid YAML"),
        ("a.name: [x, y]\n", "a.name must be a single value, got a list"),
        ("a.name: {x: 1}\n", "a.name must be a single value, got a mapping"),
        ("a.name: yes\n", "a.name must be text or a number, got true"),
    ],
    ids=["deep", "huge-int", "list", "mapping", "bool"],
)
def test_hostile_config_files_are_one_line(tmp_path: Path, text: str, needle: str) -> None:
    path = config_file(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        flags.merge(parse("--config.file", path), FLAGS)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"--config.file {path}: ")


@pytest.mark.parametrize("special", ["/dev/zero", "/proc/self"])
def test_a_config_file_that_is_not_a_file(special: str) -> None:
    with pytest.raises(ConfigError, match=rf"^--config.file {special}: cannot read: not a regular"):
        flags.merge(parse("--config.file", special), FLAGS)


def test_token_from_dev_zero_is_one_line() -> None:
    with pytest.raises(
        ConfigError, match=r"^--web.token-file /dev/zero: cannot read: not a regular"
    ):
        flags.read_token("/dev/zero")


@pytest.mark.parametrize("value", ["9" * 5000, 10**40, "٣", "3\n", True])
def test_integer_is_bounded_ascii(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"^--n .*must be an integer"):
        flags.integer({"n": value}, "n", 1)


@pytest.mark.parametrize("value", [["a", "b"], {"a": 1}, True, "", "a\nb", "x" * 300])
def test_text_is_one_short_line(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"^--t "):
        flags.text({"t": value}, "t")


def test_text() -> None:
    assert flags.text({"t": "node-1"}, "t") == "node-1"
    assert flags.text({"t": 7}, "t") == "7"  # YAML reads a bare number
