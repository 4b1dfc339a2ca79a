from __future__ import annotations

import pytest

from gpuguard.exporter.cli import docker_run_argv, format_table, ps_rows
from gpuguard.exporter.errors import ConfigError
from gpuguard.exporter.http import BadRequest, parse_events_query

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
    "containers": [
        {"id": A, "name": "rt-1", "command": "python3 -m gpusim.workload --size 4096",
         "state": "running", "paused": False, "deadline_s": 9.0, "deadline_error": None,
         "gpus": ["0"]},
        {"id": B, "name": "idle", "command": "sleep 60", "state": "paused", "paused": True,
         "deadline_s": None, "deadline_error": "bad", "gpus": []},
        {"id": "c" * 64, "name": "old", "command": "", "state": "exited", "paused": False,
         "deadline_s": 1.5, "deadline_error": None, "gpus": []},
    ],
    "tasks": [
        {"container_id": A, "pid": 1, "gpu": 0, "phase": "computing", "elapsed_s": 9.5,
         "slack_s": -0.5, "overrun": True},
        {"container_id": None, "pid": 77, "gpu": 0, "phase": "input", "elapsed_s": 0.1,
         "slack_s": None, "overrun": False},
    ],
}  # fmt: skip


def test_ps_rows() -> None:
    rows = ps_rows(STATE)
    assert [r["NAME"] for r in rows] == ["rt-1", "idle"]
    assert rows[0]["DEADLINE"] == "9s" and rows[0]["PHASE"] == "computing OVERRUN"
    assert rows[0]["SLACK"] == "-0.5s" and rows[0]["ELAPSED"] == "9.5s"
    assert rows[0]["COMMAND"].startswith('"python3') and len(rows[0]["COMMAND"]) <= 22
    assert rows[1]["DEADLINE"] == "invalid" and rows[1]["PAUSED"] == "yes"
    all_rows = ps_rows(STATE, show_all=True)
    assert [r["NAME"] for r in all_rows] == ["rt-1", "idle", "old", "(pid 77)"]
    assert all_rows[2]["DEADLINE"] == "1.5s"
    table = format_table(rows).splitlines()
    assert table[0].split()[:3] == ["CONTAINER", "ID", "NAME"] and len(table) == 3


def test_events_query() -> None:
    assert parse_events_query("") == (0, 10.0)
    assert parse_events_query("since=12&timeout=0.5") == (12, 0.5)


@pytest.mark.parametrize(
    "query",
    [
        "since=-1",
        "since=x",
        "since=%C2%B2",  # '²': str.isdigit() says yes, int() says no
        "since=" + "9" * 5000,  # int() refuses more than 4,300 digits
        "timeout=61",
        "timeout=-1",
        "timeout=nan",
        "timeout=x",
        "timeout=%EF%BC%91",  # a fullwidth 1
        "foo=1",
    ],
)
def test_events_query_rejects(query: str) -> None:
    with pytest.raises(BadRequest):
        parse_events_query(query)
