"""Wiring: build the placer from its config and serve until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
import sys
import threading

from gpuguard.placer.config import PlacerConfig
from gpuguard.placer.http import placer_server
from gpuguard.placer.reservations import Reservations
from gpuguard.placer.service import Placer, Settings
from gpuguard.placer.source import PrometheusSource
from gpuguard.web.webconfig import WebConfigCollector, WebConfigWatcher

log = logging.getLogger("gpuguard.placer")


def run_placer(config: PlacerConfig) -> int:
    """Run the placer; returns the process exit status."""
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    source = PrometheusSource(
        config.prometheus_url,
        config.prometheus_timeout_s,
        config.records_cache_s,
        tls_auth=config.prometheus_client,
    )
    placer = Placer(
        source,
        Settings(
            config.policy,
            config.max_age_s,
            config.headroom,
            config.client_rate,
            config.client_burst,
        ),
        Reservations(config.settle_s),
    )
    try:
        web = None
        if config.web is not None:
            # without a token, the web config's authentication is all that guards reservations;
            # kube-scheduler's client certificate all that guards the extender
            require = config.token is None or config.extender_needs_certificates
            web = WebConfigWatcher(config.web, require_auth=require)
            placer.metrics.registry.register(WebConfigCollector(web))
        address = (config.listen_host, config.listen_port)
        server = placer_server(address, placer, config.token, web, with_extender=config.extender)
    except OSError as exc:
        print(
            f"gpuguard placer: cannot listen on {config.listen_host}:{config.listen_port}: "
            f"{exc.strerror}",
            file=sys.stderr,
        )
        source.close()
        return 1
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server.serve_in_thread()
    host, port = server.server_address[:2]
    log.info(
        "listening on %s://%s:%s (policy %s, records from %s%s)",
        config.web.scheme if config.web else "http", host, port, config.policy,
        config.prometheus_url, "; kube-scheduler extender on" if config.extender else "",
    )  # fmt: skip
    stop.wait()
    log.info("stopping")
    server.shutdown()
    server.server_close()
    source.close()
    return 0
