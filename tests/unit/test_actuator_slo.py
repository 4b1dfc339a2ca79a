"""protect_slo: the policy's SLO pressure (table tests, one per branch), the actuator's record
of firing SLO alerts (gpuguard/actuator/admission/pressure.py, gpuguard/actuator/slo.py),
and the controller
acting on them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gpuguard.actuator.admission.policy.decide import decide
from gpuguard.actuator.admission.pressure import SloPressure, device_of
from gpuguard.actuator.audit import read_audit
from gpuguard.actuator.decision import (
    PAUSE,
    UNPAUSE,
    Decision,
    Ledger,
    PolicyConfig,
    Recent,
    Trigger,
)
from gpuguard.actuator.errors import ExporterUnavailable
from gpuguard.actuator.state import ExporterState
from gpuguard.actuator.webhook import WebhookMessage, parse_message
from tests.unit.actuator_support import make_controller
from tests.unit.policy_support import NOW, acts, cid, container, ours, reasons, state, task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager"
BE = "best-effort"
GPU0 = frozenset({(0, None)})


def run(
    st: Any,
    ledger: Ledger | None = None,
    pressure: frozenset[Any] = GPU0,
    recent: Recent | None = None,
    **config: Any,
) -> Decision:
    trigger = Trigger("fast", NOW)
    return decide(st, trigger, PolicyConfig(**config), ledger, recent, slo_pressure=pressure)


# --- the policy: best-effort neighbours under SLO pressure ----------------------------------


def test_best_effort_is_frozen_between_the_servers_requests_under_slo_pressure() -> None:
    # the real-time server is idle (no task), the trainer computes: no freeze without
    # pressure (realtime_idle), a freeze with it
    cs = [container("r", klass="real-time"), container("t", klass=BE)]
    ts = [task("t", "computing", 1)]
    assert acts(run(state(cs, ts, util=1.0), pressure=frozenset())) == []
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [(PAUSE, "t")] and d.steps[0].reason == "duty_cycle"  # frozen first


def test_slo_pressure_on_another_gpu_leaves_best_effort_alone() -> None:
    cs = [container("t", klass=BE)]
    ts = [task("t", "computing", 1, gpu=0)]
    assert acts(run(state(cs, ts, gpus=2), pressure=frozenset({(1, None)}))) == []


def test_slo_pressure_on_a_mig_device_is_that_device_only() -> None:
    cs = [container("t", klass=BE), container("u", klass=BE)]
    ts = [task("t", "computing", 1, mig=0), task("u", "computing", 2, mig=1, pid=9)]
    d = run(state(cs, ts, migs=2), pressure=frozenset({(0, 1)}))
    assert acts(d) == [(PAUSE, "u")]


def test_under_pressure_a_running_real_time_task_runs_the_same_cycle() -> None:
    cs = [container("r", deadline=2.0), container("t", klass=BE)]
    ts = [task("r", "computing", 2, sm=0.3), task("t", "computing", 1, sm=0.7)]
    for pressure in (GPU0, frozenset()):
        d = run(state(cs, ts, util=1.0), pressure=pressure)
        assert acts(d) == [(PAUSE, "t")] and d.steps[0].reason == "duty_cycle"


def test_best_effort_is_thawed_when_the_pressure_ends() -> None:
    cs = [container("r", klass="real-time"), container("t", klass=BE, paused=True)]
    ts = [task("t", "computing", 1, paused=True)]
    assert acts(run(state(cs, ts), ours("t"))) == []  # held while the alert fires
    d = run(state(cs, ts), ours("t"), pressure=frozenset())
    assert acts(d) == [(UNPAUSE, "t")] and d.steps[0].reason == "realtime_idle"


def test_unmanaged_best_effort_is_never_frozen_for_an_slo() -> None:
    cs = [container("t", klass=BE, managed=False)]
    d = run(state(cs, [task("t", "computing", 1)]))
    assert acts(d) == [] and "unmanaged" in reasons(d)


def test_slo_pressure_never_freezes_normal_or_real_time_neighbours() -> None:
    cs = [container("n"), container("r", deadline=2.0)]
    ts = [task("n", "computing", 1, sm=0.4), task("r", "draining", 2, pid=9)]
    assert acts(run(state(cs, ts, util=0.4))) == []


# --- the record of firing SLO alerts -------------------------------------------------------


def alert(
    fingerprint: str,
    container_name: str,
    status: str = "firing",
    gpu: str | None = "0",
    node: str = "host-a",
    name: str = "GpuguardSloAtRisk",
) -> dict[str, Any]:
    labels = {"alertname": name, "node": node, "container": container_name,
              "container_id": cid(container_name)[:12], "severity": "info"}  # fmt: skip
    if gpu is not None:
        labels["gpu"] = gpu
    return {
        "status": status,
        "labels": labels,
        "annotations": {},
        "startsAt": "2025-11-22T01:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2025-11-22T01:05:00Z",
        "generatorURL": "",
        "fingerprint": fingerprint,
    }


def message(
    *alerts: dict[str, Any], group: str = '{}:{alertname="GpuguardSloAtRisk"}'
) -> WebhookMessage:
    doc = json.loads((FIXTURES / "firing.json").read_text())
    doc.update(groupKey=group, alerts=list(alerts))
    doc["status"] = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return parse_message(doc)


def server_and_trainer(
    trainer: bool = True, klass: str = "real-time", at: float = NOW, **kw: Any
) -> ExporterState:
    cs = [container("s", klass=klass)]
    ts = []
    if trainer:
        cs.append(container("t", klass=BE, **kw))
        ts.append(task("t", "computing", 1))
    return state(cs, ts, util=1.0, timestamp=at)


def fresh(**kw: Any) -> ExporterState:
    """A snapshot taken now (the controller decides on the wall clock)."""
    return server_and_trainer(at=time.time(), **kw)


def test_device_of_the_gpu_label() -> None:
    assert device_of({"gpu": "1"}) == (1, None)
    assert device_of({"gpu": "0:2"}) == (0, 2)
    assert device_of({}) is None


def test_firing_and_resolved_alerts_for_this_node() -> None:
    pressure = SloPressure("host-a")
    msg = message(alert("f1", "s"), alert("f2", "s", node="host-b"))
    assert pressure.apply(msg.alerts, NOW)
    assert set(pressure.alerts) == {"f1"}  # another node's alert is not ours
    assert not pressure.apply(message(alert("f1", "s")).alerts, NOW + 1)  # a repeat renews
    assert pressure.alerts["f1"].seen == NOW + 1
    assert pressure.devices(server_and_trainer()) == GPU0
    assert pressure.apply(message(alert("f1", "s", "resolved")).alerts, NOW + 2)
    assert pressure.devices(server_and_trainer()) == frozenset()


def test_only_a_real_time_container_puts_its_gpu_under_pressure() -> None:
    pressure = SloPressure("host-a")
    pressure.apply(message(alert("f1", "s")).alerts, NOW)
    assert pressure.devices(server_and_trainer(klass="normal")) == frozenset()
    assert pressure.devices(state([], [])) == frozenset()  # the container is gone


def test_an_alert_without_gpu_protects_the_devices_of_the_containers_tasks() -> None:
    pressure = SloPressure("host-a")
    pressure.apply(message(alert("f1", "s", gpu=None)).alerts, NOW)
    cs = [container("s", klass="real-time")]
    assert pressure.devices(state(cs, [task("s", "computing", 1, gpu=1)], gpus=2)) == {(1, None)}
    assert pressure.devices(state(cs, [], gpus=2)) == frozenset()


def test_unrelieved_when_nothing_on_the_gpu_can_be_frozen() -> None:
    pressure = SloPressure("host-a")
    pressure.apply(message(alert("f1", "s")).alerts, NOW)
    assert pressure.unrelieved(server_and_trainer()) == set()
    assert pressure.unrelieved(server_and_trainer(paused=True)) == set()  # frozen already
    assert pressure.unrelieved(server_and_trainer(trainer=False)) == {"f1"}
    assert pressure.unrelieved(server_and_trainer(managed=False)) == {"f1"}
    assert pressure.unrelieved(server_and_trainer(klass="normal")) == set()  # not protected


def test_the_real_time_containers_at_risk() -> None:
    pressure = SloPressure("host-a")
    pressure.apply(message(alert("f1", "s"), alert("f2", "n")).alerts, NOW)
    cs = [container("s", klass="real-time"), container("n")]
    assert pressure.at_risk(state(cs, [])) == {cid("s")}  # n is not real-time
    assert pressure.at_risk(state([], [])) == frozenset()  # the container is gone


def test_an_alert_no_repeat_renewed_expires() -> None:
    pressure = SloPressure("host-a")
    pressure.apply(message(alert("f1", "s")).alerts, NOW)
    assert pressure.expire(NOW + 300, ttl=300) == []
    assert [a.container for a in pressure.expire(NOW + 301, ttl=300)] == ["s"]
    assert pressure.alerts == {}


# --- the controller ---------------------------------------------------------------------


class FakeExporter:
    def __init__(self, st: ExporterState | None) -> None:
        self.st = st

    def state(self) -> ExporterState:
        if self.st is None:
            raise ExporterUnavailable("exporter down")
        return self.st


def controller_with(tmp_path: Path, st: ExporterState | None) -> Any:
    controller = make_controller(tmp_path)
    controller.exporter = FakeExporter(st)
    return controller


def test_protect_slo_freezes_the_best_effort_neighbour_at_once(tmp_path: Path) -> None:
    reason = "duty_cycle"  # its cycle runs, frozen first
    controller = controller_with(tmp_path, fresh())
    report = controller.handle_webhook(message(alert("f1", "s")))
    [action] = report.actions
    assert (action["action"], action["container"], action["reason"]) == ("pause", "t", reason)
    assert controller.marks.nodes.provisionable  # a freeze can help: no mark
    events = [r for r in read_audit(controller.config.state_dir / "audit.jsonl")]
    [pressure] = [e for e in events if e.get("event") == "slo_pressure"]
    assert pressure["alerts"][0]["container"] == "s"
    controller.audit.close()


def test_protect_slo_marks_the_node_while_nothing_can_be_frozen(tmp_path: Path) -> None:
    controller = controller_with(tmp_path, fresh(trainer=False))
    report = controller.handle_webhook(message(alert("f1", "s")))
    assert report.actions == [] or all(a["action"] != "pause" for a in report.actions)
    assert not controller.marks.nodes.provisionable
    assert [r.alertname for r in controller.marks.nodes.reasons()] == ["GpuguardSloAtRisk"]
    # a neighbour that can be frozen arrives: the next notification no longer marks
    controller.exporter = FakeExporter(fresh())
    controller.handle_webhook(message(alert("f1", "s")))
    assert controller.marks.nodes.provisionable
    # and a resolution ends both
    controller.exporter = FakeExporter(fresh(trainer=False))
    controller.handle_webhook(message(alert("f1", "s")))
    assert not controller.marks.nodes.provisionable
    controller.handle_webhook(message(alert("f1", "s", "resolved")))
    assert controller.marks.nodes.provisionable and controller.slo.pressure.alerts == {}
    controller.audit.close()


def test_protect_slo_without_fresh_state_changes_no_mark(tmp_path: Path) -> None:
    controller = controller_with(tmp_path, fresh(trainer=False))
    controller.handle_webhook(message(alert("f1", "s")))
    assert not controller.marks.nodes.provisionable
    controller.exporter = FakeExporter(None)
    later = message(alert("f1", "s"))
    report = controller.handle_webhook(later)
    assert report.exporter_down  # 503: Alertmanager delivers it again
    assert not controller.marks.nodes.provisionable  # nothing known to say otherwise
    # a resolution needs no state: the SLO is met again
    controller.handle_webhook(message(alert("f1", "s", "resolved")))
    assert controller.marks.nodes.provisionable
    controller.audit.close()


def test_every_decision_sees_the_pressure_until_it_expires(tmp_path: Path) -> None:
    controller = controller_with(tmp_path, fresh())
    controller.handle_webhook(message(alert("f1", "s")))
    report = controller.decide_now("fast")  # type: ignore[arg-type]
    assert [a["reason"] for a in report.actions] == ["duty_cycle"]
    controller.slo.expire(time.time() + 10 * controller.config.node_mark_ttl_s)
    assert controller.slo.pressure.alerts == {}
    assert controller.decide_now("fast").actions == []  # type: ignore[arg-type]
    controller.audit.close()


def test_a_server_at_risk_goes_before_one_that_affords_a_wait(tmp_path: Path) -> None:
    # two servers that declare SLOs: without alerts they share; when one's alert fires,
    # the controller hands it to the policy, which freezes the other (for its slack)
    slo = {"metric": "tgi_request_duration", "target_s": 2.0, "objective": 0.99, "port": 9000}
    cs = [container(n, deadline=2.0) | {"slo": slo} for n in ("a", "b")]
    ts = [task("a", "computing", 1, age=3.0), task("b", "computing", 2, age=0.5)]
    controller = controller_with(tmp_path, state(cs, ts, util=1.0, timestamp=time.time()))
    assert controller.decide_now("fast").actions == []  # type: ignore[arg-type]
    report = controller.handle_webhook(message(alert("f1", "b")))
    pauses = [(a["container"], a["reason"]) for a in report.actions if a["action"] == "pause"]
    assert pauses == [("a", "preempt")]  # tried: no engine runs here
    controller.audit.close()
