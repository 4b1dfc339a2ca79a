"""Exporter configuration: dotted flags and an optional YAML file, validated once at start-up.

Precedence (``gpuguard.flags.merge``): a flag given on the command line, else the same key in
``--config.file``, else the default. Any invalid value raises ``ConfigError`` with one line
naming the key.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard import flags
from gpuguard.contract import TaskMode
from gpuguard.exporter.backends.base import BACKEND_CHOICES
from gpuguard.exporter.errors import ConfigError
from gpuguard.exporter.launchprobe import ProbeConfig
from gpuguard.exporter.record import RecordConfig
from gpuguard.exporter.tracker import TaskRules
from gpuguard.exporter.trust import (
    DEFAULT_POLICY,
    TRUST_ALL,
    TrustPolicy,
    load_policy,
)
from gpuguard.flags import Flag
from gpuguard.web import webconfig
from gpuguard.web.webconfig import WebConfig

DEFAULT_LISTEN = "127.0.0.1:10835"
DEFAULT_GPUSIM_SOCKET = "/run/gpusim/gpusim.sock"
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
DEFAULT_CONTAINERD_ADDRESS = "unix:///run/containerd/containerd.sock"
CONTAINER_SOURCES = ("docker", "containerd", "auto")
_DOCKER_SCHEMES = ("unix://", "tcp://", "http://", "https://", "ssh://", "npipe://")
_LOG_LEVELS = ("debug", "info", "warning", "error")

# A default of None is resolved in load_config (environment, hostname); the help says how.
FLAGS: tuple[Flag, ...] = (
    Flag("web.listen-address", DEFAULT_LISTEN, "host:port for /metrics and the API"),
    Flag("web.config.file", None, webconfig.FLAG_HELP),
    Flag("poll.interval", "100ms", "poll interval, e.g. 100ms, 0.5s", "duration"),
    Flag("gpu.backend", "auto",
         "auto, nvml or gpusim; auto uses NVML if it initialises, else gpusim",
         metavar="BACKEND"),
    Flag("gpusim.socket", None,
         f"gpusim socket (default: $GPUSIM_SOCKET or {DEFAULT_GPUSIM_SOCKET})",
         metavar="PATH"),
    Flag("docker.host", None,
         f"Docker engine URL (default: $DOCKER_HOST or {DEFAULT_DOCKER_HOST})"),
    Flag("container.source", "docker",
         "docker, containerd or auto; auto uses Docker if its socket exists, else containerd",
         metavar="SOURCE"),
    Flag("containerd.address", DEFAULT_CONTAINERD_ADDRESS, "containerd socket (ctr --address)",
         metavar="URL"),
    Flag("containerd.namespace", "k8s.io",
         "containerd namespace to follow (k8s.io: the Kubernetes CRI's)", metavar="NAMESPACE"),
    Flag("path.procfs", "/proc", "procfs mount point, e.g. the host's /proc mounted in"),
    Flag("node.name", None, "value of the node label (default: hostname)"),
    Flag("history.size", 256, "finished tasks kept for /api/v1/state's recent", "int"),
    Flag("events.buffer", 4096, "events kept for /api/v1/events followers", "int"),
    Flag("task.default-mode", "burst",
         "what a task is without a gpuguard.task label: process, memory or burst",
         metavar="MODE"),
    Flag("task.idle-gap", "500ms",
         "no SM activity or memory growth this long after computing ends a burst", "duration"),
    Flag("task.idle-timeout", "2s",
         "nothing visible this long ends a task (process mode excepted)", "duration"),
    Flag("log.level", "info", "debug, info, warning or error"),
    Flag("record.window", "30s",
         "node record: window over which missed deadlines count", "duration"),
    Flag("record.miss-ratio", 0.1,
         "node record: state 0 when more than this share of the window's tasks missed", "ratio"),
    Flag("record.busy-window", "5s",
         "node record: window over which GPU utilization is averaged", "duration"),
    Flag("record.busy-threshold", 0.99,
         "node record: average utilization at or above which the GPU counts as 100%%", "ratio"),
    Flag("record.memory-threshold", 0.95,
         "node record: share of GPU memory in use at or above which it counts as full", "ratio"),
    Flag("probe.launch", "auto",
         "auto or off; auto attaches eBPF uprobes to the CUDA driver library where the host "
         "allows (CAP_BPF and CAP_PERFMON), else sees GPU work through NVML alone",
         metavar="MODE"),
    Flag("probe.library", None,
         "driver library to probe (default: gpusim's libcuda.so.1 beside --gpusim.socket, "
         "else the driver's libcuda.so.1)", metavar="PATH"),
    Flag("probe.binary", None,
         "the probe program (default: gpuguard-launchprobe on PATH, else built here with "
         "clang, bpftool, libbpf)", metavar="PATH"),
    Flag("probe.interval", "10ms", "how often the probe's counts are read: 1ms to 1s",
         "duration"),
    Flag("probe.task-gap", "10ms",
         "launch source: busy periods closer than this are one task", "duration"),
    Flag("probe.idle-timeout", "500ms",
         "launch source: no launch and no wait this long ends a task without a wait",
         "duration"),
    Flag("gauge.host", "127.0.0.1",
         "where containers that declare gpuguard.inflight.metric serve /metrics (their "
         "gpuguard.inflight.port or gpuguard.slo.port): containers on the host's network",
         metavar="HOST"),
    Flag("trust.policy-file", None,
         "YAML file of what each image, name or Kubernetes namespace may claim by label and "
         "who is managed (default: the built-in policy for a shared host; docs/security.md)",
         metavar="PATH"),
    Flag("trust.all", False,
         "believe every claim containers make by label, with no trust policy: for a "
         "single-tenant host or the demo only (docs/security.md)", "bool"),
)  # fmt: skip


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
    record: RecordConfig = field(default_factory=RecordConfig)
    task_rules: TaskRules = field(default_factory=TaskRules)
    container_source: str = "docker"  # docker or containerd (auto is resolved at start-up)
    containerd_address: str = DEFAULT_CONTAINERD_ADDRESS
    containerd_namespace: str = "k8s.io"
    trust: TrustPolicy = DEFAULT_POLICY
    web: WebConfig | None = None  # --web.config.file, as read at start-up
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    gauge_host: str = "127.0.0.1"


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add the exporter's dotted flags (defaults are applied later, in ``load_config``)."""
    flags.add_flags(parser, FLAGS, "YAML file with the same keys as the flags (flags win)")


@flags.reraise_as(ConfigError)
def load_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ExporterConfig:
    """Merge flags, file and defaults, and validate every value."""
    env = os.environ if env is None else env
    values = flags.merge(args, FLAGS)
    if values["gpusim.socket"] is None:
        values["gpusim.socket"] = env.get("GPUSIM_SOCKET") or DEFAULT_GPUSIM_SOCKET
    if values["docker.host"] is None:
        values["docker.host"] = env.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    if values["node.name"] is None:
        values["node.name"] = socket.gethostname()
    values["log.level"] = str(values["log.level"]).lower()
    host, port = flags.listen_address(values, "web.listen-address", DEFAULT_LISTEN)
    return ExporterConfig(
        listen_host=host,
        listen_port=port,
        poll_interval_s=_interval(values),
        gpu_backend=flags.choice(values, "gpu.backend", BACKEND_CHOICES),
        gpusim_socket=Path(str(values["gpusim.socket"])),
        docker_host=_docker_host(values["docker.host"]),
        procfs=_procfs(values["path.procfs"]),
        node_name=_nonempty("node.name", flags.text(values, "node.name")),
        history_size=flags.integer(values, "history.size", 1, 1_000_000),
        events_buffer=flags.integer(values, "events.buffer", 16, 10_000_000),
        log_level=flags.choice(values, "log.level", _LOG_LEVELS),
        record=_record(values),
        task_rules=_task_rules(values),
        container_source=flags.choice(values, "container.source", CONTAINER_SOURCES),
        containerd_address=_containerd_address(values["containerd.address"]),
        containerd_namespace=_nonempty(
            "containerd.namespace", flags.text(values, "containerd.namespace")
        ),
        trust=_trust(values["trust.policy-file"], flags.boolean(values, "trust.all")),
        web=webconfig.web_config_from_flag(values["web.config.file"]),
        probe=_probe(values),
        gauge_host=_nonempty("gauge.host", flags.text(values, "gauge.host")),
    )


def _probe(values: Mapping[str, Any]) -> ProbeConfig:
    interval = flags.duration(values, "probe.interval")
    if not 0.001 <= interval <= 1:
        raise ConfigError(
            f"--probe.interval {values['probe.interval']!r}: must be between 1ms and 1s"
        )
    library, binary = values["probe.library"], values["probe.binary"]
    return ProbeConfig(
        enabled=flags.choice(values, "probe.launch", ("auto", "off")) == "auto",
        library=Path(str(library)) if library else None,
        binary=Path(str(binary)) if binary else None,
        interval_s=interval,
        task_gap_s=flags.duration(values, "probe.task-gap"),
        idle_timeout_s=flags.duration(values, "probe.idle-timeout"),
    )


def _trust(path: Any, trust_all: bool) -> TrustPolicy:
    """The built-in default unless ``--trust.all`` or ``--trust.policy-file`` says otherwise."""
    given = path is not None and str(path) != ""
    if trust_all and given:
        raise ConfigError("--trust.all and --trust.policy-file exclude each other: give one")
    if trust_all:
        return TRUST_ALL
    if not given:
        return DEFAULT_POLICY
    return load_policy(Path(str(path)))


def _record(values: Mapping[str, Any]) -> RecordConfig:
    window = flags.duration(values, "record.window")
    busy_window = flags.duration(values, "record.busy-window")
    if not 0.1 <= busy_window <= window:
        raise ConfigError(
            f"--record.busy-window {values['record.busy-window']!r}: "
            "must be between 100ms and --record.window"
        )
    return RecordConfig(
        window_s=window,
        miss_ratio=flags.share(values, "record.miss-ratio"),
        busy_window_s=busy_window,
        busy_threshold=flags.ratio(values, "record.busy-threshold"),
        memory_threshold=flags.ratio(values, "record.memory-threshold"),
    )


def _interval(values: Mapping[str, Any]) -> float:
    seconds = flags.duration(values, "poll.interval")
    if not 0.01 <= seconds <= 60:
        raise ConfigError(
            f"--poll.interval {values['poll.interval']!r}: must be between 10ms and 60s"
        )
    return seconds


def _task_rules(values: Mapping[str, Any]) -> TaskRules:
    mode = flags.choice(values, "task.default-mode", tuple(TaskMode))
    gap = flags.duration(values, "task.idle-gap")
    timeout = flags.duration(values, "task.idle-timeout")
    if timeout < gap:
        raise ConfigError(
            f"--task.idle-timeout {values['task.idle-timeout']!r}: must be at least --task.idle-gap"
        )
    return TaskRules(TaskMode(mode), gap, timeout)


def _docker_host(text: Any) -> str:
    if not str(text).startswith(_DOCKER_SCHEMES):
        raise ConfigError(f"--docker.host {text!r}: expected a URL such as {DEFAULT_DOCKER_HOST}")
    return str(text)


def _containerd_address(text: Any) -> str:
    address = str(text)
    if not address.removeprefix("unix://").startswith("/"):
        raise ConfigError(
            f"--containerd.address {text!r}: expected a socket path such as "
            f"{DEFAULT_CONTAINERD_ADDRESS}"
        )
    return address


def pick_container_source(config: ExporterConfig) -> str:
    """``auto``: Docker where its socket exists (its containerd runs beneath it), else
    containerd where its socket exists, else Docker (which the source keeps retrying)."""
    if config.container_source != "auto":
        return config.container_source
    docker_socket = config.docker_host.removeprefix("unix://")
    if config.docker_host.startswith("unix://") and Path(docker_socket).exists():
        return "docker"
    if Path(config.containerd_address.removeprefix("unix://")).exists():
        return "containerd"
    return "docker"


def _procfs(text: Any) -> Path:
    path = Path(str(text))
    if not path.is_dir():
        raise ConfigError(f"--path.procfs {text!r}: not a directory")
    return path


def _nonempty(key: str, text: Any) -> str:
    if not str(text).strip():
        raise ConfigError(f"--{key}: must not be empty")
    return str(text).strip()
