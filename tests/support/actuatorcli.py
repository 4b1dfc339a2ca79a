"""The command line of a ``gpuguard actuator`` that tests start on its own: loopback, the
shipped rules, webhook mode, and an exporter address where nothing listens (so it reconciles
its journal as it would with the exporter down)."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuguard.demo.stack.process import free_port

REPO = Path(__file__).resolve().parents[2]


def actuator_argv(state_dir: Path, docker_url: str, port: int, token_file: Path) -> list[str]:
    """``python -m gpuguard.cli actuator`` on 127.0.0.1:``port``, node ``itest``."""
    return [
        sys.executable, "-m", "gpuguard.cli", "actuator", f"--web.listen-address=127.0.0.1:{port}",
        f"--web.token-file={token_file}", f"--exporter.url=http://127.0.0.1:{free_port()}",
        f"--docker.host={docker_url}", f"--state.dir={state_dir}", "--node.name=itest",
        "--mode=webhook", f"--rules.actions={REPO / 'rules' / 'actions.yml'}",
        f"--rules.files={REPO / 'rules' / '*.rules.yml'}",
    ]  # fmt: skip
