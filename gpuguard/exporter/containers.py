"""The container source: a metadata cache fed by the Docker events stream.

A background thread subscribes to container events, then lists and inspects every
container (a full resync, on every (re)connect), then applies events as they come. When
dockerd goes away it retries with backoff; it never raises out of the thread. The poller
only reads ``snapshot()``: no Docker call ever happens inside a poll.

``container_info`` (inspect document -> ContainerInfo) is pure; ``describe_container``, which
reads the labels, is shared with the containerd source.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Self, TypeVar

from gpuguard import inflight, labels, slo
from gpuguard.contract import EventType
from gpuguard.exporter import trust
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.model import ContainerInfo
from gpuguard.exporter.trust import TRUST_ALL, TrustPolicy

log = logging.getLogger(__name__)

T = TypeVar("T")

WATCHED_ACTIONS = ("create", "start", "pause", "unpause", "die", "destroy", "rename")
_ACTION_EVENT = {
    "start": EventType.CONTAINER_STARTED,
    "pause": EventType.CONTAINER_PAUSED,
    "unpause": EventType.CONTAINER_RESUMED,
}


def gpus_from_config(host_config: Mapping[str, Any], env: list[str]) -> tuple[str, ...]:
    """GPUs a container may use: DeviceRequests (``--gpus``) first, else NVIDIA_VISIBLE_DEVICES.

    ``("all",)`` stands for every GPU (``Count: -1`` or ``all``).
    """
    for request in host_config.get("DeviceRequests") or ():
        capabilities = [c for group in request.get("Capabilities") or () for c in group]
        if request.get("Driver") != "nvidia" and "gpu" not in capabilities:
            continue
        if request.get("DeviceIDs"):
            return tuple(str(d) for d in request["DeviceIDs"])
        count = int(request.get("Count") or 0)
        if count == -1:
            return ("all",)
        return tuple(str(i) for i in range(count))
    for item in env:
        key, _, value = item.partition("=")
        if key == "NVIDIA_VISIBLE_DEVICES":
            if value in ("", "void", "none"):
                return ()
            return tuple(v.strip() for v in value.split(",") if v.strip())
    return ()


def _label(
    container_labels: Mapping[str, Any], name: str, parse: Callable[[str], T]
) -> tuple[T | None, str | None]:
    """A label's parsed value, or the error that says why it cannot be used (never raises)."""
    raw = container_labels.get(name)
    if raw is None:
        return None, None
    try:
        return parse(raw), None
    except labels.LabelError as exc:
        return None, str(exc)


def container_info(attrs: Mapping[str, Any], policy: TrustPolicy = TRUST_ALL) -> ContainerInfo:
    """Build a ContainerInfo from a ``docker inspect`` document (pure)."""
    config = attrs.get("Config") or {}
    args = [attrs.get("Path") or "", *(attrs.get("Args") or ())]
    return describe_container(
        container_id=attrs["Id"],
        name=str(attrs.get("Name") or "").lstrip("/"),
        image=str(config.get("Image") or attrs.get("Image") or ""),
        state=str((attrs.get("State") or {}).get("Status") or "unknown"),
        container_labels=config.get("Labels") or {},
        gpus=gpus_from_config(attrs.get("HostConfig") or {}, config.get("Env") or []),
        command=" ".join(a for a in args if a),
        policy=policy,
    )


def describe_container(
    *,
    container_id: str,
    name: str,
    image: str,
    state: str,
    container_labels: Mapping[str, Any],
    gpus: tuple[str, ...],
    command: str,
    policy: TrustPolicy = TRUST_ALL,
) -> ContainerInfo:
    """A ContainerInfo from what any engine says of a container, its labels read (pure).

    An invalid ``gpuguard.deadline``, ``gpuguard.task``, ``gpuguard.class`` or
    ``gpuguard.slo.*`` is kept as an error beside the container, which then behaves as if the
    label were absent. A claim the operator's ``policy`` does not grant the container is
    replaced, and the rejection kept beside it (gpuguard/exporter/trust.py).
    """
    deadline_s, deadline_error = _label(container_labels, labels.DEADLINE, labels.parse_duration)
    task_mode, task_mode_error = _label(container_labels, labels.TASK, labels.parse_task_mode)
    class_label, class_error = _label(container_labels, labels.CLASS, labels.parse_priority_class)
    declared, slo_errors = slo.declaration(container_labels)
    gauge, gauge_errors = inflight.declaration(container_labels)
    info = ContainerInfo(
        id=container_id,
        name=name,
        image=image,
        state=state,
        managed=labels.parse_managed(container_labels.get(labels.MANAGED)),
        deadline_s=deadline_s,
        deadline_error=deadline_error,
        gpus=gpus,
        role=container_labels.get(labels.ROLE),
        command=command,
        task_mode=task_mode,
        task_mode_error=task_mode_error,
        class_label=class_label,
        class_error=class_error,
        slo=declared,
        slo_errors=slo_errors,
        inflight=gauge,
        inflight_errors=gauge_errors,
    )
    # A Docker container's own io.kubernetes.pod.namespace label is anyone's to set: rules on
    # namespace match only what a CRI sandbox says (gpuguard/exporter/containerd.py).
    return trust.enforce(policy, info)


class EventFollower:
    """A container source's life cycle: a daemon thread that follows an engine's event
    stream (``_connect_and_follow``, resyncing on every connect), backs off and reconnects
    on errors, and publishes a read-only mapping. Docker's and containerd's sources are
    such followers; they differ only in how they connect, list and read events."""

    #: the engine's name in log lines and the thread's name
    ENGINE = "engine"

    def __init__(self, events: EventLog | None, backoff_s: tuple[float, float]) -> None:
        self._events = events
        self._backoff_s = backoff_s
        self._containers: Mapping[str, ContainerInfo] = MappingProxyType({})
        self._lock = threading.Lock()  # serialises writers; readers take the mapping as is
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned_labels: set[str] = set()
        self.connected = False
        self.last_error: str | None = None
        self.resyncs = 0
        self.errors = 0
        self.resync_duration_s = 0.0

    def snapshot(self) -> Mapping[str, ContainerInfo]:
        """Read-only id -> ContainerInfo as of now (a new mapping after every change)."""
        return self._containers

    def start(self) -> Self:
        name = f"{self.ENGINE}-events"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._close_connection()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def wait_synced(self, timeout: float) -> bool:
        """Wait for the first full resync (used at start-up and by tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.resyncs > 0:
                return True
            time.sleep(0.01)
        return False

    def _run(self) -> None:
        delay = self._backoff_s[0]
        while not self._stop.is_set():
            try:
                self._connect_and_follow()
                delay = self._backoff_s[0]  # a clean end of stream: reconnect promptly
            except Exception as exc:  # the thread's boundary: log, back off, retry
                if self._stop.is_set():
                    break
                self.errors += 1
                if self.connected or self.last_error != str(exc):
                    log.warning("%s: %s; reconnecting in %.1fs", self.ENGINE, exc, delay)
                self.last_error = str(exc)
                self.connected = False
                self._close_connection()
                self._stop.wait(delay)
                delay = min(delay * 2, self._backoff_s[1])
            else:
                if not self._stop.is_set():  # the engine ended the stream: it is going away
                    self.errors += 1
                    log.warning("%s: event stream ended; reconnecting", self.ENGINE)
                self.connected = False
                self._close_connection()

    def _connect_and_follow(self) -> None:
        raise NotImplementedError

    def _close_connection(self) -> None:
        raise NotImplementedError


class ContainerIndex(EventFollower):
    """Container metadata kept current from Docker's event stream."""

    ENGINE = "docker"

    def __init__(
        self,
        client_factory: Callable[[], Any],
        events: EventLog | None = None,
        backoff_s: tuple[float, float] = (0.2, 5.0),
        policy: TrustPolicy = TRUST_ALL,
    ) -> None:
        super().__init__(events, backoff_s)
        self._client_factory = client_factory
        self._policy = policy
        self._stream: Any = None
        self._client: Any = None
        self._warned_claims: set[str] = set()

    def _connect_and_follow(self) -> None:
        self._client = self._client_factory()
        # Subscribe before listing: events raised during the resync are then applied after
        # it (each event re-inspects, so applying one twice is harmless).
        self._stream = self._client.api.events(
            decode=True, filters={"type": "container", "event": list(WATCHED_ACTIONS)}
        )
        self._resync()
        self.connected = True
        self.last_error = None
        for event in self._stream:
            if self._stop.is_set():
                return
            self._apply(event)

    def _resync(self) -> None:
        started = time.monotonic()
        api = self._client.api
        fresh: dict[str, ContainerInfo] = {}
        for summary in api.containers(all=True):
            info = self._inspect(summary["Id"])
            if info is not None:
                fresh[info.id] = info
        with self._lock:
            old = self._containers
            self._containers = MappingProxyType(fresh)
        self._announce_diff(old, fresh)
        self.resync_duration_s = time.monotonic() - started
        self.resyncs += 1

    def _announce_diff(
        self, old: Mapping[str, ContainerInfo], new: Mapping[str, ContainerInfo]
    ) -> None:
        """After a reconnect, report what changed while we were not listening."""
        for cid, info in old.items():
            if cid not in new:
                self._emit(EventType.CONTAINER_REMOVED, info)
        for cid, info in new.items():
            before = old.get(cid)
            if before is None:
                if old and info.state == "running":
                    self._emit(EventType.CONTAINER_STARTED, info)
            elif before.paused != info.paused:
                self._emit(
                    EventType.CONTAINER_PAUSED if info.paused else EventType.CONTAINER_RESUMED, info
                )

    def _inspect(self, container_id: str) -> ContainerInfo | None:
        import docker.errors

        try:
            attrs = self._client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return None
        info = container_info(attrs, self._policy)
        errors = [e for e in (info.deadline_error, info.task_mode_error, info.class_error) if e]
        errors += [error for _, error in info.slo_errors + info.inflight_errors]
        if errors and info.id not in self._warned_labels:
            self._warned_labels.add(info.id)  # logged once per container, never fatal
            log.warning("container %s: %s (label ignored)", info.name, "; ".join(errors))
        if info.claims_rejected and info.id not in self._warned_claims:
            self._warned_claims.add(info.id)
            why = "; ".join(f"{label}: {reason}" for label, reason in info.claims_rejected)
            log.warning("container %s: trust policy rejects %s", info.name, why)
        return info

    def _apply(self, event: Mapping[str, Any]) -> None:
        action = str(event.get("Action") or event.get("status") or "")
        container_id = str((event.get("Actor") or {}).get("ID") or event.get("id") or "")
        if not container_id or action not in WATCHED_ACTIONS:
            return
        ts = event.get("timeNano")
        when = int(ts) / 1e9 if ts else None
        info = None if action == "destroy" else self._inspect(container_id)
        with self._lock:
            updated = dict(self._containers)
            old = updated.pop(container_id, None)
            if info is not None:
                updated[container_id] = info
            self._containers = MappingProxyType(updated)
        if info is None:
            self._warned_labels.discard(container_id)
            if old is not None:
                self._emit(EventType.CONTAINER_REMOVED, old, when)
        elif action in _ACTION_EVENT:
            self._emit(_ACTION_EVENT[action], info, when)

    def _emit(self, type_: EventType, info: ContainerInfo, ts: float | None = None) -> None:
        if self._events is not None:
            self._events.append(type_, ts=ts, container_id=info.id, container=info.name)

    def _close_connection(self) -> None:
        stream, self._stream = self._stream, None
        client, self._client = self._client, None
        for closeable in (stream, client):
            if closeable is not None:
                try:
                    closeable.close()
                except Exception:  # closing a dead connection may fail any way
                    pass
