"""The actuator's flags (dotted, like Prometheus' own) and their one-time validation.

Values come from the command line, else from ``--config.file`` (YAML keyed by flag name
without the dashes, e.g. ``policy.order: edf``), else the defaults below. ``load_config``
checks everything once and returns a frozen ``Config``; anything wrong is one
``ConfigError`` line (the CLI prints it and exits 2).
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard import flags, resources
from gpuguard.actuator.configfiles import (
    containerd_address,
    engine_url,
    host_path,
    load_actions,
    private_state_dir,
    token_file,
)
from gpuguard.actuator.decision import ORDERS, PolicyConfig, RateLaw
from gpuguard.actuator.errors import ConfigError
from gpuguard.contract import AlertAction
from gpuguard.flags import Flag
from gpuguard.web import client, webconfig
from gpuguard.web.client import ClientConfig
from gpuguard.web.webconfig import WebConfig

MODES = ("webhook", "fast", "both")
PAUSE_METHODS = ("cgroup", "docker")

#: the engine to act through: the actuator's and the guard's alike (``engine.open_engine``)
#: the retired hold control's flags: accepted and ignored, with a warning naming what replaced them
RETIRED = (
    "policy.best-effort-min-share",
    "policy.best-effort-window",
    "policy.slo-best-effort-min-share",
    "policy.best-effort-hold",
    "policy.best-effort-hold-max",
    "policy.best-effort-coexist-demand",
)
REPLACED_BY = (
    "best-effort work is frozen on real-time busy edges and thawed in idle gaps where the "
    "launch probe or a gauge sees them, else run by rate control, --besteffort.*"
)
RETIRED_HELP = "retired (hold control): ignored, with a warning"

ENGINE_FLAGS: tuple[Flag, ...] = (
    Flag("docker.host", None, "Docker engine URL (default: DOCKER_HOST or the local socket)"),
    Flag("containerd.address", None,
         "act through containerd at this socket instead of Docker (a Kubernetes node)",
         metavar="URL"),
    Flag("containerd.namespace", "k8s.io", "containerd namespace (k8s.io: the Kubernetes CRI's)",
         metavar="NAMESPACE"),
)  # fmt: skip

FLAGS: tuple[Flag, ...] = (
    Flag("web.listen-address", "127.0.0.1:10836", "host:port of the actuator's HTTP server"),
    Flag("web.token-file", None, "file holding the bearer token webhooks must present "
         "(required, unless --web.insecure)"),
    Flag("web.insecure", False, "accept webhooks without a token (binds loopback only)", "bool"),
    Flag("web.config.file", None, webconfig.FLAG_HELP + "; with basic_auth_users or verified "
         "client certificates the token is optional"),
    Flag("exporter.url", "http://127.0.0.1:10835", "base URL of the gpuguard exporter"),
    Flag("exporter.http-config-file", None, client.flag_help("--exporter.url"), metavar="PATH"),
    Flag("exporter.timeout", "5s", "exporter unreachable this long -> resume all", "duration"),
    *ENGINE_FLAGS,
    Flag("swarm.manager", None, "Swarm manager engine URL for node labels (default: local)"),
    Flag("node.marker", "swarm",
         "how this node is marked: swarm (a Swarm node label) or kubernetes (a taint and a "
         "node label, through the API with the pod's service account)", metavar="MARKER"),
    Flag("kubernetes.api-server", None,
         "Kubernetes API server URL (default: in-cluster, the pod's service account)",
         metavar="URL"),
    Flag("node.name", None, "this node's name in alerts and the node list (default: hostname)"),
    Flag("mode", "both", "triggers: webhook, fast (exporter events) or both", metavar="MODE"),
    Flag("policy.order", "fifo", "admission order: fifo (task start) or edf (deadline)",
         metavar="ORDER"),
    Flag("policy.max-actions", 10, "most containers one decision may touch", "int"),
    Flag("policy.input-timeout", "5s",
         "a task idle this long before its kernel stops counting", "duration"),
    Flag("policy.memory-threshold", 0.95, "never admit above this share of GPU memory", "ratio"),
    *(Flag(name, None, RETIRED_HELP, metavar="IGNORED") for name in RETIRED),
    Flag("policy.one-at-a-time", False,
         "admit one task per device at a time (paper B), not by headroom", "bool"),
    Flag("policy.preempt", True,
         "freeze a computing task that holds a device a task with precedence waits for",
         "bool"),
    Flag("policy.preempt-quantum", "500ms",
         "a task admitted this recently is not preempted", "duration"),
    Flag("policy.slack-margin", "500ms",
         "a real-time container's freeze ends this long (and its typical run) before its "
         "deadline", "duration"),
    Flag("policy.best-effort-control", "rate",
         "best-effort beside real-time work: rate (frozen on a real-time container's busy "
         "edge and thawed in its idle gaps where the launch probe or its gauge sees it, "
         "else a duty cycle set by the real-time SLO); hold is retired: a warning, and rate",
         metavar="CONTROL"),
    Flag("besteffort.period", "1s", "rate control: the duty cycle's period", "duration"),
    Flag("besteffort.floor", 0.1,
         "rate control: least share of each period best-effort work runs", "ratio"),
    Flag("besteffort.floor-window", None,
         "on busy/idle edges the floor is held over this window instead of each period: a "
         "best-effort container that ran its share of it is not thawed into busy real-time "
         "work (default: ten periods; at least one; one: each period)", "duration"),
    Flag("besteffort.initial", 0.1,
         "rate control: the run fraction without an SLO signal, and where control starts",
         "ratio"),
    Flag("besteffort.gain", 0.2,
         "rate control: run fraction taken off per unit of SLO error (error 1: twice the "
         "error budget missed)", "float"),
    Flag("besteffort.gain-up", 0.05,
         "rate control: run fraction added per unit of room (-1: every request in time)",
         "float"),
    Flag("besteffort.deadband", 0.1, "rate control: SLO errors within this are noise",
         "float"),
    Flag("besteffort.max-step", 0.2, "rate control: most change of one step", "ratio"),
    Flag("besteffort.settle", "12s",
         "rate control: a change shows in the SLO signal after this (its 10s window, "
         "scrape and evaluation)", "duration"),
    Flag("besteffort.stale-after", "15s",
         "rate control: an older SLO reading is not believed (towards the floor)", "duration"),
    Flag("besteffort.max-slowdown", 1.05,
         "rate control without an SLO: the real-time side's mean slowdown the best-effort "
         "side may cause, from its measured demand (0: run --besteffort.initial)", "float"),
    Flag("prometheus.url", None,
         "Prometheus with gpuguard's rules and the tenants' latency (rate control's signal)",
         metavar="URL"),
    Flag("prometheus.http-config-file", None, client.flag_help("--prometheus.url"),
         metavar="PATH"),
    Flag("max-pause", "120s", "longest any container stays paused", "duration"),
    Flag("pause.method", "cgroup",
         "cgroup: freeze the container's cgroup (~1 ms), then docker pause it too; "
         "docker: docker pause only (runc: 13-100 ms)", metavar="METHOD"),
    Flag("path.procfs", "/proc", "the host's procfs (finds a container's cgroup)"),
    Flag("path.sysfs", "/sys", "the host's sysfs (its cgroups under fs/cgroup)"),
    Flag("node.mark-ttl", "5m",
         "a node mark no webhook renewed this long expires (Alertmanager repeats every 1m)",
         "duration"),
    Flag("state.dir", "/var/lib/gpuguard/actuator", "directory for the journal and audit log"),
    Flag("rules.actions", None, "alert name -> action map (default: the packaged actions.yml)",
         metavar="PATH"),
    Flag(
        "rules.files", None, "glob of rule files actions may name (default: the packaged rules)",
        metavar="GLOB",
    ),
    Flag("dry-run", False, "decide and audit, change nothing", "bool"),
    Flag("log.level", "info", "debug, info, warning or error"),
)  # fmt: skip
_BY_NAME = {f.name: f for f in FLAGS}


@dataclass(frozen=True)
class Config:
    """Validated configuration of one actuator."""

    listen_host: str
    listen_port: int
    token: str | None
    insecure: bool
    exporter_url: str
    exporter_timeout_s: float
    docker_host: str | None
    swarm_manager: str | None
    node_name: str
    mode: str
    policy: PolicyConfig
    max_pause_s: float
    node_mark_ttl_s: float
    state_dir: Path
    actions: Mapping[str, AlertAction]  # alert name -> what it makes the actuator do
    dry_run: bool
    log_level: str
    warnings: tuple[str, ...] = field(default=())
    pause_method: str = "cgroup"
    procfs: Path = Path("/proc")
    sysfs: Path = Path("/sys")
    containerd_address: str | None = None  # set: act through containerd, not Docker
    containerd_namespace: str = "k8s.io"
    node_marker: str = "swarm"  # swarm or kubernetes
    kubernetes_api_server: str | None = None  # None: in-cluster
    web: WebConfig | None = None  # --web.config.file, as read at start-up
    exporter_client: ClientConfig = client.NONE
    prometheus_url: str | None = None  # rate control's SLO signal; None: none
    prometheus_client: ClientConfig = client.NONE

    def alerts_for(self, action: AlertAction) -> frozenset[str]:
        return frozenset(name for name, act in self.actions.items() if act == action)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add every flag; unset flags stay absent so the config file can fill them."""
    flags.add_flags(parser, FLAGS)


@flags.reraise_as(ConfigError)
def load_config(args: argparse.Namespace) -> Config:
    """Merge command line > config file > defaults and validate the result."""
    return validate(flags.merge(args, FLAGS))


def _best_effort_warnings(
    values: Mapping[str, Any], policy: PolicyConfig, max_pause_s: float
) -> list[str]:
    """A retired flag given (ignored), and a best-effort freeze longer than ``--max-pause``
    (the guard would release it for good before it ends)."""
    warnings = [
        f"--{name} is retired ({REPLACED_BY}): ignored"
        for name in RETIRED
        if values.get(name) is not None
    ]
    if flags.choice(values, "policy.best-effort-control", ("hold", "rate")) == "hold":
        warnings.append(f"--policy.best-effort-control=hold is retired ({REPLACED_BY}): rate")
    if (1 - policy.rate.floor) * policy.rate.period_s >= max_pause_s:
        warnings.append(
            "--max-pause is shorter than a best-effort container's frozen part of "
            "--besteffort.period: it will be released for good before its run"
        )
    elif (1 - policy.rate.floor) * policy.rate.floor_window_s >= max_pause_s:
        warnings.append(
            "--max-pause is shorter than a best-effort container's longest freeze on busy "
            "edges ((1 - --besteffort.floor) x --besteffort.floor-window): it may be released "
            "for good before its floor is due"
        )
    return warnings


@flags.reraise_as(ConfigError)
def validate(values: Mapping[str, Any]) -> Config:
    """Check every value once; raises ``ConfigError`` with one clear line."""
    warnings: list[str] = []
    host, port = flags.listen_address(values, "web.listen-address", "127.0.0.1:10836")
    insecure = flags.boolean(values, "web.insecure")
    web = webconfig.web_config_from_flag(values["web.config.file"])
    token = token_file(
        values["web.token-file"], insecure or (web is not None and web.authenticates)
    )
    if insecure and not flags.is_loopback(host):
        warnings.append(f"--web.insecure: binding 127.0.0.1 instead of {host} (no token)")
        host = "127.0.0.1"
    elif insecure:
        warnings.append("--web.insecure: webhooks are accepted without a token (loopback only)")
    policy = PolicyConfig(
        order=flags.choice(values, "policy.order", ORDERS),
        max_actions=flags.integer(values, "policy.max-actions", minimum=1),
        input_timeout_s=flags.duration(values, "policy.input-timeout"),
        memory_threshold=flags.ratio(values, "policy.memory-threshold"),
        one_at_a_time=flags.boolean(values, "policy.one-at-a-time"),
        preempt=flags.boolean(values, "policy.preempt"),
        preempt_quantum_s=flags.duration(values, "policy.preempt-quantum"),
        slack_margin_s=flags.duration(values, "policy.slack-margin"),
        rate=rate_law(values),
    )
    max_pause_s = flags.duration(values, "max-pause")
    warnings += _best_effort_warnings(values, policy, max_pause_s)
    prometheus_url = (
        flags.http_url(values, "prometheus.url", ("http", "https"))
        if values.get("prometheus.url")
        else None
    )
    exporter_timeout = flags.duration(values, "exporter.timeout")
    policy = PolicyConfig(**{**policy.__dict__, "stale_after_s": exporter_timeout})
    state_dir = private_state_dir(Path(str(values["state.dir"])), warnings)
    if token is not None:
        warnings += flags.token_file_warnings(values["web.token-file"])
    exporter_client = client.load_client_config(
        values["exporter.http-config-file"], "exporter.http-config-file"
    )
    exporter_url = flags.http_url(values, "exporter.url", ("http", "https"))
    if exporter_client.username is not None and exporter_url.startswith("http:"):
        warnings.append("--exporter.http-config-file: basic auth over http:// sends the password "
                        "in clear (use an https --exporter.url)")  # fmt: skip
    return Config(
        listen_host=host,
        listen_port=port,
        token=token,
        insecure=insecure,
        exporter_url=exporter_url,
        exporter_timeout_s=exporter_timeout,
        docker_host=engine_url(values, "docker.host"),
        containerd_address=containerd_address(values),
        node_marker=flags.choice(values, "node.marker", ("swarm", "kubernetes")),
        kubernetes_api_server=(
            flags.http_url(values, "kubernetes.api-server", ("http", "https"))
            if values.get("kubernetes.api-server")
            else None
        ),
        containerd_namespace=flags.text(values, "containerd.namespace"),
        swarm_manager=engine_url(values, "swarm.manager"),
        node_name=flags.text(values, "node.name") if values["node.name"] else socket.gethostname(),
        mode=flags.choice(values, "mode", MODES),
        policy=policy,
        max_pause_s=max_pause_s,
        node_mark_ttl_s=flags.duration(values, "node.mark-ttl"),
        state_dir=state_dir,
        actions=load_actions(
            Path(values["rules.actions"] or resources.ACTIONS_FILE),
            str(values["rules.files"] or resources.RULE_FILES_GLOB),
        ),
        dry_run=flags.boolean(values, "dry-run"),
        log_level=flags.choice(values, "log.level", ("debug", "info", "warning", "error")),
        warnings=tuple(warnings),
        pause_method=flags.choice(values, "pause.method", PAUSE_METHODS),
        procfs=host_path(values, "path.procfs"),
        sysfs=host_path(values, "path.sysfs"),
        web=web,
        exporter_client=exporter_client,
        prometheus_url=prometheus_url,
        prometheus_client=client.load_client_config(
            values["prometheus.http-config-file"], "prometheus.http-config-file"
        ),
    )


#: rate control's shortest period: each switch is a freeze or a thaw (a thaw: Docker's
#: unpause, 13-100 ms of runc here)
MIN_PERIOD_S = 0.1


@flags.reraise_as(ConfigError)
def rate_law(values: Mapping[str, Any]) -> RateLaw:
    """The ``--besteffort.*`` flags as the rate controller's law."""
    period = flags.duration(values, "besteffort.period")
    if period < MIN_PERIOD_S:
        raise ConfigError(
            f"--besteffort.period {values['besteffort.period']!r}: must be at least 100ms"
        )
    floor = flags.share(values, "besteffort.floor")
    initial = flags.ratio(values, "besteffort.initial")
    if initial < floor:
        raise ConfigError("--besteffort.initial must be at least --besteffort.floor")
    given = values.get("besteffort.floor-window") is not None
    window = flags.duration(values, "besteffort.floor-window") if given else 10 * period
    if window < period:
        raise ConfigError(
            f"--besteffort.floor-window {values['besteffort.floor-window']!r}: must be at "
            "least --besteffort.period"
        )
    return RateLaw(
        period_s=period,
        floor=floor,
        floor_window_s=window,
        initial=initial,
        gain=flags.positive(values, "besteffort.gain", 10.0),
        gain_up=flags.positive(values, "besteffort.gain-up", 10.0),
        deadband=flags.share(values, "besteffort.deadband"),
        max_step=flags.ratio(values, "besteffort.max-step"),
        stale_after_s=flags.duration(values, "besteffort.stale-after"),
        settle_s=flags.duration(values, "besteffort.settle"),
        max_slowdown=_slowdown_bound(values),
    )


def _slowdown_bound(values: Mapping[str, Any]) -> float:
    """``--besteffort.max-slowdown``: 0 (none), or above 1 and at most 10."""
    name = "besteffort.max-slowdown"
    if not isinstance(values[name], bool) and values[name] in (0, "0"):
        return 0.0
    bound = flags.positive(values, name, 10.0)
    if bound <= 1:
        raise ConfigError(
            f"--{name} {values[name]!r}: must be above 1 (1.05: the real-time side at most "
            "5% slower on average) and at most 10, or 0 for none"
        )
    return bound
