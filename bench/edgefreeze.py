"""Launch -> event -> frozen: a real-time request's first launch to best-effort containers frozen.

A real-time server (deadline 100ms, one request a second, one kernel each, no copies) shares
gpusim's GPU with 1, then 10, managed best-effort trainers that launch all the time. The
launch probe sees each request's first launch (``gpu_busy``); the actuator's fast path
freezes every trainer on that edge and thaws them once the server is idle long enough. Per
request and trainer, from the clocks of the parts themselves:

  launch     the server's own log: the request's start, just before its first launch
  edge       the ``gpu_busy`` event's ``ts``: the probe's time of that launch
  published  when this bench's own follower of ``/api/v1/events`` received the event (the
             exporter's probe read interval and publication; the actuator follows the same
             stream the same way)
  started    the actuator's audit record of the freeze: when its step began (its stream
             client and decision, on its last state read with the edge applied)
  frozen     the same record: when the kernel confirmed the cgroup frozen

``edge_freeze_p95_ms_1`` and ``edge_freeze_p95_ms_10``: launch -> frozen, p95 (targets 5 ms
and 15 ms); ``*_split_p50_ms``: the median of each part; ``edge_freeze_first_ms_*``: the
first request (the server's first work since its start-up) to its last trainer frozen (null
when its trainers were all frozen already). A trainer already frozen when a request starts
(its thaw still waiting out the gap) gives no sample; they are counted.
``--exporter-flag`` passes a flag to the exporter (``--probe.interval=1s``: a busy edge
does not wait for the probe's read). ``--quick``: 12 s per size, ``--smoke`` (CI) 6 s, else
40 s. The last line printed is one JSON object.
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchargs import BenchParser

from gpuguard.actuator.audit import read_audit
from gpuguard.contract import EventType
from gpuguard.demo.stack.images import python_container_kwargs
from gpuguard.demo.stack.localstack import NodeStack
from gpuguard.demo.stack.process import exit_on_sigterm

SIZES = (1, 10)
DURATION = {"smoke": 6.0, "quick": 12.0, "full": 40.0}
LEAD_S = 4.0  # trainers start and are seen by the probe before the first request
PARTS = ("launch_edge", "edge_published", "published_started", "started_frozen")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class EdgeFollower:
    """Follows ``/api/v1/events`` in a thread: each ``gpu_busy`` (container, ts, received)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.busy: list[tuple[str, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> EdgeFollower:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _follow(self) -> None:
        session = requests.Session()
        since = session.get(f"{self.url}/api/v1/events", params={"since": "0"}, timeout=5)
        cursor = int(since.json()["next"])
        while not self._stop.is_set():
            reply = session.get(
                f"{self.url}/api/v1/events", params={"since": str(cursor), "timeout": "1"},
                timeout=5,
            )  # fmt: skip
            got = time.time()
            batch = reply.json()
            cursor = int(batch["next"])
            for event in batch["events"]:
                if event["type"] == EventType.GPU_BUSY:
                    self.busy.append((event["container_id"], float(event["ts"]), got))


def container(node: NodeStack, client: Any, name: str, labels: dict[str, str], *args: str) -> Any:
    assert node.gpusim is not None
    kwargs = python_container_kwargs(
        ["gpuguard.gpusim.workload", *args, "--socket", str(node.gpusim.socket)],
        labels={"gpuguard.managed": "true", "gpuguard.bench": "edgefreeze", **labels},
        extra_mounts={str(node.gpusim.dir): {"bind": str(node.gpusim.dir), "mode": "rw"}},
        name=name,
    )
    return client.containers.run(**kwargs)


def one_size(node: NodeStack, n: int, duration: float) -> dict[str, Any]:
    """``n`` trainers beside the server for ``duration`` s: the samples and their parts."""
    client = node.client()
    since = time.time()
    start = since + LEAD_S
    train = ["train", "--step-work", "0.02", "--kernels", "2", "--sync-every", "1"]
    train += ["--memory-bytes", "512MiB", "--duration", f"{LEAD_S + duration + 2:.1f}"]
    trainers = [
        container(node, client, f"ef{n}-be-{i}", {"gpuguard.class": "best-effort"}, *train)
        for i in range(n)
    ]
    serve = ["server", "--rate", "1", "--arrivals", "fixed", "--request-work", "0.03"]
    serve += ["--kernels", "1", "--io-bytes", "0", "--memory-bytes", "256MiB"]
    serve += ["--duration", f"{duration:.1f}", "--start-at", f"{start:.6f}"]
    try:
        with EdgeFollower(node.exporter_url) as follower:
            server = container(node, client, f"ef{n}-rt", {"gpuguard.deadline": "100ms"}, *serve)
            server.wait(timeout=LEAD_S + duration + 30)
            logs = server.logs(stdout=True, stderr=False).decode()
            server_id = server.id
            server.remove(force=True)
    finally:
        for c in trainers:
            c.remove(force=True)
        client.close()
    starts = [
        float(r["start"])
        for r in (json.loads(line) for line in logs.splitlines() if line.startswith("{"))
        if r.get("event") == "request"
    ]
    edges = [(ts, got) for cid, ts, got in follower.busy if cid == server_id]
    ids = {c.id for c in trainers}
    pauses = [
        r
        for r in read_audit(node.state_dir / "audit.jsonl")
        if r.get("event") == "action" and r.get("action") == "pause" and r.get("result") == "ok"
        and r.get("container_id") in ids and float(r.get("started", 0)) >= since
    ]  # fmt: skip
    return samples_of(starts, edges, pauses, ids)


def samples_of(
    starts: list[float],
    edges: list[tuple[float, float]],
    pauses: list[dict[str, Any]],
    trainers: set[str],
) -> dict[str, Any]:
    """Join each request's start to its edge and to each trainer's first freeze after it."""
    samples: list[dict[str, float]] = []
    already = missed = 0
    for launch in starts:
        edge = next(((ts, got) for ts, got in sorted(edges) if ts >= launch - 0.005), None)
        if edge is None or edge[0] > launch + 0.5:
            missed += len(trainers)
            continue
        for cid in trainers:
            mine = sorted(
                (float(r["started"]), float(r.get("frozen") or r["finished"]))
                for r in pauses
                if r["container_id"] == cid and float(r["started"]) >= edge[0] - 0.002
            )
            if not mine or mine[0][1] > launch + 0.5:
                already += 1
                continue
            began, frozen = mine[0]
            samples.append(
                {"launch": launch, "edge": edge[0], "published": edge[1], "started": began,
                 "frozen": frozen}
            )  # fmt: skip
    first = min(starts, default=None)
    return {"samples": samples, "already_frozen": already, "no_edge": missed, "first": first}


def figures(n: int, got: dict[str, Any]) -> dict[str, Any]:
    samples = got["samples"]

    def ms(a: str, b: str) -> list[float]:
        return [1000 * (s[b] - s[a]) for s in samples]

    total = ms("launch", "frozen")
    first_ms = [1000 * (s["frozen"] - s["launch"]) for s in samples if s["launch"] == got["first"]]
    out: dict[str, Any] = {
        f"edge_freeze_p95_ms_{n}": _round(percentile(total, 0.95)),
        f"edge_freeze_p50_ms_{n}": _round(percentile(total, 0.5)),
        f"edge_freeze_samples_{n}": len(samples),
        f"edge_freeze_first_ms_{n}": _round(max(first_ms, default=None)),
        f"edge_freeze_already_frozen_{n}": got["already_frozen"],
        f"edge_freeze_no_edge_{n}": got["no_edge"],
    }
    steps = ("launch", "edge", "published", "started", "frozen")
    for part, (a, b) in zip(PARTS, itertools.pairwise(steps), strict=True):
        out[f"{part}_split_p50_ms_{n}"] = _round(percentile(ms(a, b), 0.5))
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def main() -> int:
    parser = BenchParser(description=__doc__.split("\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="12 s per size (about 1.5 minutes)")
    size.add_argument("--smoke", action="store_true", help="6 s per size, for CI")
    parser.add_argument(
        "--exporter-flag", action="append", default=[], metavar="FLAG",
        help="one more exporter flag (repeatable), e.g. --exporter-flag=--probe.interval=1s",
    )  # fmt: skip
    args = parser.parse_args()
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    base = Path(tempfile.mkdtemp(prefix="gge-"))
    node = NodeStack(base, "bench", time_scale=1.0, poll_interval="20ms")
    node.actuator_mode = "fast"
    node.extra_exporter_flags = list(args.exporter_flag)
    line: dict[str, Any] = {"mode": mode, "exporter_flags": args.exporter_flag}
    try:
        node.start(progress=lambda text: print("  " + text, flush=True))
        for n in SIZES:
            got = figures(n, one_size(node, n, DURATION[mode]))
            line.update(got)
            parts = ", ".join(f"{p} {got[f'{p}_split_p50_ms_{n}']}" for p in PARTS)
            print(
                f"{n:>2} best-effort: launch -> frozen p50 {got[f'edge_freeze_p50_ms_{n}']} / "
                f"p95 {got[f'edge_freeze_p95_ms_{n}']} ms over {got[f'edge_freeze_samples_{n}']} "
                f"freezes, first request {got[f'edge_freeze_first_ms_{n}']} ms "
                f"(medians, ms: {parts})",
                flush=True,
            )
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)
    line["probe_attached"] = bool(line.get("edge_freeze_samples_1"))
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    exit_on_sigterm()  # a timeout or kill still stops the stack it started
    sys.exit(main())
