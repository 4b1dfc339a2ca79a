"""The placer's flags (dotted, like the exporter's and the actuator's), validated once."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from gpuguard import flags
from gpuguard.flags import Flag
from gpuguard.placer.errors import ConfigError
from gpuguard.placer.ranking import DEFAULT_HEADROOM, DEFAULT_MAX_AGE_S, Policy
from gpuguard.placer.reservations import DEFAULT_SETTLE_S
from gpuguard.placer.service import DEFAULT_CLIENT_BURST, DEFAULT_CLIENT_RATE
from gpuguard.web import client, webconfig
from gpuguard.web.client import ClientConfig
from gpuguard.web.webconfig import WebConfig

DEFAULT_LISTEN = "127.0.0.1:10837"
DEFAULT_URL = "http://127.0.0.1:10837"
_LOG_LEVELS = ("debug", "info", "warning", "error")

FLAGS: tuple[Flag, ...] = (
    Flag("web.listen-address", DEFAULT_LISTEN,
         "host:port of the placer's API (an address beyond loopback needs --web.token-file)"),
    Flag("web.token-file", None, "file holding the bearer token API requests must present"),
    Flag("web.config.file", None, webconfig.FLAG_HELP + "; with basic_auth_users or verified "
         "client certificates the token is optional beyond loopback"),
    Flag("prometheus.url", "http://127.0.0.1:9090", "Prometheus that scrapes every exporter"),
    Flag("prometheus.http-config-file", None, client.flag_help("--prometheus.url"),
         metavar="PATH"),
    Flag("prometheus.timeout", "5s",
         "deadline of the records query's whole answer (connect, head and body)", "duration"),
    Flag("records.cache", "1s",
         "reuse one records query this long after its reply arrived (about a scrape)",
         "duration"),
    Flag("records.max-age", f"{DEFAULT_MAX_AGE_S:g}s",
         "a node whose exporter polled longer ago is never chosen (stale)", "duration"),
    Flag("placement.policy", str(Policy.GPUGUARD), "gpuguard or paper-c", metavar="POLICY"),
    Flag("placement.headroom", DEFAULT_HEADROOM,
         "share of a GPU's memory kept free after a placement (gpuguard policy)", "ratio"),
    Flag("placement.settle", f"{DEFAULT_SETTLE_S:g}s",
         "a placement counts until a record this much newer shows the node "
         "(container start-up + scrape interval)", "duration"),
    Flag("placement.client-rate", DEFAULT_CLIENT_RATE,
         "reservations (POST /api/v1/placement) per second each credential may make (the "
         "bearer token, a basic-auth user or a client certificate: a shared token is one "
         "budget)", "float"),
    Flag("placement.client-burst", DEFAULT_CLIENT_BURST,
         "reservations a credential may make at once before its rate applies", "int"),
    Flag("extender.enabled", False,
         "serve kube-scheduler's extender verbs (POST /api/v1/extender/filter, /prioritize); "
         "beyond loopback it needs --web.config.file with client_auth_type "
         "RequireAndVerifyClientCert", "bool"),
    Flag("log.level", "info", "debug, info, warning or error"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class PlacerConfig:
    listen_host: str
    listen_port: int
    token: str | None
    prometheus_url: str
    prometheus_timeout_s: float
    records_cache_s: float
    max_age_s: float
    policy: Policy
    headroom: float
    settle_s: float
    log_level: str
    client_rate: float = DEFAULT_CLIENT_RATE
    client_burst: int = DEFAULT_CLIENT_BURST
    web: WebConfig | None = None  # --web.config.file, as read at start-up
    prometheus_client: ClientConfig = client.NONE
    extender: bool = False  # --extender.enabled

    @property
    def extender_needs_certificates(self) -> bool:
        """kube-scheduler reaches the extender from beyond loopback, where only its client
        certificate can authenticate it: a web config reload must keep requiring one."""
        return self.extender and not flags.is_loopback(self.listen_host)


def add_flags(parser: argparse.ArgumentParser) -> None:
    flags.add_flags(parser, FLAGS)


@flags.reraise_as(ConfigError)
def load_config(args: argparse.Namespace) -> PlacerConfig:
    """Merge flags, file and defaults, and validate every value."""
    values = flags.merge(args, FLAGS)
    host, port = flags.listen_address(values, "web.listen-address", DEFAULT_LISTEN)
    token = flags.read_token(values["web.token-file"]) if values["web.token-file"] else None
    web = webconfig.web_config_from_flag(values["web.config.file"])
    if token is None and not flags.is_loopback(host) and not (web and web.authenticates):
        raise ConfigError(
            f"--web.listen-address {host}: beyond loopback the API needs --web.token-file "
            "(or --web.config.file with basic_auth_users or verified client certificates)"
        )
    headroom = flags.share(values, "placement.headroom")
    extender = flags.boolean(values, "extender.enabled")
    if extender:
        _check_extender_auth(host, web)
    return PlacerConfig(
        listen_host=host,
        listen_port=port,
        token=token,
        prometheus_url=flags.http_url(values, "prometheus.url", ("http", "https")),
        prometheus_timeout_s=flags.duration(values, "prometheus.timeout"),
        records_cache_s=flags.duration(values, "records.cache"),
        max_age_s=flags.duration(values, "records.max-age"),
        policy=Policy(flags.choice(values, "placement.policy", tuple(p.value for p in Policy))),
        headroom=headroom,
        settle_s=flags.duration(values, "placement.settle"),
        log_level=flags.choice(values, "log.level", _LOG_LEVELS),
        client_rate=flags.positive(values, "placement.client-rate", 10_000.0),
        client_burst=flags.integer(values, "placement.client-burst", 1, 100_000),
        web=web,
        prometheus_client=client.load_client_config(
            values["prometheus.http-config-file"], "prometheus.http-config-file"
        ),
        extender=extender,
    )


def _check_extender_auth(host: str, web: WebConfig | None) -> None:
    """kube-scheduler's extender client sends no Authorization header (no token, no basic
    auth): only a client certificate (its ``tlsConfig``) can say who it is."""
    if web is not None and web.users:
        raise ConfigError(
            "--extender.enabled: kube-scheduler sends no Authorization header, so the "
            "basic_auth_users of --web.config.file would refuse it; authenticate it by client "
            "certificate (client_auth_type RequireAndVerifyClientCert) instead"
        )
    verified = (
        web is not None
        and web.tls is not None
        and web.tls.client_auth == "RequireAndVerifyClientCert"
    )
    if not flags.is_loopback(host) and not verified:
        raise ConfigError(
            f"--extender.enabled on {host}: beyond loopback kube-scheduler must be "
            "authenticated by its client certificate: --web.config.file with client_auth_type "
            "RequireAndVerifyClientCert (it cannot send --web.token-file's token)"
        )
