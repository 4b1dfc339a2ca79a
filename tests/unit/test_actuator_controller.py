"""The controller's bookkeeping: skip counting, node-scoped and idempotent fail-open."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gpuguard.actuator.audit import read_audit
from gpuguard.actuator.controller import Controller
from gpuguard.actuator.decision import PAUSE, UNPAUSE, Decision, Skip, Step
from gpuguard.actuator.safety.failopen import without_pauses
from gpuguard.actuator.safety.journal import PausedEntry
from gpuguard.actuator.webhook import parse_message
from gpuguard.contract import SkipReason, StepReason, TriggerSource
from tests.unit.actuator_support import make_controller
from tests.unit.engine_fakes import FakeEngine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager"


def skipped(controller: Controller, reason: str) -> float | None:
    registry = controller.metrics.registry
    value: float | None = registry.get_sample_value(
        "gpuguard_actuator_skipped_total", {"reason": reason}
    )
    return value


def test_a_policy_skip_is_counted_once(tmp_path: Path) -> None:
    controller = make_controller(tmp_path)
    skip = Skip(SkipReason.KERNEL_RUNNING, "kernel already runs", "c" * 64, "t1", 0)
    controller._execute(Decision(skips=(skip,)), TriggerSource.FAST)
    assert skipped(controller, "kernel_running") == 1
    # The same skip again within the audit interval: not counted again.
    controller._execute(Decision(skips=(skip,)), TriggerSource.FAST)
    assert skipped(controller, "kernel_running") == 1
    controller.audit.close()


def webhook(name: str, status: str = "firing", node: str | None = "host-a", **kw: Any) -> Any:
    """A one-alert Alertmanager payload, parsed as the server would."""
    labels = {"alertname": name}
    if node is not None:
        labels["node"] = node
    alert = {
        "status": status,
        "labels": labels,
        "annotations": {},
        "startsAt": kw.get("starts", "2025-11-22T01:00:00Z"),
        "endsAt": kw.get("ends", "0001-01-01T00:00:00Z"),
        "generatorURL": "",
        "fingerprint": kw.get("fingerprint", "f" + name.lower()[:15]),
    }
    doc = json.loads((FIXTURES / "firing.json").read_text())
    doc.update(groupKey=kw.get("group", f"{{}}:{{alertname={name!r}}}"), alerts=[alert])
    doc["status"] = status
    return parse_message(doc)


def test_a_late_firing_duplicate_after_resolved_does_not_mark_again(tmp_path: Path) -> None:
    # Two clustered Alertmanagers: the second delivers the same firing notification
    # seconds after the first already delivered the resolution.
    controller = make_controller(tmp_path)
    firing = webhook("GpuguardNodeCannotGuaranteeDeadlines")
    resolved = webhook(
        "GpuguardNodeCannotGuaranteeDeadlines", "resolved", ends="2025-11-22T01:05:00Z"
    )
    controller.handle_webhook(firing)
    assert not controller.marks.nodes.provisionable
    controller.handle_webhook(resolved)
    assert controller.marks.nodes.provisionable
    report = controller.handle_webhook(firing)  # the late duplicate
    assert controller.marks.nodes.provisionable
    assert report.skips == [
        {"reason": "stale_alert", "alert": "GpuguardNodeCannotGuaranteeDeadlines"}
    ]
    assert skipped(controller, "stale_alert") == 1
    # A new episode of the same alert (a later startsAt) marks the node again.
    controller.handle_webhook(
        webhook("GpuguardNodeCannotGuaranteeDeadlines", starts="2025-11-22T02:00:00Z")
    )
    assert not controller.marks.nodes.provisionable
    controller.audit.close()


def audit_events(controller: Controller, event: str) -> list[dict[str, Any]]:
    return [
        r for r in read_audit(controller.config.state_dir / "audit.jsonl") if r["event"] == event
    ]


def test_resume_all_for_another_node_resumes_nothing_here(tmp_path: Path) -> None:
    controller = make_controller(tmp_path)
    controller.journal.will_pause(PausedEntry("c" * 64, "held", "t", 0, time.time(), "newcomer"))
    controller.handle_webhook(webhook("GpuguardExporterDown", node="host-b"))
    assert not controller.fail_open.holding_open
    assert audit_events(controller, "resume_all") == []
    assert "c" * 64 in controller.journal.paused
    controller.audit.close()


def test_duplicate_resume_all_deliveries_fail_open_once(tmp_path: Path) -> None:
    controller = make_controller(tmp_path)
    controller.journal.will_pause(PausedEntry("c" * 64, "held", "t", 0, time.time(), "newcomer"))
    for _ in range(100):
        controller.handle_webhook(webhook("GpuguardExporterDown"))
    assert controller.fail_open.holding_open
    # Docker is unreachable here, so the unpause failed and stays in the journal; the
    # duplicates retried it, but only while something was still held.
    assert len(audit_events(controller, "resume_all")) >= 1
    controller.journal.released("c" * 64)
    before = len(audit_events(controller, "resume_all"))
    for _ in range(100):
        controller.handle_webhook(webhook("GpuguardExporterDown"))
    assert len(audit_events(controller, "resume_all")) == before
    assert controller.health().startswith("degraded: ")
    controller.handle_webhook(
        webhook("GpuguardExporterDown", "resolved", ends="2025-11-22T01:01:00Z")
    )
    assert not controller.fail_open.holding_open
    controller.audit.close()


def test_pauses_are_held_back_while_failing_open(tmp_path: Path) -> None:
    controller = make_controller(tmp_path)
    controller.handle_webhook(webhook("GpuguardExporterDown", node=None))  # no node: ours
    assert controller.fail_open.holding_open
    pause = Step(PAUSE, "c" * 64, "rt-1", StepReason.NEWCOMER, 0, "t1")
    unpause = Step(UNPAUSE, "d" * 64, "rt-2", StepReason.ADMIT, 0, "t2")
    seen = frozenset({(0, None)})
    held = without_pauses(Decision((pause, unpause), realtime_devices=seen, next_due=12.5))
    assert held.steps == (unpause,)
    assert [(s.reason, s.container_id) for s in held.skips] == [("fail_open", "c" * 64)]
    # what the decision saw, and its timer, stand: a hold or a thaw still falls due
    assert (held.realtime_devices, held.next_due) == (seen, 12.5)
    controller.audit.close()


def test_a_fail_open_no_repeat_renews_expires(tmp_path: Path) -> None:
    controller = make_controller(tmp_path, **{"node.mark-ttl": "2s"})
    controller.handle_webhook(webhook("GpuguardExporterDown"))
    assert controller.fail_open.holding_open
    controller.fail_open.expire(time.time() + 1)
    assert controller.fail_open.holding_open
    controller.fail_open.expire(time.time() + 3)
    assert not controller.fail_open.holding_open
    controller.audit.close()


def test_a_late_firing_after_a_restart_is_still_stale(tmp_path: Path) -> None:
    # The resolution reached the actuator, which then restarted; the second Alertmanager's
    # late firing reaches the new one. The resolved episode came back from the journal.
    first = make_controller(tmp_path)
    first.handle_webhook(webhook("GpuguardNodeCannotGuaranteeDeadlines"))
    first.handle_webhook(
        webhook("GpuguardNodeCannotGuaranteeDeadlines", "resolved", ends="2025-11-22T01:05:00Z")
    )
    assert first.marks.nodes.provisionable
    first.audit.close()
    second = make_controller(tmp_path)
    report = second.handle_webhook(webhook("GpuguardNodeCannotGuaranteeDeadlines"))
    assert second.marks.nodes.provisionable
    assert report.skips == [
        {"reason": "stale_alert", "alert": "GpuguardNodeCannotGuaranteeDeadlines"}
    ]
    # a new episode still marks
    second.handle_webhook(
        webhook("GpuguardNodeCannotGuaranteeDeadlines", starts="2025-11-22T02:00:00Z")
    )
    assert not second.marks.nodes.provisionable
    second.audit.close()


def test_a_malformed_node_list_in_the_journal_does_not_stop_the_start(tmp_path: Path) -> None:
    controller = make_controller(tmp_path)
    controller.handle_webhook(webhook("GpuguardNodeCannotGuaranteeDeadlines"))
    controller.audit.close()
    path = controller.journal.path
    doc = json.loads(path.read_text())
    good = doc["nodes"]["reasons"][0]
    doc["nodes"]["reasons"] = [{"alertname": "x"}, "junk", {**good, "since": "soon"}, good]
    doc["nodes"]["since"] = "yesterday"
    doc["nodes"]["resolved_alerts"] = {"f1": ["not a time", 1.0], "f2": "junk", "f3": None}
    path.write_text(json.dumps(doc))
    restarted = make_controller(tmp_path)
    assert [r.fingerprint for r in restarted.marks.nodes.reasons()] == [good["fingerprint"]]
    assert not restarted.marks.nodes.provisionable
    assert len(restarted.order) == 0
    assert restarted.reconciler.journal_lost  # moved aside: managed pauses get resumed
    restarted.audit.close()


def test_a_timezone_naive_time_in_the_journal_is_no_500(tmp_path: Path) -> None:
    # Issue 20: a naive startsAt restored from the journal met the webhook's aware one in a
    # comparison: TypeError, and every webhook with that fingerprint answered 500.
    first = make_controller(tmp_path)
    first.journal.save()
    first.audit.close()
    path = first.journal.path
    doc = json.loads(path.read_text())
    naive = ["2025-11-22T01:00:00", time.time()]
    doc["nodes"] = {"node": "host-a", "resolved_alerts": {"fgpuguardexporte": naive}}
    path.write_text(json.dumps(doc))
    restarted = make_controller(tmp_path)
    report = restarted.handle_webhook(webhook("GpuguardExporterDown"))
    assert restarted.reconciler.journal_lost  # moved aside; managed pauses get resumed
    assert report.skips == []
    assert restarted.fail_open.holding_open
    restarted.audit.close()


# Issue 20, item 1: failing open, and the end of it, survive a restart.


def test_a_late_resume_all_firing_after_a_restart_is_stale(tmp_path: Path) -> None:
    # GpuguardExporterDown fires and resolves; the actuator restarts; the second
    # Alertmanager's late firing reaches the new one. It must not switch admission off.
    first = make_controller(tmp_path)
    first.handle_webhook(webhook("GpuguardExporterDown"))
    first.handle_webhook(webhook("GpuguardExporterDown", "resolved", ends="2025-11-22T01:01:00Z"))
    assert not first.fail_open.holding_open
    first.audit.close()
    second = make_controller(tmp_path)
    report = second.handle_webhook(webhook("GpuguardExporterDown"))
    assert report.skips == [{"reason": "stale_alert", "alert": "GpuguardExporterDown"}]
    assert not second.fail_open.holding_open
    assert audit_events(second, "resume_all") == [] or all(
        r["containers"] == [] for r in audit_events(second, "resume_all")
    )
    second.audit.close()


def test_failing_open_survives_a_restart(tmp_path: Path) -> None:
    # Restarted while the alert fires: it must go on pausing nothing until the alert
    # resolves (or no repeat renews it within --node.mark-ttl), not until the next repeat.
    first = make_controller(tmp_path, **{"node.mark-ttl": "60s"})
    first.handle_webhook(webhook("GpuguardExporterDown"))
    assert first.fail_open.holding_open
    first.audit.close()
    second = make_controller(tmp_path, **{"node.mark-ttl": "60s"})
    assert second.fail_open.holding_open
    assert "failing open" in second.health()
    pause = Step(PAUSE, "c" * 64, "rt-1", StepReason.NEWCOMER, 0, "t1")
    assert without_pauses(Decision((pause,))).steps == ()
    second.fail_open.expire(time.time() + 61)  # the TTL still counts from the last delivery
    assert not second.fail_open.holding_open
    second.save_alerts()  # as maintain() does after expiring
    second.audit.close()
    third = make_controller(tmp_path, **{"node.mark-ttl": "60s"})
    assert not third.fail_open.holding_open  # and its end was recorded too
    third.audit.close()


def test_a_restart_while_failing_open_resumes_what_is_still_paused(tmp_path: Path) -> None:
    first = make_controller(tmp_path)
    first.handle_webhook(webhook("GpuguardExporterDown"))  # Docker unreachable: unpause fails
    first.journal.will_pause(PausedEntry("c" * 64, "held", "t", 0, time.time(), "newcomer"))
    first.audit.close()
    second = make_controller(tmp_path)
    second.reconcile(None)
    resumes = audit_events(second, "resume_all")
    assert resumes and resumes[-1]["containers"] == ["c" * 64]
    second.audit.close()


def test_duplicate_deliveries_do_not_rewrite_the_journal(tmp_path: Path) -> None:
    controller = make_controller(tmp_path)
    controller.handle_webhook(webhook("GpuguardExporterDown"))
    before = controller.journal.path.stat().st_mtime_ns
    for _ in range(20):
        controller.handle_webhook(webhook("GpuguardExporterDown"))
    assert controller.journal.path.stat().st_mtime_ns == before
    controller.audit.close()


def test_forgetting_gone_containers_rewrites_the_journal_once(tmp_path: Path) -> None:
    # Issue 20, item 9: one durable write per forgotten entry made 1,000 gone containers
    # cost 5.4 s of start-up, 3,000 more than 12 s.
    controller = make_controller(tmp_path)
    controller.executor.engine = FakeEngine()  # answers, and lists none of them
    now = time.time()
    controller.journal.will_pause_many(
        [PausedEntry(f"{i:064x}", f"gone-{i}", None, 0, now, "newcomer") for i in range(1000)]
    )
    writes = []
    save = controller.journal.save
    controller.journal.save = lambda: (writes.append(1), save())[1]  # type: ignore[method-assign]
    controller.reconcile(None)
    assert controller.journal.paused == {}
    assert len(writes) == 1
    forgotten = [r for r in read_audit(controller.journal.path.parent / "audit.jsonl")
                 if r["event"] == "reconcile"]  # fmt: skip
    assert len(forgotten) == 1000  # each still audited
    controller.audit.close()


def test_rate_control_steps_each_running_cycle_once_a_period(tmp_path: Path) -> None:
    """Without --prometheus.url there is no signal: the cycle the first decision starts is
    stepped open loop, counted, and its fraction shown per device."""
    from tests.unit.policy_support import container, state, task

    controller = make_controller(
        tmp_path, **{"policy.best-effort-control": "rate", "besteffort.period": "200ms"}
    )
    cs = [container("r", deadline=2.0), container("t", klass="best-effort")]
    ts = [task("r", "computing", 1, sm=0.4), task("t", "computing", 2, sm=0.6)]
    registry = controller.metrics.registry

    def steps(result: str) -> float | None:
        value: float | None = registry.get_sample_value(
            "gpuguard_actuator_besteffort_control_steps_total", {"result": result}
        )
        return value

    try:
        for _ in range(3):
            fresh = state(cs, ts, util=1.0, timestamp=time.time())
            controller.decide_now(TriggerSource.FAST, state=fresh)
            time.sleep(0.25)
        assert steps("open_loop") == 2.0  # the first decision only started the cycle
        assert steps("up") == 0.0 and steps("settling") == 0.0
        fraction = registry.get_sample_value(
            "gpuguard_actuator_besteffort_run_fraction", {"gpu": "0"}
        )
        assert fraction == 0.1
        assert controller.history.snapshot(time.time()).duty_cycles.keys() == {(0, None)}
    finally:
        controller.timer.stop()
