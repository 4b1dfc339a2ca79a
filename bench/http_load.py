"""The exporter's and the actuator's HTTP servers under load and attack.

Real processes on 127.0.0.1: a private dockerd, gpusim, the exporter and the actuator
(``NodeStack``); the clients are raw asyncio connections in this process
(``gpuguard/demo/stack/httpload.py``), with this process's file limit raised to hold them all.

1. burst: 300 clients connect at the same moment and GET /metrics, from the exporter and
   then the actuator; each latency runs from connect to the last byte of the reply.
   ``burst300_p99_s`` (exporter; target <= 1 s), ``burst300_failed`` (both; target 0).
2. siege: 1,000 idle and 100 slow-loris connections held on the actuator while valid
   webhooks (an admission alert for this node: a state read and a decision) are posted, 5
   per round, each on a fresh connection. ``webhook_under_siege_ms`` (the slowest; target
   <= 100 ms) and its median, next to the slowest of 5 without a siege.
3. followers: 1,000 long polls on the exporter's /api/v1/events, then a container starts;
   from the event's timestamp to each follower's reply (parsed here, so this client's own
   time is included). ``followers1000_event_p99_s`` (target <= 0.5 s), the exporter's
   thread count and RSS growth while they wait.
4. unauthenticated bodies: 100 senders of 4 MiB without a token to the webhook.
   ``unauth_4mib_rss_growth_mb`` (the actuator's peak RSS growth; target <= 20 MB).

``--quick`` does one round of each (about half a minute); the full run repeats the burst and
the siege three times. The last line is one JSON object; each figure is also printed as a
ratio to its target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuguard.demo.stack import httpload
from gpuguard.demo.stack.images import python_container_kwargs
from gpuguard.demo.stack.localstack import NodeStack
from gpuguard.demo.stack.process import exit_on_sigterm

NODE = "bench"
MIB = 1024 * 1024
TARGETS = {
    "burst300_p99_s": 1.0,
    "webhook_under_siege_ms": 100.0,
    "followers1000_event_p99_s": 0.5,
    "unauth_4mib_rss_growth_mb": 20.0,
}


def webhook_body() -> bytes:
    alert = {
        "status": "firing",
        "labels": {"alertname": "GpuguardGpuSaturatedContention", "node": NODE, "gpu": "0"},
        "annotations": {},
        "startsAt": "2025-11-22T01:02:03Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": "4a5b6c7d8e9f0a1b",
    }
    doc = {
        "version": "4",
        "groupKey": f'{{}}:{{node="{NODE}"}}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "gpuguard-actuator",
        "groupLabels": {"node": NODE},
        "commonLabels": {"node": NODE},
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9093",
        "alerts": [alert],
    }
    return json.dumps(doc).encode()


async def post_webhook(node: NodeStack) -> httpload.Reply:
    assert node.token_file is not None
    headers = [
        ("Authorization", f"Bearer {node.token_file.read_text().strip()}"),
        ("Content-Type", "application/json"),
    ]
    return await httpload.request(
        node.actuator_port, "POST", "/api/v1/alerts", headers, webhook_body()
    )


async def burst(port: int) -> tuple[float, int]:
    results = await httpload.burst(port, "/metrics", 300, timeout=30)
    seconds = [r.seconds for r in results if isinstance(r, httpload.Reply) and r.status == 200]
    return httpload.percentile(seconds, 0.99), len(results) - len(seconds)


async def webhooks(node: NodeStack, count: int) -> list[float]:
    """Milliseconds of ``count`` webhooks, one after another, each on a fresh connection."""
    out = []
    for _ in range(count):
        reply = await post_webhook(node)
        assert reply.status == 200, reply.body
        out.append(reply.seconds * 1000)
        await asyncio.sleep(0.1)
    return out


async def siege(node: NodeStack) -> tuple[list[float], list[float], int]:
    """Webhook ms without and with a siege; siege connections the server still held."""
    calm = await webhooks(node, 5)
    attack = httpload.Siege(node.actuator_port)
    await attack.open_idle(1000)
    await attack.open_slow_loris(100, interval=0.5)
    await asyncio.sleep(1.0)
    under = await webhooks(node, 5)
    held = attack.still_open
    await attack.close()
    await asyncio.sleep(1.0)  # the server tears 1,100 connections down (~50 ms of its loop)
    return calm, under, held


async def followers(node: NodeStack, client: Any) -> dict[str, float]:
    assert node.exporter is not None
    pid = node.exporter.pid
    state = await httpload.request(node.exporter_port, "GET", "/api/v1/state")
    since = json.loads(state.body)["seq"]
    before = httpload.proc_status(pid)
    polls = [
        asyncio.create_task(httpload.follow(node.exporter_port, since, timeout=30))
        for _ in range(1000)
    ]
    await asyncio.sleep(3.0)  # all waiting
    waiting = httpload.proc_status(pid)
    kwargs = python_container_kwargs(["this"], name=f"follow-{time.time_ns()}")
    container = await asyncio.to_thread(client.containers.run, **kwargs)
    try:
        results = await asyncio.gather(*polls, return_exceptions=True)
    finally:
        await asyncio.to_thread(container.remove, force=True)
    latencies = []
    for result in results:
        if isinstance(result, tuple):
            events = json.loads(result[1])["events"]
            if events:
                latencies.append(result[0] - min(e["ts"] for e in events))
    return {
        "followers1000_event_p99_s": round(httpload.percentile(latencies, 0.99), 3),
        "followers1000_event_p50_s": round(statistics.median(latencies), 3),
        "followers1000_answered": len(latencies),
        "followers1000_threads_before": before["Threads"],
        "followers1000_threads_waiting": waiting["Threads"],
        "followers1000_rss_growth_mb": round((waiting["VmRSS"] - before["VmRSS"]) / 1024, 1),
    }


async def unauthenticated(node: NodeStack) -> dict[str, float]:
    assert node.actuator is not None
    senders = httpload.unauthenticated_senders(node.actuator_port, "/api/v1/alerts", 100, 4 * MIB)
    statuses, grown_kb = await httpload.rss_growth(node.actuator.pid, senders)
    return {
        "unauth_4mib_rss_growth_mb": round(grown_kb / 1024, 1),
        "unauth_4mib_401": sum(1 for s in statuses if s == 401),
    }


async def measure(node: NodeStack, client: Any, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    bursts = [await burst(node.exporter_port) for _ in range(rounds)]
    actuator_bursts = [await burst(node.actuator_port) for _ in range(rounds)]
    out["burst300_p99_s"] = round(max(p for p, _ in bursts), 3)
    out["burst300_actuator_p99_s"] = round(max(p for p, _ in actuator_bursts), 3)
    out["burst300_failed"] = sum(f for _, f in bursts + actuator_bursts)
    print(
        f"burst of 300: p99 exporter {out['burst300_p99_s']} s, actuator "
        f"{out['burst300_actuator_p99_s']} s, failed {out['burst300_failed']}",
        flush=True,
    )
    sieges = [await siege(node) for _ in range(rounds)]
    calm = [ms for c, _, _ in sieges for ms in c]
    under = [ms for _, u, _ in sieges for ms in u]
    out["webhook_calm_ms"] = round(max(calm), 1)
    out["webhook_under_siege_ms"] = round(max(under), 1)
    out["webhook_under_siege_p50_ms"] = round(statistics.median(under), 1)
    out["siege_connections_held"] = min(held for _, _, held in sieges)
    print(
        f"webhook: {out['webhook_calm_ms']} ms calm, {out['webhook_under_siege_ms']} ms "
        f"under 1,000 idle + 100 slow-loris connections",
        flush=True,
    )
    out.update(await followers(node, client))
    print(
        f"1,000 followers: event p50 {out['followers1000_event_p50_s']} s, p99 "
        f"{out['followers1000_event_p99_s']} s; exporter threads "
        f"{out['followers1000_threads_before']} -> {out['followers1000_threads_waiting']}, "
        f"RSS +{out['followers1000_rss_growth_mb']} MB",
        flush=True,
    )
    out.update(await unauthenticated(node))
    print(
        f"100 unauthenticated 4 MiB senders: {out['unauth_4mib_401']} got 401, actuator "
        f"RSS +{out['unauth_4mib_rss_growth_mb']} MB",
        flush=True,
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of each (under a minute)")
    args = parser.parse_args()
    rounds = 1 if args.quick else 3
    httpload.raise_fd_limit(8192)
    node = NodeStack(Path(tempfile.mkdtemp(prefix="gg-http-")), NODE)
    try:
        node.start(progress=lambda line: print("  " + line, flush=True))
        client = node.client()
        try:
            out = asyncio.run(measure(node, client, rounds))
        finally:
            client.close()
    finally:
        node.stop()
    for key, target in TARGETS.items():
        print(f"{key}: {out[key]} (target <= {target:g}; {out[key] / target:.2f} of it)")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    exit_on_sigterm()  # a timeout or kill still stops the stack it started
    sys.exit(main())
