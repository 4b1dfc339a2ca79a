"""Fixtures that start real services for integration tests and always tear them down.

Under ``CI=true`` a prerequisite that cannot start fails the test; elsewhere the test is
skipped with the reason printed (``-ra`` shows it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.images import ensure_base_image, python_container_kwargs
from gpuguard.demo.stack.process import ServiceError
from tests.prereq import Services, require_binary, unavailable
from tests.support.tlscerts import Pki, make_pki


@pytest.fixture(scope="session")
def short_tmp() -> Iterator[Path]:
    """A short temp dir: Unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gg-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throwaway CA with server and client certificates (tests/support/tlscerts.py)."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def dockerd(short_tmp: Path) -> Iterator[PrivateDockerd]:
    require_binary("dockerd")
    if os.geteuid() != 0:
        unavailable("a private dockerd needs root")
    engine = PrivateDockerd(short_tmp / "docker")
    try:
        engine.start()
    except ServiceError as exc:
        engine.stop()
        unavailable(f"private dockerd did not start: {exc}")
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def docker_client(dockerd: PrivateDockerd) -> Iterator[Any]:
    client = dockerd.client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def base_image(docker_client: Any) -> str:
    return ensure_base_image(docker_client)


@pytest.fixture
def run_python_container(docker_client: Any, base_image: str) -> Iterator[Callable[..., Any]]:
    """Start containers running ``python -m <module_args>``; removes them all afterwards."""
    made: list[Any] = []

    def run(
        module_args: list[str],
        labels: dict[str, str] | None = None,
        extra_mounts: dict[str, dict[str, str]] | None = None,
        environment: dict[str, str] | None = None,
        name: str | None = None,
    ) -> Any:
        kwargs = python_container_kwargs(
            module_args,
            labels=labels,
            extra_mounts=extra_mounts,
            environment=environment,
            name=name,
        )
        container = docker_client.containers.run(**kwargs)
        made.append(container)
        return container

    yield run
    for container in made:
        try:
            container.remove(force=True)
        except Exception:  # already gone is fine
            pass


@pytest.fixture
def gpusim_daemon(short_tmp: Path) -> Iterator[Callable[..., GpusimService]]:
    """Factory: start ``gpusim serve`` with options given as keyword flags."""
    services = Services()

    def start(**options: object) -> GpusimService:
        directory = Path(tempfile.mkdtemp(prefix="sim-", dir=short_tmp))
        return services.start(GpusimService(directory, options), "gpusim")

    yield start
    services.stop_all()
