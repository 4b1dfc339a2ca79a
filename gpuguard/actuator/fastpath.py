"""The fast path: follow the exporter's event stream and decide on every relevant event.

Alertmanager cannot be faster than its group timers (seconds), while paper B must pause a
container inside its memory-input phase (~0.2 s). So the actuator long-polls
``/api/v1/events``; each relevant event triggers a fresh ``/api/v1/state`` read and the same
``decide()`` the webhooks use. A batch of ``gpu_busy`` and ``gpu_idle`` edges alone is first
decided on the last state read with those edges applied, at once, then on the fresh read. It
resynchronises from the state on start, when the exporter says events were dropped
(``truncated``), and when the exporter restarted (sequence went back).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from gpuguard.actuator.controller import Controller
from gpuguard.actuator.edgestate import EDGE_TYPES
from gpuguard.actuator.errors import ExporterUnavailable, StateError
from gpuguard.actuator.exporter_client import ExporterClient
from gpuguard.actuator.state import Event
from gpuguard.contract import EventType, TriggerSource

log = logging.getLogger("gpuguard.actuator.fast")

RELEVANT_EVENTS = frozenset(
    {
        EventType.TASK_STARTED,
        EventType.TASK_PHASE,
        EventType.TASK_ENDED,
        EventType.CONTAINER_STARTED,
        EventType.CONTAINER_REMOVED,
        EventType.GPU_BUSY,
        EventType.GPU_IDLE,
    }
)
LONG_POLL_S = 5.0


class FastPath:
    """A daemon thread running ``follow`` until ``stop()``."""

    def __init__(self, controller: Controller, client: ExporterClient) -> None:
        self.controller = controller
        self.client = client
        self._stop = threading.Event()
        self._deciding = threading.Lock()  # held by a decision; stop() waits for it only
        self._thread = threading.Thread(target=self.follow, name="fastpath", daemon=True)
        self.latencies_ms: list[float] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No decision starts once this returns; a long poll under way is not waited for."""
        with self._deciding:
            self._stop.set()
        self.client.close()

    def _decide(self, event_ts: float | None = None, edges: Sequence[Event] = ()) -> bool:
        """Decide unless stopped (on ``edges`` first, where they are busy and idle edges alone);
        False once stopped."""
        with self._deciding:
            if self._stop.is_set():
                return False
            if edges and event_ts is not None:
                self.controller.decide_on_edges(edges, event_ts)
            self.controller.decide_now(TriggerSource.FAST, event_ts=event_ts)
            return True

    def follow(self) -> None:
        since: int | None = None
        backoff = 0.1
        while not self._stop.is_set():
            try:
                if since is None:
                    if not self._decide():
                        break
                    assert self.controller.last_state is not None
                    since = self.controller.last_state.seq
                # Every change the policy acts on comes as an event: a kernel's end too (the
                # exporter says draining as soon as no SM sample stands for the task), so
                # nothing is decided between events, however long a container is paused.
                batch = self.client.events(since, LONG_POLL_S)
                self.controller.exporter_ok()
                backoff = 0.1
                if batch.truncated or batch.next < since:
                    log.info("event stream truncated or restarted: resync from state")
                    since = None
                    continue
                since = batch.next
                relevant = [e for e in batch.events if e.type in RELEVANT_EVENTS]
                if relevant:
                    first = min(e.ts for e in relevant)
                    edges_only = all(e.type in EDGE_TYPES for e in relevant)
                    if not self._decide(first, relevant if edges_only else ()):
                        break
                    self.latencies_ms.append(1000 * (time.time() - first))
                    del self.latencies_ms[:-1000]
            except (ExporterUnavailable, StateError) as exc:
                log.debug("fast path: exporter unavailable: %s", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 1.0)
            except Exception:  # the loop must survive anything and go on
                log.exception("fast path: unexpected error")
                self._stop.wait(1.0)
