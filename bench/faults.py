"""Faults across restarts: what a restarted actuator does, and how soon it listens.

Real processes on 127.0.0.1: a private dockerd with busybox tenants, the actuator (and in
case 2 its guard) as ``gpuguard`` processes, and a stub exporter in this process that
reports a waiting GPU task for each tenant, so a paused tenant has a reason to stay paused.

1. late duplicate: ``GpuguardExporterDown`` fires and resolves at actuator A (admission
   steps aside, then resumes); A crashes (``kill -9``) holding 2 tenants paused; actuator B
   starts on the same state directory; the second Alertmanager's late ``firing`` reaches
   B. Figures: ``late_duplicate_listen_s`` (B's start to its /healthz answering),
   ``late_duplicate_resumed`` (tenants B resumed on the stale delivery: 0 is right; the
   fault resumed both and switched admission off), ``late_duplicate_failing_open`` and the
   webhook's answer.
2. hung dockerd: a Unix socket that accepts and never answers stands in for the engine; the
   journal names 3 paused tenants of a dead actuator; its guard is already at work when a
   new actuator starts. ``hung_dockerd_listen_s`` (the fault: 66 s), the guard's and the
   actuator's calls to the engine, and whether both are still alive.
3. history: the journal names 1,000 (``--quick``) or 1,000 and 3,000 containers that no
   longer exist. ``gone<N>_listen_s`` (the fault: 5.4 s and over 12 s) and
   ``gone<N>_settled_s`` (until the journal on disk is empty: one write now, one per
   container before).

``--quick`` runs each case once (under a minute). The last line is one JSON object.
Measured on this project's 2-core machine; compare runs on the same machine only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.hung_engine import HungEngine
from gpuguard.demo.stack.images import ensure_base_image
from gpuguard.demo.stack.process import ManagedProcess, exit_on_sigterm, free_port

REPO = Path(__file__).resolve().parents[1]
NODE = "bench"
TOKEN = "bench-token"
LISTEN_LIMIT_S = 120.0


# --- the stub exporter -------------------------------------------------------------------


def state_doc(tenants: list[tuple[str, str]]) -> dict[str, Any]:
    """One GPU held by an unmanaged task; each tenant's task waits, paused, behind it."""
    now = time.time()

    def task(i: int, cid: str | None, name: str | None, phase: str) -> dict[str, Any]:
        return {
            "task_id": f"t{i}", "container_id": cid, "container": name, "pid": 1000 + i,
            "gpu": 0, "phase": phase, "started_at": now - 5 + i, "elapsed_s": 5.0 - i,
            "memory_bytes": 2**30, "sm_ratio": None, "deadline_s": 60.0,
            "absolute_deadline": now + 55, "paused": cid is not None, "mode": "process",
            "proc_start_ticks": 1,
        }  # fmt: skip

    containers = [
        {
            "id": cid,
            "name": name,
            "paused": True,
            "managed": True,
            "role": None,
            "deadline_s": 60.0,
            "task_mode": "process",
            "class": "real-time",
            "gpus": ["0"],
        }
        for cid, name in tenants
    ]
    tasks = [task(0, None, None, "computing")]
    tasks += [task(i + 1, cid, name, "input") for i, (cid, name) in enumerate(tenants)]
    return {
        "node": NODE, "seq": 1, "timestamp": now, "sources": {"docker": True, "gpu": True},
        "gpus": [{"index": 0, "uuid": "GPU-bench", "memory_total_bytes": 24 * 2**30,
                  "memory_used_bytes": 8 * 2**30, "utilization_ratio": 1.0}],
        "containers": containers, "tasks": tasks,
    }  # fmt: skip


@contextmanager
def stub_exporter(tenants: list[tuple[str, str]]) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(state_doc(tenants)).encode()
            self.send_response(200 if self.path.startswith("/api/v1/state") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# --- gpuguard processes ------------------------------------------------------------------


def gpuguard(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuguard.cli", *args]


class Actuator:
    """An actuator process; ``listen_s``: from its start to /healthz answering."""

    def __init__(self, work: Path, name: str, docker_url: str, exporter_url: str) -> None:
        work.mkdir(parents=True, exist_ok=True)
        token = work / "token"
        if not token.exists():
            token.write_text(TOKEN)
            token.chmod(0o600)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state_dir = work / "state"
        argv = gpuguard(
            "actuator", f"--web.listen-address=127.0.0.1:{self.port}",
            f"--web.token-file={token}", f"--exporter.url={exporter_url}",
            f"--docker.host={docker_url}", f"--state.dir={self.state_dir}",
            f"--node.name={NODE}", "--mode=webhook", "--node.mark-ttl=5m",
            f"--rules.actions={REPO / 'rules' / 'actions.yml'}",
            f"--rules.files={REPO / 'rules' / '*.rules.yml'}",
        )  # fmt: skip
        started = time.monotonic()
        self.process = ManagedProcess(name, argv, work / f"{name}.log").start()
        self.process.wait_ready(self.answers, LISTEN_LIMIT_S)
        self.listen_s = time.monotonic() - started

    def answers(self) -> bool:
        return requests.get(self.url + "/healthz", timeout=1).ok

    def health(self) -> str:
        return requests.get(self.url + "/healthz", timeout=10).text.strip()

    def post(self, status: str, ends: str = "0001-01-01T00:00:00Z") -> requests.Response:
        alert = {
            "status": status, "labels": {"alertname": "GpuguardExporterDown", "node": NODE},
            "annotations": {}, "startsAt": "2025-11-22T01:00:00Z", "endsAt": ends,
            "generatorURL": "", "fingerprint": "b0b0b0b0b0b0b0b0",
        }  # fmt: skip
        doc = {
            "version": "4", "groupKey": '{}:{alertname="GpuguardExporterDown"}',
            "truncatedAlerts": 0, "status": status, "receiver": "gpuguard-actuator",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://127.0.0.1:9093", "alerts": [alert],
        }  # fmt: skip
        headers = {"Authorization": f"Bearer {TOKEN}"}
        return requests.post(self.url + "/api/v1/alerts", json=doc, headers=headers, timeout=60)

    def audit(self) -> list[dict[str, Any]]:
        path = self.state_dir / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def kill(self) -> None:
        assert self.process.proc is not None
        os.kill(self.process.proc.pid, signal.SIGKILL)
        self.process.proc.wait(10)

    def stop(self) -> None:
        self.process.stop()


def paused_entry(cid: str, name: str, at: float) -> dict[str, Any]:
    return {"container_id": cid, "name": name, "task_id": None, "gpu": 0, "paused_at": at,
            "reason": "newcomer"}  # fmt: skip


def journal_with(state_dir: Path, entries: dict[str, dict[str, Any]]) -> None:
    """Add paused entries to the journal (as a crashed actuator left it), or write one."""
    path = state_dir / "journal.json"
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    doc = json.loads(path.read_text()) if path.exists() else {"version": 1, "pid": 1}
    doc.setdefault("paused", {}).update(entries)
    path.write_text(json.dumps(doc))


# --- the cases ---------------------------------------------------------------------------


def late_duplicate(engine: PrivateDockerd, work: Path) -> dict[str, Any]:
    client = engine.client()
    image = ensure_base_image(client)
    made = [
        client.containers.run(
            image,
            ["sleep", "300"],
            labels={"gpuguard.managed": "true"},
            detach=True,
            network_mode="none",
            name=f"faults-rt-{i}-{os.getpid()}",
        )
        for i in range(2)
    ]
    try:
        tenants = [(c.id, c.name) for c in made]
        with stub_exporter(tenants) as exporter_url:
            first = Actuator(work, "actuator-a", engine.url, exporter_url)
            first.post("firing")
            first.post("resolved", ends="2025-11-22T01:05:00Z")
            first.kill()  # a crash, holding two tenants paused (as admission would have)
            for container in made:
                container.pause()
            journal_with(first.state_dir, {c.id: paused_entry(c.id, c.name, time.time())
                                           for c in made})  # fmt: skip
            second = Actuator(work, "actuator-b", engine.url, exporter_url)
            try:
                before = {r["container_id"] for r in second.audit() if _unpause(r)}
                reply = second.post("firing")  # the second Alertmanager's late duplicate
                resumed = {r["container_id"] for r in second.audit() if _unpause(r)} - before
                still_paused = sum(
                    client.api.inspect_container(c.id)["State"]["Paused"] for c in made
                )
                return {
                    "late_duplicate_listen_s": round(second.listen_s, 2),
                    "late_duplicate_webhook_code": reply.status_code,
                    "late_duplicate_stale_skips": sum(
                        s.get("reason") == "stale_alert" for s in reply.json().get("skips", [])
                    ),
                    "late_duplicate_resumed": len(resumed),
                    "late_duplicate_still_paused": still_paused,
                    "late_duplicate_failing_open": "failing open" in second.health(),
                }
            finally:
                second.stop()
    finally:
        for container in made:
            container.remove(force=True)
        client.close()


def _unpause(record: dict[str, Any]) -> bool:
    return (
        record.get("event") == "action"
        and record.get("action") == "unpause"
        and record.get("result") == "ok"
    )


def hung_dockerd(work: Path) -> dict[str, Any]:
    state_dir = work / "state"
    at = time.time()
    journal_with(state_dir, {f"{i:064x}": paused_entry(f"{i:064x}", f"rt-{i}", at)
                             for i in range(3)})  # fmt: skip
    with HungEngine(work / "hung.sock") as hung, stub_exporter([]) as exporter_url:
        guard = ManagedProcess(
            "guard",
            gpuguard("guard", f"--state.dir={state_dir}", f"--docker.host={hung.url}",
                     f"--web.listen-address=127.0.0.1:{free_port()}"),
            work / "guard.log",
        ).start()  # fmt: skip
        actuator = None
        try:
            deadline = time.monotonic() + 60
            while hung.accepted < 1 and time.monotonic() < deadline:
                time.sleep(0.05)  # the guard is inside its first call to the engine
            actuator = Actuator(work, "actuator", hung.url, exporter_url)
            time.sleep(6.0)  # past one engine timeout: /healthz says why
            return {
                "hung_dockerd_listen_s": round(actuator.listen_s, 2),
                "hung_dockerd_engine_calls": hung.accepted,
                "hung_dockerd_health": actuator.health()[:60],
                "hung_dockerd_both_alive": guard.alive() and actuator.process.alive(),
            }
        finally:
            if actuator is not None:
                actuator.stop()
            guard.stop()


def gone_containers(engine: PrivateDockerd, work: Path, count: int) -> dict[str, Any]:
    state_dir = work / "state"
    at = time.time() - 1
    journal_with(state_dir, {f"{i:064x}": paused_entry(f"{i:064x}", f"gone-{i}", at)
                             for i in range(count)})  # fmt: skip
    with stub_exporter([]) as exporter_url:
        started = time.monotonic()
        actuator = Actuator(work, f"actuator-{count}", engine.url, exporter_url)
        try:
            deadline = time.monotonic() + LISTEN_LIMIT_S
            journal = state_dir / "journal.json"
            while time.monotonic() < deadline:
                try:
                    if not json.loads(journal.read_text()).get("paused"):
                        break
                except ValueError:
                    pass  # never half-written; read between two replaces
                time.sleep(0.02)
            settled = time.monotonic() - started
            return {
                f"gone{count}_listen_s": round(actuator.listen_s, 2),
                f"gone{count}_settled_s": round(settled, 2),
            }
        finally:
            actuator.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each case once, 1,000 gone")
    args = parser.parse_args()
    results: dict[str, Any] = {"bench": "faults", "quick": args.quick}
    with tempfile.TemporaryDirectory(prefix="gg-faults-", dir="/tmp") as tmp:
        root = Path(tmp)
        results.update(hung_dockerd(root / "hung"))
        print(json.dumps({k: v for k, v in results.items() if k.startswith("hung")}))
        engine = PrivateDockerd(root / "docker")
        engine.start()
        try:
            results.update(late_duplicate(engine, root / "late"))
            print(json.dumps({k: v for k, v in results.items() if k.startswith("late")}))
            for count in (1000,) if args.quick else (1000, 3000):
                results.update(gone_containers(engine, root / f"gone{count}", count))
                print(json.dumps({k: v for k, v in results.items() if k.startswith("gone")}))
        finally:
            engine.stop()
    print(json.dumps(results))


if __name__ == "__main__":
    exit_on_sigterm()  # a timeout or kill still stops the stack it started
    main()
