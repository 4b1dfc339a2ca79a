"""The containerd container source: a metadata cache fed by containerd's event stream.

The same contract as the Docker source (``containers.ContainerIndex``): a background thread
subscribes to events (``ctr events``), lists every container and its task (a full resync
on every (re)connect, and one cheaper resync a moment later to close the gap before the
subscription took hold), then applies events as they come. When containerd goes away it
retries with backoff and never raises out of the thread; the poller only reads
``snapshot()``, so no containerd call happens inside a poll. Parsing is pure
(``parse_event_line``, ``parse_task_list``, ``containers_from_docs``). On a Kubernetes node
(namespace ``k8s.io``) a container has its Kubernetes name, its pod's identity and its
pod's ``gpuguard.*`` labels from the sandbox (``gpuguard/kube.py``; the actuator's
containerd engine reads them the same way, ``gpuguard/containerd.py``); sandboxes are not
listed. Why ``ctr``: docs/kubernetes.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import re
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any

from gpuguard.containerd import ContainerdContainer, read_containers
from gpuguard.contract import EventType
from gpuguard.ctr import Ctr, CtrError
from gpuguard.exporter import trust
from gpuguard.exporter.containers import EventFollower, describe_container, gpus_from_config
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.model import ContainerInfo
from gpuguard.exporter.trust import TRUST_ALL, TrustPolicy

log = logging.getLogger(__name__)

#: after connecting, list once more this much later: an event raised before ``ctr events``
#: had subscribed is then still seen
RECONCILE_AFTER_S = 1.0

# Go's time.Time.String(): "2026-11-25 10:34:38.246970616 +0000 UTC", then namespace,
# topic and the event as JSON.
_EVENT_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(\.\d+)? ([+-]\d{4}) \S+ (\S+) (/\S+) ?(.*)$"
)

# What a task event says about the container's state (Docker's words, as ContainerInfo keeps).
_TASK_TOPIC_STATE = {
    "/tasks/create": "created",
    "/tasks/start": "running",
    "/tasks/paused": "paused",
    "/tasks/resumed": "running",
    "/tasks/exit": "exited",
    "/tasks/delete": "exited",
}


@dataclass(frozen=True, slots=True)
class ContainerdEvent:
    """One line of ``ctr events`` that names a container."""

    ts: float | None
    namespace: str
    topic: str
    container_id: str
    process_id: str | None = None  # a task event's process: the container id for the init


def parse_event_line(line: str) -> ContainerdEvent | None:
    """A container or task event from one ``ctr events`` line, or None for anything else."""
    match = _EVENT_LINE.match(line.strip())
    if match is None:
        return None
    date, fraction, offset, namespace, topic, body_text = match.groups()
    if not topic.startswith(("/containers/", "/tasks/")):
        return None
    try:
        body = json.loads(body_text or "{}")
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    if topic.startswith("/tasks/"):
        container_id, process_id = body.get("container_id"), body.get("id")
    else:
        container_id, process_id = body.get("id"), None
    if not container_id:
        return None
    return ContainerdEvent(
        ts=_event_time(date, fraction, offset),
        namespace=namespace,
        topic=topic,
        container_id=str(container_id),
        process_id=str(process_id) if process_id else None,
    )


def _event_time(date: str, fraction: str | None, offset: str) -> float | None:
    try:
        when = datetime.strptime(date, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    sign = -1 if offset[0] == "-" else 1
    zone = timezone(sign * timedelta(hours=int(offset[1:3]), minutes=int(offset[3:5])))
    return when.replace(tzinfo=zone).timestamp() + float(fraction or 0)


def describe_containerd(
    container: ContainerdContainer, policy: TrustPolicy = TRUST_ALL
) -> ContainerInfo:
    """A ContainerInfo from a containerd container as the shared layer reads it (pure)."""
    info = describe_container(
        container_id=container.id,
        name=container.name,
        image=container.image,
        state=container.state,
        container_labels=container.labels,
        gpus=gpus_from_config({}, list(container.env)),
        command=" ".join(a for a in container.args if a),
    )
    pod = container.pod
    if pod is None:
        return trust.enforce(policy, info)
    info = dataclasses.replace(
        info, pod_namespace=pod.namespace, pod_name=pod.pod, pod_uid=pod.pod_uid
    )
    # The trust policy's namespace is the one the pod's sandbox records, never one a
    # container claims for itself.
    return trust.enforce(policy, info, container.sandbox_namespace)


def containers_from_docs(
    docs: Mapping[str, Mapping[str, Any]],
    states: Mapping[str, str],
    policy: TrustPolicy = TRUST_ALL,
) -> dict[str, ContainerInfo]:
    """Every non-sandbox container, with its pod's labels joined by pod uid (pure)."""
    return {
        cid: describe_containerd(container, policy)
        for cid, container in read_containers(docs, states).items()
    }


class ContainerdIndex(EventFollower):
    """Container metadata kept current from containerd's event stream (one namespace)."""

    ENGINE = "containerd"

    def __init__(
        self,
        ctr: Ctr,
        events: EventLog | None = None,
        backoff_s: tuple[float, float] = (0.2, 5.0),
        policy: TrustPolicy = TRUST_ALL,
    ) -> None:
        super().__init__(events, backoff_s)
        self._ctr = ctr
        self._policy = policy
        self._docs: dict[str, dict[str, Any]] = {}  # written by the thread only
        self._states: dict[str, str] = {}
        self._proc: subprocess.Popen[str] | None = None

    def _connect_and_follow(self) -> None:
        # Subscribe before listing, as the Docker source does; applying an event twice is
        # harmless (each one re-reads what it names).
        proc = self._proc = self._ctr.follow_events()
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(
            target=_pump, args=(proc, lines), name="containerd-events-reader", daemon=True
        ).start()
        self._resync(full=True)
        self.connected = True
        self.last_error = None
        reconcile_at: float | None = time.monotonic() + RECONCILE_AFTER_S
        while not self._stop.is_set():
            wait = 1.0 if reconcile_at is None else max(0.0, reconcile_at - time.monotonic())
            try:
                line = lines.get(timeout=wait)
            except queue.Empty:
                if reconcile_at is not None and time.monotonic() >= reconcile_at:
                    reconcile_at = None
                    self._resync(full=False)
                continue
            if line is None:
                if self._stop.is_set():
                    return
                proc.wait(timeout=5)
                why = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
                if proc.returncode:
                    raise CtrError(f"ctr events: {(why or ['exited'])[-1]}")
                return
            self._apply_line(line)

    def _fetch(self, container_id: str) -> dict[str, Any] | None:
        """A container's trimmed info, or None when it is gone."""
        try:
            doc = self._ctr.info(container_id)
        except CtrError:
            # ctr says "not found" only in words: decide by listing instead
            if container_id not in self._ctr.container_ids():
                return None
            raise
        return doc

    def _resync(self, full: bool) -> None:
        started = time.monotonic()
        ids = self._ctr.container_ids()
        states = self._ctr.task_states()
        docs = {} if full else {cid: d for cid, d in self._docs.items() if cid in ids}
        for cid in ids:
            if cid not in docs:
                doc = self._fetch(cid)
                if doc is not None:
                    docs[cid] = doc
        self._docs, self._states = docs, states
        self._publish(None, announce_new=self.resyncs > 0)
        self.resync_duration_s = time.monotonic() - started
        self.resyncs += 1

    def _apply_line(self, line: str) -> None:
        event = parse_event_line(line)
        if event is None or event.namespace != self._ctr.namespace:
            return
        cid, topic = event.container_id, event.topic
        if topic in ("/containers/create", "/containers/update"):
            doc = self._fetch(cid)
            if doc is None:
                self._forget(cid)
            else:
                self._docs[cid] = doc
        elif topic == "/containers/delete":
            self._forget(cid)
        elif topic in _TASK_TOPIC_STATE:
            if event.process_id not in (None, cid):
                return  # an exec'd process, not the container's own task
            self._states[cid] = _TASK_TOPIC_STATE[topic]
            if cid not in self._docs:
                doc = self._fetch(cid)
                if doc is None:
                    return
                self._docs[cid] = doc
        else:
            return
        self._publish(event.ts, announce_new=True)

    def _forget(self, container_id: str) -> None:
        self._docs.pop(container_id, None)
        self._states.pop(container_id, None)
        self._warned_labels.discard(container_id)

    def _publish(self, ts: float | None, announce_new: bool) -> None:
        fresh = containers_from_docs(self._docs, self._states, self._policy)
        self._warn_labels(fresh)
        with self._lock:
            old = self._containers
            self._containers = MappingProxyType(fresh)
        self._announce_diff(old, fresh, ts, announce_new)

    def _announce_diff(
        self,
        old: Mapping[str, ContainerInfo],
        new: Mapping[str, ContainerInfo],
        ts: float | None,
        announce_new: bool,
    ) -> None:
        for cid, info in old.items():
            if cid not in new:
                self._emit(EventType.CONTAINER_REMOVED, info, ts)
        for cid, info in new.items():
            before = old.get(cid)
            if info.state == "running" and (
                (before is None and announce_new)
                or (before is not None and before.state not in ("running", "paused"))
            ):
                self._emit(EventType.CONTAINER_STARTED, info, ts)
            elif before is not None and before.paused != info.paused:
                paused = EventType.CONTAINER_PAUSED
                self._emit(paused if info.paused else EventType.CONTAINER_RESUMED, info, ts)

    def _warn_labels(self, containers: Mapping[str, ContainerInfo]) -> None:
        """Log once per container a label it cannot use (its own or its pod's)."""
        for info in containers.values():
            if info.id in self._warned_labels:
                continue
            errors = [e for e in (info.deadline_error, info.task_mode_error, info.class_error) if e]
            errors += [error for _, error in info.slo_errors]
            if errors:
                self._warned_labels.add(info.id)  # never fatal
                log.warning("container %s: %s (label ignored)", info.name, "; ".join(errors))

    def _emit(self, type_: EventType, info: ContainerInfo, ts: float | None) -> None:
        if self._events is not None:
            self._events.append(type_, ts=ts, container_id=info.id, container=info.name)

    def _close_connection(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # our own child, by its PID
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=2)


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    """Hand ``ctr events``' lines to the follower; None marks the end of the stream."""
    try:
        if proc.stdout is not None:
            for line in proc.stdout:
                lines.put(line)
    except (OSError, ValueError):  # the pipe closed under us at stop
        pass
    finally:
        lines.put(None)
