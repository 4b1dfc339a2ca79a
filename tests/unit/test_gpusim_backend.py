from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuguard.exporter.backends.base import open_backend
from gpuguard.exporter.backends.gpusim import GpusimBackend, parse_sample
from gpuguard.exporter.errors import BackendError, BackendUnavailable
from gpuguard.gpusim.config import DaemonConfig, DeviceSpec, parse_device_spec
from gpuguard.gpusim.errors import DaemonUnavailable
from gpuguard.gpusim.gpu import SimulatedGpu
from gpuguard.gpusim.protocol import parse_request
from tests.unit.exporter_fakes import three_container_poller
from tests.unit.fake_pynvml import NVML_ERROR_DRIVER_NOT_LOADED, FakeNvml

REPLY = {
    "ok": True,
    "timestamp_us": 1_763_776_000_123_456,
    "devices": [
        {
            "index": 0, "uuid": "GPU-sim-0", "name": "gpusim",
            "memory_total_bytes": 24 * 2**30, "memory_used_bytes": 2**30,
            "utilization_ratio": 0.5,
            "processes": [{"pid": 42, "used_memory_bytes": 2**30}],
            "process_samples": [
                {"pid": 42, "timestamp_us": 1_763_776_000_100_000, "sm_ratio": 0.5,
                 "mem_ratio": 0.1}
            ],
        }
    ],
}  # fmt: skip


def test_parse_sample() -> None:
    s = parse_sample(REPLY)
    assert s.timestamp == pytest.approx(1_763_776_000.123456)
    (d,) = s.devices
    assert (d.index, d.uuid, d.name, d.utilization_ratio) == (0, "GPU-sim-0", "gpusim", 0.5)
    assert d.processes[0].pid == 42 and d.processes[0].used_memory_bytes == 2**30
    assert d.process_samples[0].sm_ratio == 0.5


@pytest.mark.parametrize("reply", [{}, {"timestamp_us": 1, "devices": [{"index": 0}]}])
def test_malformed_reply(reply: dict[str, Any]) -> None:
    with pytest.raises(BackendError, match="malformed"):
        parse_sample(reply)


class FlakyClient:
    def __init__(self, replies: list[Any]) -> None:
        self.replies = replies
        self.since: list[int] = []
        self.closed = False

    def sample(self, since_us: int = 0) -> dict[str, Any]:
        self.since.append(since_us)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def close(self) -> None:
        self.closed = True


def test_since_us_follows_replies_and_errors_reconnect() -> None:
    made: list[FlakyClient] = []
    script = [REPLY, DaemonUnavailable("gone"), REPLY]

    def factory(path: Path) -> FlakyClient:
        made.append(FlakyClient(script))
        return made[-1]

    backend = GpusimBackend(Path("/x.sock"), factory)
    backend.sample()
    with pytest.raises(BackendError, match="gone"):
        backend.sample()
    backend.sample()
    assert len(made) == 2 and made[0].closed
    assert made[0].since == [0, REPLY["timestamp_us"]] and made[1].since == [REPLY["timestamp_us"]]


def test_no_daemon_is_a_backend_error(tmp_path: Path) -> None:
    socket = tmp_path / "gpusim.sock"
    socket.touch()  # a socket file nobody listens on
    with pytest.raises(BackendError, match="gpusim at"):
        GpusimBackend(socket).sample()


def test_no_socket_says_how_to_start_gpusim_and_healthz_says_it_too(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sock"
    with pytest.raises(BackendError) as err:
        GpusimBackend(missing).sample()
    assert f"`gpusim serve --socket {missing}`" in str(err.value)
    assert "--gpusim.socket" in str(err.value)
    # The exporter keeps polling (gpusim may start later); /healthz answers 503 with this.
    _, _, poller = three_container_poller(tmp_path / "proc")
    poller.backend = GpusimBackend(missing)
    poller.poll_once()
    assert f"no gpusim socket at {missing}: start gpusim" in (poller.health() or "")


def test_a_gpusim_socket_that_is_a_file_is_refused_at_start(tmp_path: Path) -> None:
    """Not a warning at every poll: ``gpuguard exporter`` exits 1 with this one line."""
    no_driver = FakeNvml([], init_error=NVML_ERROR_DRIVER_NOT_LOADED)
    for backend in ("gpusim", "auto"):  # auto: NVML fails, and a file is where gpusim's is
        with pytest.raises(BackendUnavailable, match=r"--gpusim\.socket /etc/passwd is not a"):
            open_backend(backend, Path("/etc/passwd"), nvml_module=no_driver)
    done = subprocess.run(
        [sys.executable, "-m", "gpuguard.cli", "exporter", "--gpu.backend", "gpusim",
         "--gpusim.socket", "/etc/passwd", "--web.listen-address", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "gpuguard exporter: --gpusim.socket /etc/passwd is not a socket: point it at the one "
        "`gpusim serve` listens on (or $GPUSIM_SOCKET)\n"
    )


def test_mig_devices_keep_their_index_and_have_no_utilization() -> None:
    # A real reply of the simulated GPU: GPU 0 in MIG mode with two instances, GPU 1 whole.
    config = DaemonConfig(
        devices=(
            parse_device_spec("name=a100,memory=80GiB,mig=3g.40gb+3g.40gb", 0),
            DeviceSpec(1),
        )
    )
    gpu = SimulatedGpu(config, 0.0, lambda: 1_000.0)
    gpu.handle(1, 42, parse_request(b'{"op": "context_create", "device": "0:1"}'), 0.0)
    sample = parse_sample({"ok": True, **gpu.sample(0.5, 0)})
    assert [d.key for d in sample.devices] == ["0", "0:0", "0:1", "1"]
    parent, _, instance, whole = sample.devices
    assert (parent.mig_index, instance.mig_index, whole.mig_index) == (None, 1, None)
    assert [p.pid for p in instance.processes] == [42] and parent.processes == ()
    assert instance.utilization_ratio is None and parent.utilization_ratio is None
    assert whole.utilization_ratio == 0.0
