"""Dotted command-line flags backed by an optional YAML file, shared by the exporter and actuator.

Each component declares its flags as a tuple of ``Flag``; ``add_flags`` puts them on an
argparse parser and ``merge`` resolves every value: the command line, else the same key in
``--config.file`` (YAML keyed by flag name without the dashes, e.g. ``log.level: debug``),
else the default. The validators below check one merged value each; anything wrong raises
``ConfigError`` with one line naming the flag (the CLI prints it and exits 2).
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import logging
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar
from urllib.parse import urlparse

from gpuguard import files, units
from gpuguard.labels import LabelError, ascii_int

# ConfigError is the loader's (every file a flag names is read there, with the same integer
# bound as a flag's value); read_yaml is kept here for the callers that import it from flags.
from gpuguard.loader import MAX_INT_DIGITS, ConfigError, read_yaml

MAX_TOKEN_BYTES = 4096
MAX_TEXT = 253  # a DNS name; node names and other one-line texts
#: A number as a flag's text: ASCII only (``float`` takes Arabic-Indic digits and newlines).
_DECIMAL = re.compile(
    r"[+-]?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE][+-]?[0-9]{1,3})?|[+-]?(?:nan|inf)",
    re.IGNORECASE,
)

_P = ParamSpec("_P")
_R = TypeVar("_R")
_C = TypeVar("_C")


def start_logging(level: str, warnings: Iterable[str] = (), name: str = "gpuguard") -> None:
    """Configure logging for a component once at start-up, then log its config warnings."""
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for warning in warnings:
        logging.getLogger(name).warning(warning)


Kind = Literal["str", "bool", "int", "float", "ratio", "duration"]

#: How ``--help`` names a flag's value when the flag does not say: by kind, and for the
#: names every component shares, by name.
KIND_METAVARS: dict[str, str] = {
    "int": "N",
    "float": "NUMBER",
    "ratio": "RATIO",
    "duration": "DURATION",
}
SHARED_METAVARS: dict[str, str] = {
    "web.listen-address": "HOST:PORT",
    "web.token-file": "PATH",
    "web.config.file": "PATH",
    "docker.host": "URL",
    "swarm.manager": "URL",
    "exporter.url": "URL",
    "prometheus.url": "URL",
    "path.procfs": "PATH",
    "path.sysfs": "PATH",
    "state.dir": "PATH",
    "node.name": "NAME",
    "log.level": "LEVEL",
}
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


@dataclass(frozen=True)
class Flag:
    """One dotted flag. ``kind`` says how ``--help`` shows it (``ratio``: a share in [0, 1])
    and makes ``bool`` a switch; ``metavar`` names a ``str`` value (``PATH``, ``URL``)."""

    name: str
    default: Any
    help: str
    kind: Kind = "str"
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return dest(self.name)

    @property
    def value_name(self) -> str:
        """What ``--help`` calls its value; ``TEXT`` only when nothing more is known."""
        return (
            self.metavar or SHARED_METAVARS.get(self.name) or KIND_METAVARS.get(self.kind) or "TEXT"
        )


def dest(name: str) -> str:
    """The argparse destination of a dotted flag name."""
    return name.replace(".", "_").replace("-", "_")


class _Switch(argparse.Action):
    """A bool flag: ``--x`` is true, and ``--x=false`` (or ``--x false``) says it outright,
    so a switch that is on by default can be turned off from the command line."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        word = str(values).strip().lower()
        if word not in _TRUE + _FALSE:
            parser.error(f"argument {option_string}: expected true or false, got {values!r}")
        setattr(namespace, self.dest, word in _TRUE)


def add_flags(
    parser: argparse.ArgumentParser,
    flags: Iterable[Flag],
    config_help: str = "YAML file keyed by flag name (flags win)",
) -> None:
    """Add ``--config.file`` and every flag; unset flags stay absent so the file can fill them.

    Each help ends with the default (``on``/``off`` for a switch); a flag whose default is
    worked out at start-up says how in its own help.
    """
    parser.add_argument(
        "--config.file", dest="config_file", metavar="PATH", default=None, help=config_help
    )
    for flag in flags:
        if flag.kind == "bool":
            parser.add_argument(
                f"--{flag.name}",
                dest=flag.dest,
                action=_Switch,
                nargs="?",
                const="true",
                metavar="true|false",
                default=argparse.SUPPRESS,
                help=f"{flag.help} (default: {'on' if flag.default else 'off'})",
            )
        else:
            default = "" if flag.default is None else f" (default: {flag.default})"
            parser.add_argument(
                f"--{flag.name}",
                dest=flag.dest,
                metavar=flag.value_name,
                default=argparse.SUPPRESS,
                help=flag.help + default,
            )


def merge(args: argparse.Namespace, flags: Iterable[Flag]) -> dict[str, Any]:
    """Every flag's value by name: command line > ``--config.file`` > default (unvalidated)."""
    flags = tuple(flags)
    values: dict[str, Any] = {f.name: f.default for f in flags}
    config_file = getattr(args, "config_file", None)
    if config_file:
        values.update(read_config_file(Path(config_file), flags))
    given = vars(args)
    for flag in flags:
        if given.get(flag.dest) is not None:
            values[flag.name] = given[flag.dest]
    return values


def read_config_file(path: Path, flags: Iterable[Flag]) -> dict[str, Any]:
    """The ``--config.file`` mapping; every key must be one of ``flags``, every value one
    value of the flag's kind (a list or mapping is refused, never turned into a string)."""
    doc = read_yaml(path, "--config.file")
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"--config.file {path}: must be a mapping of flag names to values")
    kinds = {f.name: f.kind for f in flags}
    unknown = sorted(str(k) for k in doc if k not in kinds)
    if unknown:
        raise ConfigError(f"--config.file {path}: unknown setting(s) {', '.join(unknown)}")
    for name, value in doc.items():
        problem = _not_one_value(value, kinds[name])
        if problem:
            raise ConfigError(f"--config.file {path}: {name} must be {problem}")
    return {str(k): v for k, v in doc.items()}


def _not_one_value(value: Any, kind: str) -> str | None:
    """Why a config file's value cannot be a flag of ``kind``, or None."""
    if isinstance(value, list | tuple):
        return "a single value, got a list"
    if isinstance(value, dict):
        return "a single value, got a mapping"
    if kind != "bool" and isinstance(value, bool):
        return f"text or a number, got {str(value).lower()}"
    if value is not None and not isinstance(value, str | int | float | bool):
        return f"text or a number, got {type(value).__name__}"  # a YAML date, binary
    return None


def run_configured(prog: str, load: Callable[[], _C], run: Callable[[_C], int]) -> int:
    """A command's entry: ``run(load())``, or exit status 2 with ``prog: <error>`` on stderr
    when the configuration is bad (nothing has started yet, so nothing changes)."""
    try:
        config = load()
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    return run(config)


def reraise_as(error: type[ConfigError]) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorate a component's config entry point so shared ``ConfigError``s surface as ``error``."""

    def decorate(func: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(func)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return func(*args, **kwargs)
            except ConfigError as exc:
                if isinstance(exc, error):
                    raise
                raise error(str(exc)) from None

        return wrapper

    return decorate


# Validators: each checks values[name] and returns it converted, or raises ConfigError.


def listen_address(values: Mapping[str, Any], name: str, example: str) -> tuple[str, int]:
    """``host:port`` (IPv6 in brackets; an empty host means every address) as (host, port)."""
    text = values[name]
    host, sep, port = str(text).rpartition(":")
    if not (sep and 0 < len(port) <= 18 and port.isascii() and port.isdigit()):
        raise ConfigError(f"--{name} {text!r}: use host:port (e.g. {example})")
    if int(port) > 65535:
        raise ConfigError(f"--{name} {text!r}: port {int(port)} is out of range (0 to 65535)")
    return host.strip("[]") or "0.0.0.0", int(port)


def duration(values: Mapping[str, Any], name: str) -> float:
    """A positive duration with its unit (``100ms``, ``5s``, ``1m30s``: ``units.py``), in
    seconds; a YAML number in ``--config.file`` (not text) is seconds, as it always was."""
    value = values[name]
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = f"{value:.9f}s" if math.isfinite(value) and value > 0 else str(value)
    try:
        return units.parse_duration(str(value))
    except units.UnitError as exc:
        raise ConfigError(f"--{name}: {exc}") from None


def choice(values: Mapping[str, Any], name: str, choices: tuple[str, ...]) -> str:
    value = str(values[name])
    if value not in choices:
        raise ConfigError(f"--{name} {value!r}: must be one of {', '.join(choices)}")
    return value


def integer(values: Mapping[str, Any], name: str, minimum: int, maximum: int | None = None) -> int:
    """An integer in ``[minimum, maximum]`` (no upper bound when ``maximum`` is None)."""
    value = values[name]
    number = _int(value)
    if number is None:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConfigError(f"--{name} {shown}: must be an integer")
    if maximum is None and number < minimum:
        raise ConfigError(f"--{name} {value!r}: must be >= {minimum}")
    if maximum is not None and not minimum <= number <= maximum:
        raise ConfigError(f"--{name} {value!r}: must be between {minimum} and {maximum}")
    return number


def _int(value: Any) -> int | None:
    """A YAML integer, or ASCII digits (surrounding spaces allowed), bounded; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < 10**MAX_INT_DIGITS else None
    text = str(value).strip(" ")
    negative = text.startswith("-")
    try:
        number = ascii_int(text[1:] if negative else text, MAX_INT_DIGITS)
    except LabelError:
        return None
    return -number if negative else number


def text(values: Mapping[str, Any], name: str) -> str:
    """One short line of printable text (a YAML number reads as its digits)."""
    value = values[name]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigError(f"--{name} {value!r:.40}: must be one line of text")
    result = str(value)
    if not result or len(result) > MAX_TEXT or not result.isprintable():
        raise ConfigError(
            f"--{name} {result[:40]!r}: must be 1 to {MAX_TEXT} printable characters on one line"
        )
    return result


def ratio(values: Mapping[str, Any], name: str) -> float:
    """A finite number in (0, 1]."""
    return _fraction(values, name, lambda x: 0 < x <= 1, "(0, 1]")


def share(values: Mapping[str, Any], name: str) -> float:
    """A finite number in [0, 1)."""
    return _fraction(values, name, lambda x: 0 <= x < 1, "[0, 1)")


def positive(values: Mapping[str, Any], name: str, maximum: float) -> float:
    """A finite number in (0, ``maximum``]."""
    return _fraction(values, name, lambda x: 0 < x <= maximum, f"(0, {maximum:g}]")


def _fraction(
    values: Mapping[str, Any], name: str, within: Callable[[float], bool], span: str
) -> float:
    value = values[name]
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    if isinstance(value, bool) or not (
        isinstance(value, int | float) or _DECIMAL.fullmatch(str(value))
    ):
        raise ConfigError(f"--{name} {shown}: must be a number")
    number = float(value)
    if not math.isfinite(number) or not within(number):
        raise ConfigError(f"--{name} {shown}: must be in {span}")
    return number


def boolean(values: Mapping[str, Any], name: str) -> bool:
    """A real boolean (YAML ``true``/``false``; a bool flag on the command line)."""
    value = values[name]
    if isinstance(value, bool):
        return value
    raise ConfigError(f"--{name}: must be true or false, got {value!r}")


def http_url(values: Mapping[str, Any], name: str, schemes: tuple[str, ...]) -> str:
    """A URL with one of ``schemes`` and a host, without its trailing slash."""
    value = str(values[name])
    parsed = urlparse(value)
    if parsed.scheme not in schemes or not parsed.netloc:
        raise ConfigError(f"--{name} {value!r}: must be an {'/'.join(schemes)} URL")
    return value.rstrip("/")


def is_loopback(host: str) -> bool:
    """Whether a listen host only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: Any, name: str = "web.token-file") -> str:
    """The bearer token in the file ``--name`` gives (stripped; must not be empty)."""
    try:
        token = files.read_text(str(path), MAX_TOKEN_BYTES).strip()
    except OSError as exc:
        raise ConfigError(f"--{name} {path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--{name} {path}: cannot read: not UTF-8") from None
    if not token:
        raise ConfigError(f"--{name} {path}: is empty")
    return token


def token_file_warnings(path: Any, name: str = "web.token-file") -> list[str]:
    """A warning when every user of the host can read the token file (group is fine)."""
    try:
        mode = Path(str(path)).stat().st_mode & 0o777
    except OSError:
        return []
    if mode & 0o004:
        return [
            f"--{name} {path}: mode {mode:o}, every user of this host can read the token "
            "(make it 0600, or 0640 for a group that needs it)"
        ]
    return []
