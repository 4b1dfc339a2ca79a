"""Servers' requests running now, as their exact activity shows them (``policy.requests``):
which are read, when each falls due, how much longer each may run."""

from __future__ import annotations

import pytest

from gpuguard.actuator.admission.policy.edges import devices_of
from gpuguard.actuator.admission.policy.requests import (
    Request,
    began_since,
    covers,
    running_requests,
    sooner,
)
from gpuguard.actuator.state import DeviceKey
from gpuguard.contract import PriorityClass
from tests.unit.policy_support import NOW, cid, container, seen, state, task

RT = PriorityClass.REAL_TIME
GPU0: DeviceKey = (0, None)


def request(name: str, ago: float, deadline: float = 2.0, longest: float | None = 0.5) -> Request:
    return Request(cid(name), RT, NOW - ago, deadline, longest)


def test_a_request_falls_due_at_its_busy_periods_start_plus_its_deadline() -> None:
    assert request("a", 0.3, deadline=2.0).due == pytest.approx(NOW + 1.7)


@pytest.mark.parametrize(
    ("ago", "longest", "left"),
    [
        (0.2, 0.5, 0.3),  # its longest run less what it has run
        (0.5, 0.5, 0.5),  # ran its longest: it merged requests, the next may have just begun
        (2.0, 0.5, 0.5),
        (0.2, None, None),  # no run learnt
    ],
)
def test_how_much_longer_a_request_may_run(
    ago: float, longest: float | None, left: float | None
) -> None:
    found = request("a", ago, longest=longest).left_s(NOW)
    assert found == (None if left is None else pytest.approx(left))


def test_sooner_requests_are_other_containers_due_first_of_its_class_or_higher() -> None:
    ours = request("a", 0.1)
    first, later = request("b", 0.5), request("c", 0.0, deadline=3.0)
    assert sooner([ours, first, later], cid("a"), RT, ours.due) == [first]
    normal = Request(cid("n"), PriorityClass.NORMAL, NOW - 1, 0.5, 0.1)
    assert sooner([normal], cid("a"), RT, ours.due) == []  # a lower class never goes first
    assert sooner([normal], cid("x"), PriorityClass.NORMAL, ours.due) == [normal]


def test_a_wait_covers_requests_only_when_it_outlasts_each() -> None:
    one, two = request("a", 0.2, longest=0.5), request("b", 0.1, longest=1.0)
    assert covers(NOW + 0.3, [one], NOW)
    assert not covers(NOW + 0.29, [one], NOW)
    assert not covers(NOW + 0.5, [one, two], NOW)  # b may run 0.9 s more
    assert not covers(NOW + 10, [request("c", 0.1, longest=None)], NOW)  # unknown run


def test_a_wait_is_new_only_for_a_request_begun_since_the_last_thaw() -> None:
    r = request("a", 0.5)
    assert began_since([r], None)  # never thawed
    assert began_since([r], NOW - 1.0)
    assert not began_since([r], NOW - 0.2)


def server_seen(name: str, busy: bool = True, **kw: object) -> dict[str, object]:
    c = seen(container(name, deadline=2.0, **kw), busy=busy)  # type: ignore[arg-type]
    c["longest_run_s"] = 0.4
    return c


def gauge(name: str) -> dict[str, object]:
    """A server seen busy through its in-flight gauge, as if the gauge said when it began."""
    c = seen(container(name, deadline=2.0), "gauge", inflight=1)
    c["activity"].update(busy=True, busy_since=NOW - 0.01, in_flight=True)
    return c


def test_running_requests_are_busy_real_time_servers_seen_by_the_probe() -> None:
    cs = [
        server_seen("a"),  # read
        server_seen("b", busy=False),  # idle
        server_seen("c", paused=True),  # paused by Docker
        server_seen("d"),  # paused by this actuator
        server_seen("e"),  # not a server
        gauge("f"),  # its start is a poll's, maybe late
        container("g", deadline=2.0),  # NVML only
        seen(container("h"), busy=True),  # no deadline
    ]
    ts = [task(n, "computing", i) for i, n in enumerate("abcdefgh")]
    servers = {cid(n) for n in "abcdfgh"}
    st = state(cs, ts)
    found = running_requests(st, devices_of(st), servers, {cid("d")})
    assert list(found) == [GPU0]
    (only,) = found[GPU0]
    assert only.cid == cid("a") and only.started_at == pytest.approx(NOW - 0.01)
    assert only.deadline_s == 2.0 and only.longest_s == 0.4
