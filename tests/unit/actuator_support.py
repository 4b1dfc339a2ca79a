"""An in-process actuator Controller for unit tests: real journal, audit log and metrics.

Docker and the exporter are addresses where nothing listens, so whatever needs them fails
the way an unreachable engine or exporter does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuguard.actuator.app import open_journal
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.config import FLAGS, Config, validate
from gpuguard.actuator.controller import Controller
from gpuguard.actuator.engine.docker import DockerEngine
from gpuguard.actuator.engine.swarm import SwarmMarker
from gpuguard.actuator.execution.executor import PauseExecutor
from gpuguard.actuator.exporter_client import ExporterClient
from gpuguard.actuator.metrics import ActuatorMetrics
from gpuguard.actuator.safety.statewrites import StateWrites
from gpuguard.demo.stack.process import free_port

REPO = Path(__file__).resolve().parents[2]


def actuator_config(tmp_path: Path, **values: Any) -> Config:
    if not (tmp_path / "token").exists():
        (tmp_path / "token").write_text("t0ken-for-tests")
        (tmp_path / "token").chmod(0o600)
    return validate(
        {f.name: f.default for f in FLAGS}
        | {
            "web.listen-address": "127.0.0.1:0",
            "web.token-file": str(tmp_path / "token"),
            "exporter.url": f"http://127.0.0.1:{free_port()}",
            "node.name": "host-a",
            "mode": "webhook",
            "state.dir": str(tmp_path / "state"),
            "rules.actions": str(REPO / "rules" / "actions.yml"),
            "rules.files": str(REPO / "rules" / "*.rules.yml"),
        }
        | values
    )


def make_controller(tmp_path: Path, docker_url: str | None = None, **values: Any) -> Controller:
    """A Controller on ``tmp_path/state``; Docker at ``docker_url`` (default: nowhere)."""
    config = actuator_config(tmp_path, **values)
    engine = DockerEngine(docker_url or "unix:///nonexistent/docker.sock", timeout_s=1)
    writes = StateWrites()  # one for the state directory, as the actuator has
    journal, journal_lost = open_journal(config.state_dir, writes)  # as the actuator opens it
    audit = AuditLog(config.state_dir / "audit.jsonl", writes)
    executor = PauseExecutor(engine, journal, audit, retry_delay_s=0.001)
    return Controller(
        config,
        lambda: ExporterClient(config.exporter_url, timeout_s=0.5),
        executor,
        journal,
        audit,
        ActuatorMetrics(config.node_name, writes=writes),
        SwarmMarker(engine, engine),
        journal_lost,
    )
