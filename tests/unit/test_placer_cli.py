"""``gpuguard placer`` flags, ``gpuguard nodes --placer.url`` output, and ``gpuguard run``'s
Swarm service command."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpuguard.cli import main
from gpuguard.placer.cli import format_ranked
from gpuguard.placer.config import add_flags, load_config
from gpuguard.placer.errors import ConfigError, PlacementFailed
from gpuguard.placer.ranking import Policy
from gpuguard.placer.swarm import service_argv, swarm_node_id, wants_placer


def config(*argv: str):
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return load_config(parser.parse_args(list(argv)))


def test_placer_defaults_bind_loopback() -> None:
    c = config()
    assert (c.listen_host, c.listen_port, c.token) == ("127.0.0.1", 9837, None)
    assert (c.policy, c.headroom, c.settle_s, c.max_age_s) == (Policy.GPUGUARD, 0.05, 10.0, 30.0)
    assert c.prometheus_url == "http://127.0.0.1:9090"


def test_placer_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"needs --web\.token-file"):
        config("--web.listen-address=0.0.0.0:9837")
    token = tmp_path / "token"
    token.write_text("abc\n")
    assert config("--web.listen-address=0.0.0.0:9837", f"--web.token-file={token}").token == "abc"


@pytest.mark.parametrize(
    "argv",
    [
        ("--placement.policy=best",),
        ("--placement.headroom=1",),
        ("--placement.headroom=nan",),
        ("--prometheus.url=ftp://x",),
        ("--records.max-age=soon",),
    ],
)
def test_bad_placer_flags(argv: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError):
        config(*argv)


def test_cli_exit_2_on_bad_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["placer", "--placement.policy=best"]) == 2
    assert capsys.readouterr().err.startswith("gpuguard placer: --placement.policy")


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
    from gpuguard.stack.process import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["run", "--placer.url", url, "--deadline", "9s", "--memory", "1GiB", "i"]) == 1
    assert "placer at" in capsys.readouterr().err
