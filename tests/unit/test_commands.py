"""The user's commands: ``gpuguard ps`` rows, ``gpuguard run``'s docker and Swarm service
commands, and ``gpuguard nodes``' ranked table."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuguard.cli import main
from gpuguard.commands.errors import PlacementFailed
from gpuguard.commands.nodes import DEFAULT_ACTUATOR_URL, DEFAULT_PLACER_URL, format_ranked
from gpuguard.commands.placed_run import service_argv, swarm_node_id, wants_placer
from gpuguard.commands.ps import (
    DEFAULT_EXPORTER_URL,
    TASK_COLUMNS,
    format_table,
    ps_rows,
    task_rows,
)
from gpuguard.commands.run import docker_run_argv
from gpuguard.flags import ConfigError
from gpuguard.statedoc import parse_state

A = "a" * 64
B = "b" * 64


def test_run_builds_docker_argv() -> None:
    argv = docker_run_argv(["--deadline", "9s", "--managed", "-d", "--name", "x", "img", "a"])
    assert argv == [
        "docker", "run", "--label", "gpuguard.deadline=9s", "--label", "gpuguard.managed=true",
        "-d", "--name", "x", "img", "a",
    ]  # fmt: skip


def test_run_with_a_task_mode() -> None:
    argv = docker_run_argv(["--deadline", "2s", "--task", "burst", "img"])
    assert argv == ["docker", "run", "--label", "gpuguard.deadline=2s",
                    "--label", "gpuguard.task=burst", "img"]  # fmt: skip


def test_run_with_host_and_program_flags_left_alone() -> None:
    argv = docker_run_argv(
        ["--docker.host=unix:///d.sock", "--deadline=1500ms", "img", "--deadline", "3"]
    )
    assert argv == ["docker", "-H", "unix:///d.sock", "run", "--label", "gpuguard.deadline=1500ms",
                    "img", "--deadline", "3"]  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [["img"], ["--deadline", "soon", "img"], ["--deadline", "0s", "img"], ["--deadline", "9s"],
     ["--deadline"], ["--deadline", "9s", "--task", "Burst", "img"], ["--task=x", "img"]],
)  # fmt: skip
def test_run_rejects(argv: list[str]) -> None:
    with pytest.raises(ConfigError):
        docker_run_argv(argv)


STATE = {
    "node": "n", "seq": 1, "timestamp": 100.0, "sources": {"gpu": True}, "gpus": [],
    "containers": [
        {"id": A, "name": "rt-1", "command": "python3 -m gpusim.workload --size 4096",
         "state": "running", "paused": False, "managed": True, "deadline_s": 9.0,
         "deadline_error": None, "gpus": ["0"], "task_mode": "burst", "class": "real-time"},
        {"id": B, "name": "idle", "command": "sleep 60", "state": "paused", "paused": True,
         "managed": True, "deadline_s": None, "deadline_error": "bad", "gpus": [],
         "task_mode": "burst", "class": "normal"},
        {"id": "c" * 64, "name": "old", "command": "", "state": "exited", "paused": False,
         "managed": False, "deadline_s": 1.5, "deadline_error": None, "gpus": [],
         "task_mode": "burst", "class": "real-time"},
    ],
    "tasks": [
        {"task_id": f"{A[:12]}:1:5:1", "container_id": A, "pid": 1, "gpu": 0,
         "phase": "computing", "mode": "process", "started_at": 90.5, "proc_start_ticks": 5,
         "elapsed_s": 9.5, "slack_s": -0.5, "overrun": True},
        {"task_id": "-:77:6:2", "container_id": None, "pid": 77, "gpu": 0, "phase": "input",
         "mode": "burst", "started_at": 99.9, "proc_start_ticks": 6, "elapsed_s": 0.1,
         "slack_s": None, "overrun": False},
    ],
}  # fmt: skip


def test_ps_rows() -> None:
    rows = ps_rows(parse_state(STATE))
    assert [r["NAME"] for r in rows] == ["rt-1", "idle"]
    assert rows[0]["DEADLINE"] == "9s" and rows[0]["PHASE"] == "computing OVERRUN"
    assert rows[0]["SLACK"] == "-0.5s" and rows[0]["ELAPSED"] == "9.5s"
    assert rows[0]["COMMAND"].startswith('"python3') and len(rows[0]["COMMAND"]) <= 22
    assert rows[1]["DEADLINE"] == "invalid" and rows[1]["PAUSED"] == "yes"
    all_rows = ps_rows(parse_state(STATE), show_all=True)
    assert [r["NAME"] for r in all_rows] == ["rt-1", "idle", "old", "(pid 77)"]
    assert all_rows[2]["DEADLINE"] == "1.5s"
    table = format_table(rows).splitlines()
    assert table[0].split()[:3] == ["CONTAINER", "ID", "NAME"] and len(table) == 3


C = "c" * 64


def _ended(cid: str, started: float, met: bool | None, boundary: str = "exact") -> dict:
    return {"task_id": f"{cid[:12]}:1:5:{started:g}", "container_id": cid, "container": "x",
            "pid": 1, "gpu": 0, "phase": "ended", "mode": "burst", "started_at": started,
            "proc_start_ticks": 5, "elapsed_s": 2.0, "ended_at": started + 2.0, "run_s": 2.0,
            "boundary": boundary, "met_deadline": met}  # fmt: skip


#: rt-1 missed once; the exited "old" met three, missed one, and showed a merged busy span
#: and a start-up context (no kernel: not a task of its own)
FINISHED = {**STATE, "recent": [
    _ended(C, 10.0, None, "no_kernel"), _ended(C, 20.0, True), _ended(C, 30.0, True),
    _ended(A, 35.0, False), _ended(C, 40.0, False), _ended(C, 50.0, None, "merged"),
    _ended(C, 60.0, True),
]}  # fmt: skip


def test_ps_never_shows_minus_zero() -> None:
    doc = {**STATE, "tasks": [{**STATE["tasks"][0], "slack_s": -0.04, "elapsed_s": -0.01}]}
    (row,) = [r for r in ps_rows(parse_state(doc)) if r["NAME"] == "rt-1"]
    assert (row["SLACK"], row["ELAPSED"]) == ("+0.0s", "0.0s")


def test_ps_counts_met_and_missed_of_each_container_also_a_finished_one() -> None:
    rows = {r["NAME"]: r for r in ps_rows(parse_state(FINISHED), show_all=True)}
    assert (rows["old"]["MET"], rows["old"]["MISSED"]) == ("3", "1")
    assert (rows["rt-1"]["MET"], rows["rt-1"]["MISSED"]) == ("0", "1")
    assert (rows["idle"]["MET"], rows["idle"]["MISSED"]) == ("-", "-")  # no deadline
    assert (rows["(pid 77)"]["MET"], rows["(pid 77)"]["MISSED"]) == ("-", "-")
    header = format_table(list(rows.values())).splitlines()[0].split()
    assert header[-3:] == ["PAUSED", "MET", "MISSED"]  # added after the columns there were
    assert ps_rows(parse_state(STATE))[0]["MET"] == "0"  # no history: nothing met yet


def test_ps_tasks_lists_the_last_finished_tasks_with_their_verdict() -> None:
    rows = task_rows(parse_state(FINISHED), last=4, show_all=True)
    old = [(r["STARTED"], r["VERDICT"]) for r in rows if r["NAME"] == "old"]
    assert old == [("70.0s ago", "met"), ("60.0s ago", "MISSED"), ("50.0s ago", "merged"),
                   ("40.0s ago", "met")]  # fmt: skip
    assert [r["VERDICT"] for r in rows if r["NAME"] == "rt-1"] == ["MISSED"]
    assert [r["NAME"] for r in task_rows(parse_state(FINISHED), last=4)] == ["rt-1"]  # not -a
    table = format_table(rows, TASK_COLUMNS).splitlines()
    assert table[0].split() == ["CONTAINER", "ID", "NAME", "GPU", "STARTED", "RUN", "DEADLINE",
                                "VERDICT"]  # fmt: skip
    assert table[1].split()[-3:] == ["2.0s", "9s", "MISSED"]  # rt-1 first, as ps lists it


DOC = {
    "policy": "gpuguard",
    "request": {"deadline_s": 9.0, "memory_bytes": 2**31},
    "candidates": 2,
    "eligible": 1,
    "ranked": [
        {"node": "b", "gpu": "0", "model": "sim", "eligible": True, "reasons": [],
         "memory_free_bytes": 20 * 2**30, "float_time_s": None, "running_tasks": 0,
         "busy_ratio": 0.1, "slowdown": 1.0},
        {"node": "c", "gpu": "0", "model": "sim", "eligible": False,
         "reasons": ["saturated", "memory"], "memory_free_bytes": 2**30,
         "float_time_s": -1.25, "running_tasks": 3, "busy_ratio": 1.0, "slowdown": 4.3},
    ],
}  # fmt: skip


def test_ranked_table() -> None:
    lines = format_ranked(DOC).splitlines()
    assert lines[0].split() == ["#", "NODE", "GPU", "MODEL", "FREE", "FLOAT", "TASKS", "BUSY",
                                "SLOWDOWN", "WHY", "NOT"]  # fmt: skip
    assert lines[1].split() == ["1", "b", "0", "sim", "20.0GiB", "inf", "0", "10%", "x1.00", "-"]
    assert lines[2].split()[:2] == ["-", "c"] and lines[2].endswith("saturated, memory")
    assert lines[3] == "(gpuguard: 1 of 2 eligible for deadline 9.0s, memory 2.0GiB)"


NODES = [
    {"ID": "id-a", "Spec": {"Labels": {"gpuguard.node": "node-a"}},
     "Description": {"Hostname": "host"}},
    {"ID": "id-b", "Spec": {"Labels": {}}, "Description": {"Hostname": "host"}},
    {"ID": "id-c", "Spec": {}, "Description": {"Hostname": "gpu-7"}},
]  # fmt: skip


def test_swarm_node_by_label_then_unique_hostname() -> None:
    assert swarm_node_id(NODES, "node-a") == "id-a"
    assert swarm_node_id(NODES, "gpu-7") == "id-c"
    with pytest.raises(PlacementFailed, match="2 swarm nodes are called host"):
        swarm_node_id(NODES, "host")
    with pytest.raises(PlacementFailed, match="no swarm node is nowhere"):
        swarm_node_id(NODES, "nowhere")


def test_service_command_pins_the_node_and_keeps_the_realtime_constraint() -> None:
    found = {"--deadline": "9s", "--managed": "true", "--docker.host": "unix:///d.sock"}
    answer = {"node": "node-a", "gpu": "1"}
    cmd = service_argv(found, ["-d", "--name", "rt", "img", "serve"], answer, NODES)
    assert cmd == [
        "docker", "-H", "unix:///d.sock", "service", "create",
        "--constraint", "node.id==id-a",
        "--constraint", "node.labels.gpuguard.provisionable!=false",
        "--container-label", "gpuguard.deadline=9s",
        "--container-label", "gpuguard.managed=true",
        "--label", "gpuguard.placement=node-a/1",
        "--env", "NVIDIA_VISIBLE_DEVICES=1",
        "-d", "--name", "rt", "img", "serve",
    ]  # fmt: skip


def test_run_goes_to_the_placer_only_when_asked() -> None:
    assert wants_placer(["--placer.url", "http://p", "--deadline", "9s", "img"])
    assert wants_placer(["--deadline=9s", "--placer.url=http://p", "img"])
    assert not wants_placer(["--deadline", "9s", "--name", "x", "img", "--placer.url", "y"])


def test_run_with_a_bad_deadline_fails_before_asking(capsys: pytest.CaptureFixture[str]) -> None:
    # port 9 (discard) is never asked: the deadline is checked first
    argv = ["run", "--placer.url", "http://127.0.0.1:9", "--deadline", "soon", "img"]
    assert main(argv) == 2
    assert "--deadline" in capsys.readouterr().err
    argv = ["run", "--placer.url", "http://127.0.0.1:9", "--deadline", "9s", "img"]
    assert main(argv) == 2
    assert "--memory is required" in capsys.readouterr().err


def test_run_reports_an_unreachable_placer(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuguard.demo.stack.process import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["run", "--placer.url", url, "--deadline", "9s", "--memory", "1GiB", "i"]) == 1
    assert f"no placer at {url} (connection refused)" in capsys.readouterr().err


def test_the_commands_default_urls_are_where_the_services_listen() -> None:
    # The commands import no service: the defaults are written twice, and checked here.
    from gpuguard.actuator.config import FLAGS as ACTUATOR_FLAGS
    from gpuguard.exporter.config import DEFAULT_LISTEN as EXPORTER_LISTEN
    from gpuguard.placer.config import DEFAULT_LISTEN as PLACER_LISTEN

    (actuator_listen,) = (f.default for f in ACTUATOR_FLAGS if f.name == "web.listen-address")
    assert DEFAULT_EXPORTER_URL.removeprefix("http://") == EXPORTER_LISTEN
    assert DEFAULT_ACTUATOR_URL.removeprefix("http://") == actuator_listen
    assert DEFAULT_PLACER_URL.removeprefix("http://") == PLACER_LISTEN


def test_run_reserves_its_placement_with_the_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 20, item 5: a placement that reserves is a POST with the placer's token; a
    # plain query (no token) places nothing.
    import math

    from gpuguard.commands.placed_run import place
    from gpuguard.demo.stack.process import free_port
    from gpuguard.noderecord import GpuRecord, NodeRecord
    from gpuguard.placer.http import placer_server
    from gpuguard.placer.ranking import NodeView
    from gpuguard.placer.service import Placer

    gpu = GpuRecord("0", "sim", 1, (), math.inf, 0, 0, 0, None, 0.0, 20 * 2**30, 24 * 2**30)

    class Source:
        def views(self) -> list[NodeView]:
            return [NodeView(NodeRecord("node-a", 999.0, (gpu,)), 1.0)]

    placer = Placer(Source(), clock=lambda: 1000.0)
    port = free_port()
    server = placer_server(("127.0.0.1", port), placer, token="s3cret")
    server.serve_in_thread()
    try:
        token = tmp_path / "placer.token"
        token.write_text("s3cret\n")
        found = {"--placer.url": f"http://127.0.0.1:{port}", "--deadline": "9s",
                 "--memory": "1GiB"}  # fmt: skip
        answer = place({**found, "--placer.token-file": str(token)})
        assert (answer["node"], answer["gpu"]) == ("node-a", "0")
        assert len(placer.reservations) == 1
        with pytest.raises(PlacementFailed, match="401"):
            place(found)  # this placer wants its token even for a query
    finally:
        server.shutdown()
        server.server_close()
    loopback = Placer(Source(), clock=lambda: 1000.0)
    port = free_port()
    server = placer_server(("127.0.0.1", port), loopback, token=None)
    server.serve_in_thread()
    try:
        found["--placer.url"] = f"http://127.0.0.1:{port}"
        assert place(found)["node"] == "node-a"
        assert len(loopback.reservations) == 0
        assert "not reserved" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()
