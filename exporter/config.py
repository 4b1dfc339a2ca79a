"""Exporter configuration: dotted flags and an optional YAML file, validated once at start-up.

Precedence: a flag given on the command line, else the same key in ``--config.file``, else
the default. Any invalid value raises ``ConfigError`` with one line naming the key.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.backends.base import BACKEND_CHOICES
from exporter.errors import ConfigError
from gpuguard.labels import LabelError, parse_duration

DEFAULT_LISTEN = "127.0.0.1:9835"
DEFAULT_GPUSIM_SOCKET = "/run/gpusim/gpusim.sock"
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
_DOCKER_SCHEMES = ("unix://", "tcp://", "http://", "https://", "ssh://", "npipe://")
_LOG_LEVELS = ("debug", "info", "warning", "error")

# key (flag without "--", YAML key) -> help
FLAGS: dict[str, str] = {
    "web.listen-address": f"host:port for /metrics and the API (default {DEFAULT_LISTEN})",
    "poll.interval": "poll interval, e.g. 100ms, 0.5s (default 100ms)",
    "gpu.backend": "auto, nvml or gpusim (default auto: NVML if it initialises, else gpusim)",
    "gpusim.socket": f"gpusim socket (default $GPUSIM_SOCKET or {DEFAULT_GPUSIM_SOCKET})",
    "docker.host": f"Docker engine URL (default $DOCKER_HOST or {DEFAULT_DOCKER_HOST})",
    "path.procfs": "procfs mount point, e.g. the host's /proc mounted in (default /proc)",
    "node.name": "value of the node label (default: hostname)",
    "history.size": "finished tasks kept for /api/v1/state's recent (default 256)",
    "events.buffer": "events kept for /api/v1/events followers (default 4096)",
    "log.level": "debug, info, warning or error (default info)",
}


@dataclass(frozen=True, slots=True)
class ExporterConfig:
    listen_host: str
    listen_port: int
    poll_interval_s: float
    gpu_backend: str
    gpusim_socket: Path
    docker_host: str
    procfs: Path
    node_name: str
    history_size: int
    events_buffer: int
    log_level: str = "info"


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add the exporter's dotted flags (defaults are applied later, in ``load_config``)."""
    for key, text in FLAGS.items():
        parser.add_argument(f"--{key}", dest=_dest(key), default=None, metavar="VALUE", help=text)
    parser.add_argument(
        "--config.file", dest="config_file", default=None, metavar="PATH",
        help="YAML file with the same keys as the flags (flags win)",
    )  # fmt: skip


def _dest(key: str) -> str:
    return key.replace(".", "_").replace("-", "_")


def _read_file(path: str) -> dict[str, Any]:
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"--config.file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"--config.file {path}: not valid YAML ({exc})".replace("\n", " ")
        ) from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"--config.file {path}: must be a mapping of flag names to values")
    unknown = sorted(str(k) for k in doc if k not in FLAGS)
    if unknown:
        raise ConfigError(f"--config.file {path}: unknown key {unknown[0]!r}")
    return {str(k): v for k, v in doc.items()}


def load_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ExporterConfig:
    """Merge flags, file and defaults, and validate every value."""
    env = os.environ if env is None else env
    file_values = _read_file(args.config_file) if getattr(args, "config_file", None) else {}

    def value(key: str, default: Any) -> Any:
        given = getattr(args, _dest(key), None)
        if given is not None:
            return given
        return file_values.get(key, default)

    host, port = _listen(value("web.listen-address", DEFAULT_LISTEN))
    return ExporterConfig(
        listen_host=host,
        listen_port=port,
        poll_interval_s=_interval(value("poll.interval", "100ms")),
        gpu_backend=_choice("gpu.backend", value("gpu.backend", "auto"), BACKEND_CHOICES),
        gpusim_socket=Path(
            str(value("gpusim.socket", env.get("GPUSIM_SOCKET") or DEFAULT_GPUSIM_SOCKET))
        ),
        docker_host=_docker_host(
            value("docker.host", env.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST)
        ),
        procfs=_procfs(value("path.procfs", "/proc")),
        node_name=_nonempty("node.name", value("node.name", socket.gethostname())),
        history_size=_int("history.size", value("history.size", 256), 1, 1_000_000),
        events_buffer=_int("events.buffer", value("events.buffer", 4096), 16, 10_000_000),
        log_level=_choice("log.level", str(value("log.level", "info")).lower(), _LOG_LEVELS),
    )


def _listen(text: Any) -> tuple[str, int]:
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"--web.listen-address {text!r}: expected host:port, e.g. {DEFAULT_LISTEN}"
        )
    return host.strip("[]") or "0.0.0.0", int(port)


def _interval(text: Any) -> float:
    try:
        seconds = parse_duration(str(text))
    except LabelError as exc:
        raise ConfigError(f"--poll.interval: {exc}") from exc
    if not 0.01 <= seconds <= 60:
        raise ConfigError(f"--poll.interval {text!r}: must be between 10ms and 60s")
    return seconds


def _choice(key: str, text: Any, choices: tuple[str, ...]) -> str:
    if text not in choices:
        raise ConfigError(f"--{key} {text!r}: must be one of {', '.join(choices)}")
    return str(text)


def _docker_host(text: Any) -> str:
    if not str(text).startswith(_DOCKER_SCHEMES):
        raise ConfigError(f"--docker.host {text!r}: expected a URL such as {DEFAULT_DOCKER_HOST}")
    return str(text)


def _procfs(text: Any) -> Path:
    path = Path(str(text))
    if not path.is_dir():
        raise ConfigError(f"--path.procfs {text!r}: not a directory")
    return path


def _nonempty(key: str, text: Any) -> str:
    if not str(text).strip():
        raise ConfigError(f"--{key}: must not be empty")
    return str(text).strip()


def _int(key: str, raw: Any, low: int, high: int) -> int:
    try:
        number = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"--{key} {raw!r}: expected an integer") from None
    if not low <= number <= high:
        raise ConfigError(f"--{key} {number}: must be between {low} and {high}")
    return number
