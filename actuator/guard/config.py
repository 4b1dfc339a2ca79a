"""The guard's flags and their one-time validation into a frozen ``GuardConfig``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuguard import flags
from gpuguard.actuator.config import ENGINE_FLAGS
from gpuguard.actuator.configfiles import (
    containerd_address,
    engine_url,
    host_path,
    private_state_dir,
)
from gpuguard.actuator.errors import ConfigError
from gpuguard.flags import Flag
from gpuguard.web import webconfig
from gpuguard.web.webconfig import WebConfig

FLAGS: tuple[Flag, ...] = (
    Flag("state.dir", "/var/lib/gpuguard/actuator", "the actuator's --state.dir (shared)"),
    *ENGINE_FLAGS,
    Flag("max-pause", "120s", "resume any container the journal says is paused this long",
         "duration"),
    Flag("lease.timeout", "15s", "the actuator's lease older than this: it counts as stuck",
         "duration"),
    Flag("web.listen-address", "127.0.0.1:10838",
         "host:port of the guard's /metrics (Prometheus job gpuguard-guard)"),
    Flag("web.config.file", None, webconfig.FLAG_HELP),
    Flag("log.level", "info", "debug, info, warning or error"),
    Flag("path.procfs", "/proc", "the host's procfs (the actuator's --path.procfs)"),
    Flag("path.sysfs", "/sys", "the host's sysfs (the actuator's --path.sysfs)"),
)  # fmt: skip


@dataclass(frozen=True)
class GuardConfig:
    state_dir: Path
    docker_host: str | None
    max_pause_s: float
    lease_timeout_s: float
    log_level: str
    warnings: tuple[str, ...] = ()
    procfs: Path = Path("/proc")
    sysfs: Path = Path("/sys")
    listen_host: str = "127.0.0.1"
    listen_port: int = 10838
    containerd_address: str | None = None  # set: resume through containerd, not Docker
    containerd_namespace: str = "k8s.io"
    web: WebConfig | None = None  # --web.config.file, as read at start-up


@flags.reraise_as(ConfigError)
def validate(values: Mapping[str, Any]) -> GuardConfig:
    """Check every flag once; raises ``ConfigError`` with one clear line."""
    warnings: list[str] = []
    docker_host = engine_url(values, "docker.host")
    max_pause_s = flags.duration(values, "max-pause")
    lease_timeout_s = flags.duration(values, "lease.timeout")
    log_level = flags.choice(values, "log.level", ("debug", "info", "warning", "error"))
    procfs, sysfs = host_path(values, "path.procfs"), host_path(values, "path.sysfs")
    host, port = flags.listen_address(
        {"web.listen-address": values.get("web.listen-address", "127.0.0.1:10838")},
        "web.listen-address",
        "127.0.0.1:10838",
    )
    web = webconfig.web_config_from_flag(values.get("web.config.file"))
    # Last: a bad flag must leave no directory behind.
    state_dir = private_state_dir(Path(str(values["state.dir"])), warnings)
    return GuardConfig(
        state_dir,
        docker_host,
        max_pause_s,
        lease_timeout_s,
        log_level,
        tuple(warnings),
        procfs,
        sysfs,
        host,
        port,
        containerd_address(values),
        flags.text(values, "containerd.namespace")
        if "containerd.namespace" in values
        else "k8s.io",
        web,
    )
