"""What the exporter costs: one poll cycle, /metrics render, RSS and idle CPU.

1. Poll cycle (GPU sample + owner lookup + join + track + snapshot), CPU time of the polling
   thread, at 10 / 100 / 1,000 containers each with one GPU process: an in-memory backend,
   a static container index and a fake procfs tree (``<tmp>/<pid>/{stat,cgroup}``).
2. Paper B's Algorithm 1 as written (list containers, ``docker top`` each, compare PIDs)
   against a real private dockerd with a few real containers, in the same run. Its cost is
   wall time per container (the work happens in dockerd, not in the caller), extrapolated
   linearly to 100 containers: said so in the output.
3. /metrics render (rows + text) at 1,000 containers, each with a running task, beside
   prometheus_client's ``generate_latest`` over the same snapshots (the baseline).
4. A real exporter subprocess (gpusim backend, private dockerd) polling at 100 ms: VmRSS
   and CPU share after it settles.

The last line is one JSON object:
``{"poll_ms_100": ..., "algorithm1_poll_ms_100": ..., "render_ms_1000": ..., "rss_mb": ...}``.

    python bench/exporter_cost.py            # about a minute
    python bench/exporter_cost.py --quick    # well under a minute
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
)

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from gpuguard.demo.stack.process import exit_on_sigterm  # noqa: E402
from gpuguard.demo.stack.reference_collector import GpuguardCollector  # noqa: E402
from gpuguard.exporter.cgroup import ProcReader  # noqa: E402
from gpuguard.exporter.collector import TextRenderer  # noqa: E402
from gpuguard.exporter.events import EventLog  # noqa: E402
from gpuguard.exporter.model import (  # noqa: E402
    ContainerInfo,
    DeviceSample,
    GpuProcess,
    GpuSample,
    ProcessUtilization,
)
from gpuguard.exporter.poller import Poller  # noqa: E402
from gpuguard.exporter.tracker import Tracker  # noqa: E402

GIB = 2**30


class SyntheticBackend:
    """N processes on one device; SM samples for every other process, time advancing."""

    name = "synthetic"

    def __init__(self, n: int, first_pid: int) -> None:
        self.t = time.time()
        self.processes = tuple(GpuProcess(first_pid + i, GIB) for i in range(n))
        self.pids = [first_pid + i for i in range(0, n, 2)]

    def sample(self) -> GpuSample:
        self.t += 0.1
        ts = int(self.t * 1e6)
        samples = tuple(ProcessUtilization(pid, ts, 0.02, 0.0) for pid in self.pids)
        device = DeviceSample(
            0, "GPU-synthetic", "synthetic", 80 * GIB, len(self.processes) * GIB, 1.0,
            self.processes, samples,
        )  # fmt: skip
        return GpuSample(self.t, (device,))

    def close(self) -> None:
        pass


class StaticIndex:
    ENGINE = "docker"
    connected = True
    errors = 0
    resync_duration_s = 0.0

    def __init__(self, containers: Mapping[str, ContainerInfo]) -> None:
        self._map = MappingProxyType(dict(containers))

    def snapshot(self) -> Mapping[str, ContainerInfo]:
        return self._map


def synthetic_poller(n: int, root: Path) -> Poller:
    """A poller over n containers with one GPU process each, and its fake procfs."""
    first_pid = 100_000
    containers = {}
    for i in range(n):
        cid = f"{i:012x}" + "f" * 52
        pid = first_pid + i
        containers[cid] = ContainerInfo(
            id=cid, name=f"rt-{i}", image="bench", state="running", managed=True, deadline_s=9.0
        )
        d = root / str(pid)
        d.mkdir(parents=True)
        fields = "S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0"
        (d / "stat").write_text(f"{pid} (python3 -m gpusim.workload) {fields} {5000 + i} 0 0\n")
        (d / "cgroup").write_text(f"0::/system.slice/docker-{cid}.scope\n")
    events = EventLog(4096)
    return Poller(
        SyntheticBackend(n, first_pid), StaticIndex(containers), ProcReader(root),
        Tracker(events), events, "bench", 0.1,
    )  # fmt: skip


def measure_poll(n: int, polls: int, tmp: Path) -> float:
    """Median CPU ms of one poll cycle (thread CPU time, after warm-up)."""
    poller = synthetic_poller(n, tmp / f"proc-{n}")
    for _ in range(5):
        poller.poll_once()
    costs = []
    for _ in range(polls):
        started = time.thread_time()
        poller.poll_once()
        costs.append((time.thread_time() - started) * 1000)
    return statistics.median(costs)


def measure_render(n: int, renders: int, tmp: Path) -> tuple[float, float, float]:
    """(median, first) wall ms of building and rendering /metrics, one new poll each time,
    and the median of prometheus_client's generic renderer on the same snapshots."""
    poller = synthetic_poller(n, tmp / f"render-{n}")
    renderer = TextRenderer()
    registry = CollectorRegistry()
    registry.register(GpuguardCollector(lambda: poller.snapshot))
    costs, generic = [], []
    for _ in range(renders):
        snap = poller.poll_once()
        started = time.perf_counter()
        renderer.render_snapshot(snap)  # what /metrics does once per poll generation
        costs.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        generate_latest(registry)
        generic.append((time.perf_counter() - started) * 1000)
    return statistics.median(costs[1:]), costs[0], statistics.median(generic)


def algorithm1(client: object, gpu_pids: set[int]) -> list[tuple[str, int]]:
    """Paper B's Algorithm 1: every container's process list, matched against GPU PIDs."""
    found = []
    for container in client.containers.list():  # type: ignore[attr-defined]
        top = container.top(ps_args="-eo pid")
        for row in top.get("Processes") or []:
            if int(row[0]) in gpu_pids:
                found.append((container.id, int(row[0])))
    return found


def measure_algorithm1(engine_dir: Path, n_containers: int, rounds: int) -> dict[str, float]:
    from gpuguard.demo.stack.dockerd import PrivateDockerd
    from gpuguard.demo.stack.images import ensure_base_image

    engine = PrivateDockerd(engine_dir).start()
    try:
        client = engine.client()
        image = ensure_base_image(client)
        for i in range(n_containers):
            client.containers.run(
                image, ["sleep", "600"], detach=True, network_mode="none", name=f"alg1-{i}"
            )
        gpu_pids = {c.attrs["State"]["Pid"] for c in client.containers.list()}
        algorithm1(client, gpu_pids)  # warm-up
        walls, cpus = [], []
        for _ in range(rounds):
            wall, cpu = time.perf_counter(), time.process_time()
            matched = algorithm1(client, gpu_pids)
            walls.append((time.perf_counter() - wall) * 1000)
            cpus.append((time.process_time() - cpu) * 1000)
        assert len(matched) == n_containers, matched
        wall_ms = statistics.median(walls)
        client.close()
        return {
            "containers": n_containers,
            "wall_ms": wall_ms,
            "caller_cpu_ms": statistics.median(cpus),
            "per_container_ms": wall_ms / n_containers,
            "engine": engine,  # type: ignore[dict-item]
        }
    except BaseException:
        engine.stop()
        raise


def measure_exporter_process(engine: object, tmp: Path, settle_s: float) -> dict[str, float]:
    """RSS and CPU share of a real exporter polling a gpusim daemon every 100 ms."""
    from gpuguard.demo.stack.gpusim import GpusimService
    from gpuguard.demo.stack.process import ManagedProcess, free_port

    sim = GpusimService(tmp / "sim").start()
    port = free_port()
    argv = [
        sys.executable, "-m", "gpuguard.cli", "exporter", "--gpu.backend=gpusim",
        f"--gpusim.socket={sim.socket}", f"--docker.host={engine.url}",  # type: ignore[attr-defined]
        f"--web.listen-address=127.0.0.1:{port}",
    ]  # fmt: skip
    proc = ManagedProcess("exporter", argv, tmp / "exporter.log").start()
    try:
        import requests

        proc.wait_ready(lambda: requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok)
        time.sleep(1.0)  # past start-up work (imports, first resync)
        ticks = os.sysconf("SC_CLK_TCK")
        cpu0, wall0 = _cpu_ticks(proc.pid), time.monotonic()
        time.sleep(settle_s)
        cpu1, wall1 = _cpu_ticks(proc.pid), time.monotonic()
        rss_kb = next(
            int(line.split()[1])
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
        return {
            "rss_mb": rss_kb / 1024,
            "idle_cpu_pct": 100 * (cpu1 - cpu0) / ticks / (wall1 - wall0),
        }
    finally:
        proc.stop()
        sim.stop()


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (CI)")
    args = parser.parse_args()
    polls = 50 if args.quick else 300
    tmp = Path(tempfile.mkdtemp(prefix="gg-cost-"))
    result: dict[str, object] = {}
    engine = None
    try:
        for n in (10, 100, 1000):
            ms = measure_poll(n, polls if n < 1000 else polls // 5, tmp)
            result[f"poll_ms_{n}"] = round(ms, 3)
            print(f"poll cycle, {n:>5} containers/GPU processes: {ms:7.3f} ms CPU")
        render_ms, first_ms, generic_ms = measure_render(1000, 6 if args.quick else 20, tmp)
        result["render_ms_1000"] = round(render_ms, 2)
        result["render_first_ms_1000"] = round(first_ms, 2)
        result["render_generic_ms_1000"] = round(generic_ms, 2)
        result["render_speedup_vs_generic"] = round(generic_ms / render_ms, 1)
        print(
            f"/metrics render, 1000 containers: {render_ms:.2f} ms (first {first_ms:.2f} ms); "
            f"prometheus_client's generate_latest, same snapshots: {generic_ms:.2f} ms "
            f"({generic_ms / render_ms:.1f}x)"
        )

        n_real = 5 if args.quick else 10
        alg = measure_algorithm1(tmp / "engine", n_real, 3 if args.quick else 10)
        engine = alg.pop("engine")
        per = float(alg["per_container_ms"])
        result["algorithm1_poll_ms_100"] = round(per * 100, 1)
        result["algorithm1_measured"] = {k: round(float(v), 3) for k, v in alg.items()}
        print(
            f"Algorithm 1 (docker top per container), {n_real} real containers: "
            f"{alg['wall_ms']:.1f} ms wall = {per:.2f} ms/container; "
            f"extrapolated linearly to 100 containers: {per * 100:.0f} ms"
        )
        proc = measure_exporter_process(engine, tmp, 2.0 if args.quick else 5.0)
        result["rss_mb"] = round(proc["rss_mb"], 1)
        result["idle_cpu_pct"] = round(proc["idle_cpu_pct"], 2)
        print(f"exporter process: RSS {proc['rss_mb']:.1f} MB, {proc['idle_cpu_pct']:.2f}% CPU")
    finally:
        if engine is not None:
            engine.stop()  # type: ignore[attr-defined]
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    exit_on_sigterm()  # a timeout or kill still stops the stack it started
    sys.exit(main())
