"""Freeze latency for a burst: ten GPU tasks appear in the same instant -> their containers frozen.

One unmanaged container holds the GPU with a kernel that never ends; each round, ten managed
containers create their GPU contexts at the same instant (gpusim, ``--start-at``) and start
their memory input, and the actuator's fast path freezes all ten while they wait. One sample
per container: the wall time of the exporter's first GPU sample that shows its task (the
``timestamp`` of the first ``/api/v1/state`` snapshot listing it, read every 10 ms) -> the
actuator's audit record of it frozen (``frozen``: the kernel confirmed the cgroup frozen; with
``--pause.method=docker``, when ``docker pause`` returned). Both methods run in the same
run on the same stack: ``cgroup`` (the default: freeze the cgroup, then hand the container to
``docker pause`` in the background) and ``docker`` (``docker pause`` alone, the baseline). For
the cgroup method it also reports when Docker shows the container paused (the audit's
``runtime_pause`` record).

``measure_burst(node, rounds)`` runs it on a started ``NodeStack`` and returns the figures
(``freeze_p95_ms_burst10`` and its baseline); ``bench/realtime.py`` calls it. The exporter
polls every 20 ms here. ``--quick``: 2 rounds per method (20 freezes each), ``--smoke`` (CI)
1, else 5. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchargs import BenchParser, positive_int

from gpuguard.actuator.audit import read_audit
from gpuguard.demo.stack.images import python_container_kwargs
from gpuguard.demo.stack.localstack import NodeStack
from gpuguard.demo.stack.process import exit_on_sigterm
from gpuguard.labels import parse_duration

BURST = 10
METHODS = ("cgroup", "docker")
POLL = "20ms"
#: newcomers are released this long after they are started (python starts, the actuator
#: vets each managed container when the exporter reports it)
LEAD_S = 2.0 + 0.25 * BURST


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def workload(node: NodeStack, client: Any, name: str, managed: bool, *args: str) -> Any:
    assert node.gpusim is not None
    kwargs = python_container_kwargs(
        ["gpuguard.gpusim.workload", "--socket", str(node.gpusim.socket), *args],
        labels={"gpuguard.managed": "true" if managed else "false", "gpuguard.bench": "freeze"},
        extra_mounts={str(node.gpusim.dir): {"bind": str(node.gpusim.dir), "mode": "rw"}},
        name=name,
    )
    return client.containers.run(**kwargs)


class FirstSamples:
    """Follows the exporter's state: when each container's task first showed in a sample.

    That sample's time comes from the exporter's own numbers, so a read that comes late (a
    busy machine) changes nothing: a task's ``started_at`` is the midpoint of the sample
    before it and the first sample that saw it, and both are snapshot ``timestamp``s. Where
    a snapshot was missed, the first sample is taken as ``started_at`` + half the poll
    interval (counted in ``estimated``).
    """

    def __init__(self, exporter_url: str, poll_s: float, period_s: float = 0.01) -> None:
        self.url = exporter_url + "/api/v1/state"
        self.poll_s = poll_s
        self.period_s = period_s
        self.polls: set[float] = set()
        self.started: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> FirstSamples:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _follow(self) -> None:
        session = requests.Session()
        while not self._stop.wait(self.period_s):
            try:
                doc = session.get(self.url, timeout=2).json()
            except (requests.RequestException, ValueError):
                continue
            self.polls.add(float(doc["timestamp"]))
            for task in doc.get("tasks", []):
                cid = task.get("container_id")
                if cid and cid not in self.started:
                    self.started[cid] = float(task["started_at"])
        session.close()

    def first_sample(self, cid: str) -> tuple[float, bool]:
        """(time of the first sample that showed the container's task, exact?)."""
        started = self.started[cid]
        for now in sorted(t for t in self.polls if t > started):
            if any(abs((prev + now) / 2 - started) < 1e-6 for prev in self.polls if prev < now):
                return now, True
        return started + self.poll_s / 2, False


def pause_records(node: NodeStack, since: float) -> dict[str, dict[str, Any]]:
    """The first successful pause of each container since ``since``, by container id, with
    ``docker_paused``: when Docker showed it paused (the cgroup method tells Docker after)."""
    out: dict[str, dict[str, Any]] = {}
    told: dict[str, float] = {}
    for record in read_audit(node.state_dir / "audit.jsonl"):
        if record.get("ts", 0) < since:
            continue
        if record.get("event") == "runtime_pause" and record.get("result") == "ok":
            told.setdefault(record["container_id"], float(record["finished"]))
        if record.get("event") != "action":
            continue
        if record.get("action") == "pause" and record.get("result") == "ok":
            out.setdefault(record["container_id"], dict(record))
    for cid, record in out.items():
        if record.get("method") == "cgroup":
            record["docker_paused"] = told.get(cid)
        else:
            record["docker_paused"] = record["finished"]
    return {cid: r for cid, r in out.items() if r["docker_paused"] is not None}


def one_burst(
    node: NodeStack, client: Any, tag: str, n: int, poll_s: float
) -> list[dict[str, float]]:
    """Release ``n`` managed tasks together; per container: first sample, frozen, in line."""
    since = time.time()
    release = since + LEAD_S
    # 1.5 GiB each (1 GiB of input: ~0.15 s to copy in, the phase to freeze them in), so
    # ten fit on gpusim's 24 GiB beside the holder
    args = ["--memory-bytes", "1536MiB", "--work-seconds", "1", "--start-at", f"{release:.6f}"]
    burst = [workload(node, client, f"{tag}-{i}", True, *args) for i in range(n)]
    ids = {c.id for c in burst}
    try:
        with FirstSamples(node.exporter_url, poll_s) as seen:
            deadline = release + 15
            while time.time() < deadline:
                paused = pause_records(node, since)
                if ids <= set(paused) and ids <= set(seen.started):
                    break
                time.sleep(0.1)
    finally:
        for container in burst:
            container.remove(force=True)
    done = ids & set(paused) & set(seen.started)
    if len(done) < n:
        print(f"  {tag}: only {len(done)} of {n} seen and frozen within 15 s", flush=True)
    firsts = {cid: seen.first_sample(cid) for cid in done}
    return [
        {
            "first_sample": firsts[cid][0],
            "exact": float(firsts[cid][1]),
            "frozen": float(paused[cid].get("frozen") or paused[cid]["finished"]),
            "docker_paused": float(paused[cid]["docker_paused"]),
            "freeze_ms": float(paused[cid].get("freeze_ms") or "nan"),
            "method": paused[cid].get("method") or "runtime_pause",
        }
        for cid in done
    ]


def restart_actuator(node: NodeStack, flags: list[str], mode: str) -> None:
    node.stop_actuator()
    node.extra_actuator_flags, node.actuator_mode = flags, mode
    node.start_actuator()


def measure_burst(
    node: NodeStack, rounds: int, n: int = BURST, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """Both pause methods on a started node (its actuator is restarted for each, and once
    more with its own flags at the end); the figures of ``n`` tasks appearing together."""
    saved_flags, saved_mode = list(node.extra_actuator_flags), node.actuator_mode
    poll_s = parse_duration(node.poll_interval)
    fast_mode = saved_mode if saved_mode in ("fast", "both") else "fast"
    client = node.client()
    holder = workload(
        node, client, "freeze-holder", False, "--work-seconds", "100000", "--memory-bytes", "256MiB"
    )
    samples: dict[str, list[dict[str, float]]] = {}
    try:
        time.sleep(2.0)  # the holder computes: every newcomer waits
        for method in METHODS:
            flags = [f for f in saved_flags if not f.startswith("--pause.method")]
            restart_actuator(node, [*flags, f"--pause.method={method}"], fast_mode)
            samples[method] = []
            for index in range(rounds):
                got = one_burst(node, client, f"burst-{method}-{index}", n, poll_s)
                samples[method] += got
                lat = [1000 * (s["frozen"] - s["first_sample"]) for s in got]
                progress(
                    f"{method:>6} round {index}: first sample -> frozen p50 "
                    f"{percentile(lat, 0.5):6.1f} ms, max {max(lat):6.1f} ms"
                )
    finally:
        holder.remove(force=True)
        client.close()
        restart_actuator(node, saved_flags, saved_mode)
    return figures(samples, n)


def figures(samples: dict[str, list[dict[str, float]]], n: int) -> dict[str, Any]:
    def ms(method: str, key: str) -> list[float]:
        return [1000 * (s[key] - s["first_sample"]) for s in samples[method]]

    cgroup, docker = ms("cgroup", "frozen"), ms("docker", "frozen")
    in_line = ms("cgroup", "docker_paused")
    kernel = [s["freeze_ms"] for s in samples["cgroup"] if s["freeze_ms"] == s["freeze_ms"]]
    methods = sorted({str(s["method"]) for s in samples["cgroup"]})
    return {
        f"freeze_p95_ms_burst{n}": round(percentile(cgroup, 0.95), 1),
        f"freeze_p50_ms_burst{n}": round(percentile(cgroup, 0.5), 1),
        f"freeze_max_ms_burst{n}": round(max(cgroup), 1),
        f"docker_pause_p95_ms_burst{n}": round(percentile(docker, 0.95), 1),
        f"docker_pause_p50_ms_burst{n}": round(percentile(docker, 0.5), 1),
        f"docker_pause_max_ms_burst{n}": round(max(docker), 1),
        f"freeze_docker_in_line_p95_ms_burst{n}": round(percentile(in_line, 0.95), 1),
        "freeze_kernel_p95_ms": round(percentile(kernel, 0.95), 2),
        "freeze_samples": len(cgroup),
        "first_sample_estimated": sum(
            not s["exact"] for method in METHODS for s in samples[method]
        ),
        "docker_pause_samples": len(docker),
        "freeze_methods_seen": methods,  # ["cgroup"] unless it fell back to "runtime_pause"
    }


#: bursts per method in each mode (``bench/realtime.py`` runs its own modes' counts too)
ROUNDS = {"smoke": 1, "quick": 2, "full": 5}


def measure(bench: Any) -> dict[str, Any]:
    """``bench/realtime.py``'s scenario (e), on the bench's node: ten tasks at once."""
    rounds = ROUNDS.get(bench.mode, ROUNDS["full"])
    return measure_burst(bench.node, rounds, progress=bench.progress)


def main() -> int:
    parser = BenchParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds per method (< 2 minutes)")
    parser.add_argument("--smoke", action="store_true", help="1 round per method, for CI")
    parser.add_argument("--rounds", type=positive_int, default=None, help="bursts per method")
    args = parser.parse_args()
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    rounds = args.rounds or ROUNDS[mode]
    base = Path(tempfile.mkdtemp(prefix="ggf-"))
    node = NodeStack(base, "bench", time_scale=1.0, poll_interval=POLL)
    node.actuator_mode = "fast"
    print(
        f"{BURST} managed tasks appear together behind an unmanaged holder, {rounds} rounds "
        f"per method; exporter poll {POLL}; actuator fast path",
        flush=True,
    )
    try:
        node.start(progress=lambda line: print("  " + line, flush=True))
        line = measure_burst(node, rounds, progress=lambda s: print(s, flush=True))
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"first sample -> frozen, {BURST} at once ({line['freeze_samples']} freezes per "
        f"method): cgroup p50 {line[f'freeze_p50_ms_burst{BURST}']} / p95 "
        f"{line[f'freeze_p95_ms_burst{BURST}']} ms (docker shows it paused at p95 "
        f"{line[f'freeze_docker_in_line_p95_ms_burst{BURST}']} ms); docker pause (baseline) "
        f"p50 {line[f'docker_pause_p50_ms_burst{BURST}']} / p95 "
        f"{line[f'docker_pause_p95_ms_burst{BURST}']} ms; target <= 20 ms p95"
    )
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    exit_on_sigterm()  # a timeout or kill still stops the stack it started
    sys.exit(main())
