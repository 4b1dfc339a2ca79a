"""The gpusim daemon over its real Unix socket, served in-process from a thread."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuguard.gpusim.client import GpusimClient
from gpuguard.gpusim.config import DaemonConfig, DeviceSpec
from gpuguard.gpusim.daemon import MAX_PENDING_BYTES, Daemon, SocketInUse, prepare_socket_path
from gpuguard.gpusim.errors import GpusimError, OutOfMemory
from tests.waiting import wait_for

GIB = 2**30
MIB = 2**20
TIME_SCALE = 0.05
PERIOD = 0.1


@pytest.fixture
def daemon(serve_gpusim: Callable[[DaemonConfig], Daemon]) -> Daemon:
    return serve_gpusim(
        DaemonConfig(
            devices=(DeviceSpec(0, "sim0", 4 * GIB), DeviceSpec(1, "small", 1 * GIB)),
            time_scale=TIME_SCALE,
            copy_time_scale=TIME_SCALE,
            context_memory_bytes=300 * MIB,
            sample_period_s=PERIOD,
        )
    )


@pytest.fixture
def connect(daemon: Daemon) -> Iterator[Callable[[], GpusimClient]]:
    clients: list[GpusimClient] = []

    def make() -> GpusimClient:
        client = GpusimClient(daemon.socket_path, timeout=10)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def raw_request(sock: socket.socket, line: bytes) -> dict[str, Any]:
    sock.sendall(line)
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        assert chunk, "daemon closed the connection"
        data += chunk
    reply: dict[str, Any] = json.loads(data)
    return reply


def state(client: GpusimClient) -> list[dict[str, Any]]:
    """The parts of status a request could change: memory and processes per device."""
    return [
        {k: d[k] for k in ("index", "memory_used_bytes", "processes")}
        for d in client.status()["devices"]
    ]


BAD_LINES = [
    (b"{not json\n", "bad_request"),
    (b"\xff\xfe\n", "bad_request"),
    (b"[1, 2]\n", "bad_request"),
    (b'{"no_op": 1}\n', "bad_request"),
    (b'{"op": "launch_missiles"}\n', "bad_request"),
    (b'{"op": "context_create"}\n', "bad_request"),
    (b'{"op": "context_create", "device": "zero"}\n', "bad_request"),
    (b'{"op": "context_create", "device": -1}\n', "bad_request"),
    (b'{"op": "context_create", "device": "0:"}\n', "bad_request"),
    (b'{"op": "context_create", "device": true}\n', "bad_request"),
    (b'{"op": "context_create", "device": 7}\n', "invalid_device"),
    (b'{"op": "context_create", "device": "0:1"}\n', "invalid_device"),
    (b'{"op": "context_create", "device": "GPU-nope"}\n', "invalid_device"),
    (b'{"op": "launch", "work": 1}\n', "no_context"),
    (b'{"op": "synchronize"}\n', "no_context"),
    (b'{"op": "event_record"}\n', "no_context"),
    (b'{"op": "alloc", "bytes": 10}\n', "no_context"),
    (b'{"op": "copy_in", "bytes": 10}\n', "no_context"),
    (b'{"op": "kernel", "work": 1}\n', "no_context"),
    (b'{"op": "context_destroy"}\n', "no_context"),
    (b'{"op": "sample", "since_us": -1}\n', "bad_request"),
    (b'{"op": "sample", "since_us": true}\n', "bad_request"),
]

BAD_WITH_CONTEXT = [
    (b'{"op": "alloc"}\n', "bad_request"),
    (b'{"op": "alloc", "bytes": -5}\n', "bad_request"),
    (b'{"op": "alloc", "bytes": 0}\n', "bad_request"),
    (b'{"op": "alloc", "bytes": 1.5}\n', "bad_request"),
    (b'{"op": "alloc", "bytes": true}\n', "bad_request"),
    (b'{"op": "copy_in", "bytes": "lots"}\n', "bad_request"),
    (b'{"op": "kernel", "work": -1}\n', "bad_request"),
    (b'{"op": "kernel", "work": Infinity}\n', "bad_request"),
    (b'{"op": "kernel", "work": "1"}\n', "bad_request"),
    (b'{"op": "kernel"}\n', "bad_request"),
    (b'{"op": "launch", "work": 1, "flops": 1e9}\n', "bad_request"),
    (b'{"op": "launch", "flops": 0}\n', "bad_request"),
    (b'{"op": "free", "handle": 999}\n', "invalid_handle"),
    (b'{"op": "free"}\n', "bad_request"),
    (b'{"op": "context_create", "device": 0}\n', "context_exists"),
    (b'{"op": "alloc", "bytes": 1099511627776}\n', "out_of_memory"),
]


def test_bad_requests_get_errors_and_change_nothing(
    daemon: Daemon, connect: Callable[[], GpusimClient]
) -> None:
    observer = connect()
    holder = connect()
    holder.context_create(0)
    holder.alloc(100 * MIB)
    before = state(observer)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(daemon.socket_path))
        for line, code in BAD_LINES:
            reply = raw_request(sock, line)
            assert reply["ok"] is False, line
            assert reply["error"] == code, (line, reply)
            assert reply["message"]
            assert state(observer) == before, line
        # The connection is still usable after all those errors.
        assert raw_request(sock, b'{"op": "context_create", "device": 0}\n')["ok"] is True
        with_context = state(observer)
        for line, code in BAD_WITH_CONTEXT:
            reply = raw_request(sock, line)
            assert (reply["ok"], reply["error"]) == (False, code), (line, reply)
            assert state(observer) == with_context, line


def test_overlong_line_is_refused_and_connection_survives(daemon: Daemon) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(daemon.socket_path))
        sock.sendall(b"x" * 200_000)
        reply = raw_request(sock, b"yyy\n")
        assert reply["error"] == "bad_request"
        assert "too long" in reply["message"]
        assert raw_request(sock, b'{"op": "status"}\n')["ok"] is True


def test_context_reports_host_pid_and_memory(connect: Callable[[], GpusimClient]) -> None:
    client = connect()
    reply = client.context_create(0)
    assert reply["pid"] == os.getpid()  # from SO_PEERCRED
    assert reply["memory_bytes"] == 300 * MIB
    handle = client.alloc(GIB)
    device = client.sample()["devices"][0]
    assert device["memory_used_bytes"] == 300 * MIB + GIB
    assert device["processes"] == [{"pid": os.getpid(), "used_memory_bytes": 300 * MIB + GIB}]
    client.free(handle)
    with pytest.raises(GpusimError) as err:
        client.free(handle)
    assert err.value.code == "invalid_handle"
    client.context_destroy()
    assert client.sample()["devices"][0]["processes"] == []


def test_out_of_memory_like_cuda_malloc(connect: Callable[[], GpusimClient]) -> None:
    client = connect()
    client.context_create(1)  # 1 GiB device, 300 MiB taken by the context
    with pytest.raises(OutOfMemory):
        client.alloc(800 * MIB)
    client.alloc(724 * MIB)  # exactly what is left
    with pytest.raises(OutOfMemory):
        client.alloc(1)
    other = connect()
    with pytest.raises(OutOfMemory):
        other.context_create(1)  # not even room for a context
    assert client.sample()["devices"][1]["memory_used_bytes"] == GIB


def test_disconnect_frees_memory_at_once(connect: Callable[[], GpusimClient]) -> None:
    observer = connect()
    client = connect()
    client.context_create(0)
    client.alloc(GIB)
    client.close()
    wait_for(
        lambda: observer.sample()["devices"][0]["memory_used_bytes"] == 0,
        timeout=1.0,
        interval=0.01,
    )


def test_disconnect_during_a_kernel_frees_everything(
    daemon: Daemon, connect: Callable[[], GpusimClient]
) -> None:
    observer = connect()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(daemon.socket_path))
        assert raw_request(sock, b'{"op": "context_create", "device": 0}\n')["ok"]
        sock.sendall(b'{"op": "kernel", "work": 1000}\n')  # 50 s at this scale
        wait_for(
            lambda: observer.status()["devices"][0]["processes"][0]["phase"] == "kernel",
            timeout=5.0,
            interval=0.01,
        )
    wait_for(lambda: observer.sample()["devices"][0]["processes"] == [], timeout=1.0, interval=0.01)
    assert observer.sample()["devices"][0]["memory_used_bytes"] == 0


def test_killed_process_frees_its_memory(
    daemon: Daemon, connect: Callable[[], GpusimClient]
) -> None:
    observer = connect()
    argv = [sys.executable, "-m", "gpuguard.gpusim.workload", "--socket", str(daemon.socket_path)]
    argv += ["--work-seconds", "1000", "--memory-bytes", "3GiB", "--log", os.devnull]
    proc = subprocess.Popen(argv)
    try:
        wait_for(
            lambda: observer.sample()["devices"][0]["processes"] != [], timeout=10, interval=0.01
        )
        procs = observer.sample()["devices"][0]["processes"]
        assert procs[0]["pid"] == proc.pid
        proc.kill()
        proc.wait(timeout=5)
        wait_for(
            lambda: observer.sample()["devices"][0]["memory_used_bytes"] == 0,
            timeout=1,
            interval=0.01,
        )
    finally:
        proc.kill()
        proc.wait(timeout=5)


def test_kernel_takes_scaled_time(connect: Callable[[], GpusimClient]) -> None:
    client = connect()
    client.context_create(0)
    t0 = time.time()
    started, ended = client.kernel(2.0)  # 2 device-seconds at scale 0.05: 0.1 s
    t1 = time.time()
    assert ended - started == pytest.approx(2.0 * TIME_SCALE, abs=0.005)
    assert t0 - 0.01 <= started and ended <= t1 + 0.01
    assert 0.1 <= t1 - t0 < 0.3  # generous: the machine may be busy
    seconds = client.copy_in(int(7.5e9))  # 1 s of bandwidth at copy scale 0.05
    assert seconds == pytest.approx(TIME_SCALE, rel=0.01)


def test_two_kernels_time_slice(connect: Callable[[], GpusimClient]) -> None:
    clients = [connect(), connect()]
    results: list[tuple[float, float]] = []
    for client in clients:
        client.context_create(0)

    def run(client: GpusimClient) -> None:
        results.append(client.kernel(4.0))

    threads = [threading.Thread(target=run, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    alone = 4.0 * TIME_SCALE
    for started, ended in results:
        # Two sharers take 2 x alone plus paper B's context-switch overhead (2.16 x in all);
        # the margin allows for the second thread starting a little late.
        assert ended - started > 1.8 * alone


def test_utilization_and_process_samples(connect: Callable[[], GpusimClient]) -> None:
    observer = connect()
    a, b = connect(), connect()
    a.context_create(0)
    b.context_create(0)
    assert observer.sample()["devices"][0]["utilization_ratio"] == 0.0
    # Sent without waiting for the reply, so this thread can look while they run.
    for client in (a, b):
        client.send("kernel", work=20)  # 1 s alone, about 2.2 s shared
    time.sleep(2 * PERIOD)
    reply = observer.sample()
    device = reply["devices"][0]
    assert device["utilization_ratio"] == 1.0
    samples = {s["pid"]: s for s in device["process_samples"]}
    assert list(samples) == [os.getpid()]  # both connections are this one process
    assert samples[os.getpid()]["sm_ratio"] == pytest.approx(1.0)
    # taken at the driver's last instant: within one sample period before now
    age_us = reply["timestamp_us"] - samples[os.getpid()]["timestamp_us"]
    assert 0 <= age_us <= PERIOD * 1e6
    status = observer.status()["devices"][0]["processes"]
    assert status[0]["phase"] == "kernel" and status[0]["kernels_running"] == 2
    for client in (a, b):
        assert client.receive()["ok"] is True
    time.sleep(2 * PERIOD)
    idle = observer.sample(since_us=int(time.time() * 1e6))
    assert idle["devices"][0]["utilization_ratio"] == 0.0
    assert idle["devices"][0]["process_samples"] == []  # nothing ran after since_us


def test_sm_ratio_splits_between_processes(daemon: Daemon) -> None:
    # Two distinct processes: this one and a workload subprocess.
    argv = [sys.executable, "-m", "gpuguard.gpusim.workload", "--socket", str(daemon.socket_path)]
    argv += ["--work-seconds", "1000", "--memory-bytes", "3MiB", "--log", os.devnull]
    proc = subprocess.Popen(argv)
    try:
        with GpusimClient(daemon.socket_path) as observer, GpusimClient(daemon.socket_path) as me:
            wait_for(
                lambda: observer.status()["devices"][0]["processes"] != [],
                timeout=10,
                interval=0.01,
            )
            wait_for(
                lambda: observer.status()["devices"][0]["processes"][0]["phase"] == "kernel",
                timeout=5.0,
                interval=0.01,
            )
            me.context_create(0)
            me.send("kernel", work=1000)
            time.sleep(2 * PERIOD)
            samples = {
                s["pid"]: s["sm_ratio"] for s in observer.sample()["devices"][0]["process_samples"]
            }
            assert samples == {
                os.getpid(): pytest.approx(0.5, abs=0.02),
                proc.pid: pytest.approx(0.5, abs=0.02),
            }
    finally:
        proc.kill()
        proc.wait(timeout=5)


def test_stale_socket_is_replaced_and_live_one_refused(daemon: Daemon) -> None:
    with pytest.raises(SocketInUse):
        prepare_socket_path(daemon.socket_path)
    directory = Path(tempfile.mkdtemp(prefix="gs-"))
    try:
        stale = directory / "s.sock"
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(stale))
        dead.close()  # the file stays, nobody listens
        prepare_socket_path(stale)
        assert not stale.exists()
    finally:
        shutil.rmtree(directory)


def test_socket_is_world_writable(daemon: Daemon) -> None:
    assert daemon.socket_path.stat().st_mode & 0o777 == 0o666


def test_pipelined_requests_are_answered_in_order(connect: Callable[[], GpusimClient]) -> None:
    client = connect()
    client.context_create(0)
    client.send("kernel", work=2.0)
    client.send("alloc", bytes=-1)
    client.send("status")
    assert "ended" in client.receive()
    with pytest.raises(GpusimError) as err:
        client.receive()
    assert err.value.code == "bad_request"
    assert client.receive()["devices"][0]["processes"][0]["phase"] == "idle"


def _send_until_blocked(sock: socket.socket, line: bytes, limit: int) -> int:
    """Send copies of ``line`` without reading replies until the socket stays blocked."""
    payload, sent = line * (65536 // len(line)), 0
    sock.setblocking(False)
    for _ in range(20):  # the daemon gets time to read between attempts
        try:
            while sent < limit:
                # Go on where a partial send stopped, so that every line stays whole.
                sent += sock.send(payload[sent % len(payload) :])
        except BlockingIOError:
            time.sleep(0.02)
    return sent


def _only_connection(daemon: Daemon) -> Any:
    (conn,) = daemon._connections.values()
    return conn


# Without the bound, the daemon took in all 32 MiB a client sent.
BOUND = 2**20 + 65536


def test_a_client_that_pipelines_behind_a_kernel_gets_backpressure(daemon: Daemon) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(daemon.socket_path))
        assert raw_request(sock, b'{"op": "context_create", "device": 0}\n')["ok"]
        sock.sendall(b'{"op": "kernel", "work": 1000}\n')  # busy for 50 s
        sent = _send_until_blocked(sock, b'{"op": "status"}\n', limit=32 * 2**20)
        assert sent < 8 * 2**20  # the daemon stopped reading: the socket blocked
        assert MAX_PENDING_BYTES <= len(_only_connection(daemon).inbuf) <= BOUND


def test_a_client_that_never_reads_replies_gets_backpressure(daemon: Daemon) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(daemon.socket_path))
        sent = _send_until_blocked(sock, b'{"op": "status"}\n', limit=32 * 2**20)
        assert sent < 8 * 2**20
        conn = _only_connection(daemon)
        assert MAX_PENDING_BYTES <= len(conn.outbuf) <= BOUND
        assert len(conn.inbuf) <= BOUND
        # Reading the replies lets the daemon go on: every request gets its answer.
        sock.setblocking(True)
        sock.settimeout(10)
        expected, got, data = sent // len(b'{"op": "status"}\n'), 0, b""
        while got < expected:
            data += sock.recv(1 << 20)
            got += data.count(b"\n")
            data = data[data.rfind(b"\n") + 1 :]
        assert got == expected


def test_launch_event_and_synchronize_over_the_socket(
    connect: Callable[[], GpusimClient],
) -> None:
    client = connect()
    assert client.context_create("0")["device"] == "0"
    t0 = time.time()
    assert [client.launch(work=1.0) for _ in range(3)] == [1, 2, 3]  # 0.05 s each
    mark = client.event_record()
    assert time.time() - t0 < 0.1  # launches do not wait for the kernels
    events = client.synchronize()
    assert time.time() - t0 >= 0.15
    assert list(events) == [mark] and events[mark] == pytest.approx(t0 + 0.15, abs=0.05)
    with pytest.raises(ValueError):
        client.launch()
