"""Webhook routing: every alert action has exactly one handler, each alert reaches its own."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.actuator.audit import read_audit
from gpuguard.actuator.configfiles import load_actions
from gpuguard.actuator.controller import Controller
from gpuguard.actuator.report import Report
from gpuguard.actuator.routing import Delivery, by_action
from gpuguard.actuator.webhook import Alert
from gpuguard.contract import AlertAction
from tests.unit.actuator_support import REPO, make_controller
from tests.unit.test_actuator_controller import skipped, webhook

ACTIONS_YML = REPO / "rules" / "actions.yml"
#: alert name -> action, as shipped
SHIPPED: dict[str, str] = yaml.safe_load(ACTIONS_YML.read_text())["actions"]
T0 = datetime(2025, 11, 22, tzinfo=UTC)


def alert(name: str) -> Alert:
    return Alert("firing", {"alertname": name}, {}, T0, T0, "", "fp-" + name)


def recording(controller: Controller) -> list[tuple[AlertAction, list[str]]]:
    """Swap every handler for one that notes what it got; returns the notes, in call order."""
    calls: list[tuple[AlertAction, list[str]]] = []

    def recorder(action: AlertAction) -> Any:
        def handle(alerts: list[Alert], delivery: Delivery) -> Report:
            calls.append((action, [a.name for a in alerts]))
            return Report()

        return handle

    controller.routes = {action: recorder(action) for action in controller.routes}
    return calls


def test_every_alert_action_has_exactly_one_handler(tmp_path: Path) -> None:
    controller = make_controller(tmp_path)
    assert sorted(controller.routes) == sorted(AlertAction)
    handlers = [getattr(h, "__func__", h) for h in controller.routes.values()]
    assert len(set(handlers)) == len(AlertAction)  # no handler serves two actions
    controller.audit.close()


def test_every_action_the_shipped_rules_name_has_a_handler(tmp_path: Path) -> None:
    controller = make_controller(tmp_path)
    loaded = load_actions(ACTIONS_YML, str(REPO / "rules" / "*.rules.yml"))
    assert loaded == SHIPPED
    assert {AlertAction(action) for action in SHIPPED.values()} <= set(controller.routes)
    controller.audit.close()


@pytest.mark.parametrize(("name", "action"), sorted(SHIPPED.items()))
def test_each_shipped_alert_reaches_its_actions_handler_alone(
    tmp_path: Path, name: str, action: str
) -> None:
    controller = make_controller(tmp_path)
    calls = recording(controller)
    report = controller.handle_webhook(webhook(name))
    assert report.skips == []
    # every handler runs once, in the table's order; only its own action's gets the alert
    assert [a for a, _ in calls] == list(controller.routes)
    assert {a: names for a, names in calls if names} == {AlertAction(action): [name]}
    controller.audit.close()


def test_an_alert_no_action_names_is_skipped_and_reaches_no_handler(tmp_path: Path) -> None:
    controller = make_controller(tmp_path)
    calls = recording(controller)
    report = controller.handle_webhook(webhook("GpuguardNoSuchAlert"))
    assert report.skips == [{"reason": "irrelevant_alert", "alert": "GpuguardNoSuchAlert"}]
    assert skipped(controller, "irrelevant_alert") == 1
    assert all(names == [] for _, names in calls)
    controller.audit.close()


def test_an_alert_no_action_names_changes_nothing(tmp_path: Path) -> None:
    controller = make_controller(tmp_path)  # the real handlers
    report = controller.handle_webhook(webhook("GpuguardNoSuchAlert"))
    assert report.to_doc() == {
        "actions": [],
        "skips": [{"reason": "irrelevant_alert", "alert": "GpuguardNoSuchAlert"}],
    }
    assert not report.exporter_down and not report.docker_down
    assert controller.marks.nodes.provisionable and not controller.fail_open.holding_open
    events = read_audit(controller.config.state_dir / "audit.jsonl")
    assert [e for e in events if e.get("event") == "alert"] == []
    controller.audit.close()


def test_an_unknown_action_is_no_alert_action() -> None:
    # rules/actions.yml naming one is refused at start-up (test_actuator_config)
    with pytest.raises(ValueError):
        AlertAction("reboot")


@pytest.mark.parametrize(
    ("names", "routed", "irrelevant"),
    [
        ([], {}, []),
        (["A"], {AlertAction.ADMISSION: ["A"]}, []),
        (["X"], {}, ["X"]),
        (
            ["A", "M", "X", "B", "R"],
            {
                AlertAction.ADMISSION: ["A", "B"],
                AlertAction.MARK_NODE: ["M"],
                AlertAction.RESUME_ALL: ["R"],
            },
            ["X"],
        ),
    ],
)
def test_by_action_groups_in_order(
    names: list[str], routed: dict[AlertAction, list[str]], irrelevant: list[str]
) -> None:
    actions = {
        "A": AlertAction.ADMISSION,
        "B": AlertAction.ADMISSION,
        "M": AlertAction.MARK_NODE,
        "R": AlertAction.RESUME_ALL,
    }
    got, left = by_action([alert(n) for n in names], actions)
    assert {a: [x.name for x in xs] for a, xs in got.items()} == routed
    assert [x.name for x in left] == irrelevant
