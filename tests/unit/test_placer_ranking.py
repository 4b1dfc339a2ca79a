"""The placer's ranking (pure): paper C's node list and gpuguard's per-GPU ranking."""

from __future__ import annotations

import math

import pytest

from gpuguard.contract import RankReason, StateReason
from gpuguard.noderecord import GpuRecord, NodeRecord
from gpuguard.placer.ranking import NodeView, Pending, Policy, Request, rank
from gpuguard.placer.reservations import Reservations
from gpuguard.slowdown import slowdown_factor

GIB = 2**30


def gpu(
    key: str = "0",
    free: float = 20,
    total: float = 24,
    running: int = 0,
    float_time: float = math.inf,
    reasons: tuple[StateReason, ...] = (),
    busy: float = 0.0,
    model: str = "sim",
) -> GpuRecord:
    return GpuRecord(
        gpu=key,
        model=model,
        state=0 if reasons else 1,
        reasons=reasons,
        float_time_s=float_time,
        deadline_tasks=running,
        recent_misses=int(StateReason.MISSED_DEADLINE in reasons),
        running_tasks=running,
        min_slack_s=None,
        busy_ratio=busy,
        memory_free_bytes=int(free * GIB),
        memory_total_bytes=int(total * GIB),
    )


def node(name: str, *gpus: GpuRecord, age: float = 1.0, marked: bool = False) -> NodeView:
    return NodeView(NodeRecord(name, 1000.0, gpus), age, marked)


REQUEST = Request(deadline_s=9.0, memory_bytes=2 * GIB)


def order(views: list[NodeView], request: Request = REQUEST, **kw) -> list[tuple[str, str]]:
    ranking = rank(views, request, **kw)
    return [(c.node, c.gpu or "") for c in ranking.candidates if c.eligible]


def test_paper_c_sorts_by_free_memory_and_takes_the_first_with_float_above_the_deadline() -> None:
    views = [
        node("a", gpu(free=10, running=1, float_time=20.0)),
        node("b", gpu(free=16, running=1, float_time=5.0)),  # most free, float <= deadline
        node("c", gpu(free=12, running=1, float_time=9.5)),
        node("d", gpu(free=23, reasons=(StateReason.SATURATED,))),  # state 0
    ]
    ranking = rank(views, REQUEST, Policy.PAPER_C)
    assert ranking.choice is not None and ranking.choice.node == "c"
    assert [c.node for c in ranking.candidates] == ["c", "a", "d", "b"]
    reasons = {c.node: c.reasons for c in ranking.candidates}
    assert reasons["b"] == (RankReason.FLOAT_TIME,)
    assert reasons["d"] == (StateReason.SATURATED,)


def test_paper_c_idle_node_has_unbounded_float_time() -> None:
    ranking = rank([node("idle", gpu(free=8))], REQUEST, Policy.PAPER_C)
    assert ranking.choice is not None and ranking.choice.node == "idle"


def test_gpuguard_ranks_gpus_fewest_sharers_first_then_least_busy_then_most_free() -> None:
    views = [
        node("a", gpu("0", free=22, running=2), gpu("1", free=10, running=0, busy=0.4)),
        node("b", gpu("0", free=12, running=0, busy=0.4)),
        node("c", gpu("0", free=8, running=0, busy=0.1)),
    ]
    assert order(views) == [("c", "0"), ("b", "0"), ("a", "1"), ("a", "0")]


def test_gpuguard_keeps_paper_c_state_0_and_marks_and_staleness_out() -> None:
    views = [
        node("missed", gpu(reasons=(StateReason.MISSED_DEADLINE,))),
        node("marked", gpu(), marked=True),
        node("stale", gpu(), age=31.0),
        node("nogpu"),
        node("ok", gpu(free=4)),
    ]
    ranking = rank(views, REQUEST)
    assert ranking.choice is not None and ranking.choice.node == "ok"
    reasons = {c.node: c.reasons for c in ranking.candidates}
    assert reasons["missed"] == (StateReason.MISSED_DEADLINE,)
    assert reasons["marked"] == (RankReason.MARKED,)
    assert reasons["stale"] == (RankReason.STALE,)
    assert reasons["nogpu"] == (StateReason.NO_GPU,)


def test_gpuguard_keeps_memory_headroom() -> None:
    # 2 GiB asked; 5% of 24 GiB (1.2 GiB) must stay free
    tight = node("tight", gpu(free=3.1))
    roomy = node("roomy", gpu(free=3.3, running=3))
    ranking = rank([tight, roomy], REQUEST)
    assert ranking.choice is not None and ranking.choice.node == "roomy"
    assert dict((c.node, c.reasons) for c in ranking.candidates)["tight"] == (RankReason.MEMORY,)
    assert rank([tight], REQUEST, headroom=0.0).choice is not None


def test_gpuguard_predicts_the_newcomers_run_time_with_the_contention_model() -> None:
    request = Request(deadline_s=5.0, memory_bytes=GIB, runtime_s=2.0)
    views = [node("busy", gpu(running=1)), node("busier", gpu(running=2))]
    ranking = rank(views, request)
    by_node = {c.node: c for c in ranking.candidates}
    assert by_node["busy"].slowdown == pytest.approx(2 * slowdown_factor(2))  # 2.16
    assert by_node["busy"].predicted_s == pytest.approx(2.0 * 2 * slowdown_factor(2))
    assert by_node["busy"].eligible
    assert by_node["busier"].reasons == (RankReason.PREDICTED_MISS,)  # 2 s x 3.22 > 5 s


def test_gpuguard_counts_pending_placements() -> None:
    views = [node("a", gpu(free=20)), node("b", gpu(free=19))]
    assert order(views)[0] == ("a", "0")
    pending = {("a", "0"): Pending(tasks=1, memory_bytes=2 * GIB)}
    assert order(views, pending=pending)[0] == ("b", "0")


def test_gpu_model_filter() -> None:
    views = [node("a", gpu(model="A100")), node("b", gpu(model="H100"))]
    request = Request(9.0, GIB, gpu_model="H100")
    assert order(views, request) == [("b", "0")]


def test_no_eligible_candidate_means_no_choice() -> None:
    ranking = rank([node("a", gpu(free=1))], REQUEST)
    assert ranking.choice is None
    assert ranking.candidates[0].reasons == (RankReason.MEMORY,)


def test_reservations_settle_once_a_newer_record_shows_the_node() -> None:
    book = Reservations(settle_s=5.0)
    book.add("a", "0", 2 * GIB, at=100.0)
    book.add("a", "0", GIB, at=101.0)
    assert book.pending({"a": 99.0}, now=101.0) == {("a", "0"): Pending(2, 3 * GIB)}
    assert book.pending({"a": 105.5}, now=106.0) == {("a", "0"): Pending(1, GIB)}
    assert book.pending({"a": 106.0}, now=106.0) == {}
    assert len(book) == 0
    book.add("gone", "0", GIB, at=100.0)  # its node never reports again
    assert book.pending({}, now=159.0) and not book.pending({}, now=161.0)
