"""Fixtures of the unit tests: gpusim served in-process, on its real Unix socket."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuguard.gpusim.config import DaemonConfig
from gpuguard.gpusim.daemon import Daemon


@pytest.fixture
def serve_gpusim() -> Iterator[Callable[[DaemonConfig], Daemon]]:
    """Factory: a daemon with this config, served from a thread, stopped afterwards."""
    served: list[tuple[Daemon, threading.Thread, Path]] = []

    def serve(config: DaemonConfig) -> Daemon:
        directory = Path(tempfile.mkdtemp(prefix="gs-"))  # short: socket paths max 108 bytes
        server = Daemon(directory / "gpusim.sock", config)
        server.bind()
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        served.append((server, thread, directory))
        return server

    yield serve
    for server, thread, directory in served:
        server.stop()
        thread.join(timeout=5)
        assert not thread.is_alive()
        assert not server.socket_path.exists()
        shutil.rmtree(directory, ignore_errors=True)
