from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpuguard.contract import TaskMode
from gpuguard.exporter.config import add_flags, load_config
from gpuguard.exporter.errors import ConfigError
from gpuguard.exporter.tracker import TaskRules


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser.parse_args(list(argv))


def test_defaults() -> None:
    config = load_config(parse(), env={})
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 10835)
    assert config.poll_interval_s == 0.1
    assert config.gpu_backend == "auto"
    assert config.gpusim_socket == Path("/run/gpusim/gpusim.sock")
    assert config.docker_host == "unix:///var/run/docker.sock"
    assert config.procfs == Path("/proc")
    assert config.node_name
    assert (config.history_size, config.events_buffer) == (256, 4096)


def test_environment_defaults() -> None:
    env = {"DOCKER_HOST": "unix:///tmp/d.sock", "GPUSIM_SOCKET": "/tmp/g.sock"}
    config = load_config(parse(), env=env)
    assert config.docker_host == "unix:///tmp/d.sock"
    assert config.gpusim_socket == Path("/tmp/g.sock")


def test_flags(tmp_path: Path) -> None:
    config = load_config(
        parse(
            "--web.listen-address", "0.0.0.0:9999", "--poll.interval", "250ms",
            "--gpu.backend", "gpusim", "--path.procfs", str(tmp_path), "--node.name", "n1",
            "--history.size", "10", "--events.buffer", "64",
        ),
        env={},
    )  # fmt: skip
    assert (config.listen_host, config.listen_port) == ("0.0.0.0", 9999)
    assert config.poll_interval_s == 0.25 and config.gpu_backend == "gpusim"
    assert config.procfs == tmp_path and config.node_name == "n1"
    assert (config.history_size, config.events_buffer) == (10, 64)


def test_yaml_file_and_flag_precedence(tmp_path: Path) -> None:
    path = tmp_path / "exporter.yml"
    path.write_text("poll.interval: 0.5s\nnode.name: from-file\nhistory.size: 7\n")
    config = load_config(parse("--config.file", str(path), "--node.name", "from-flag"), env={})
    assert config.poll_interval_s == 0.5
    assert config.node_name == "from-flag"
    assert config.history_size == 7


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--web.listen-address", "10835"], "--web.listen-address"),
        (["--web.listen-address", "h:99999"], "--web.listen-address"),
        (["--poll.interval", "fast"], "--poll.interval"),
        (["--poll.interval", "1ms"], "between 10ms and 60s"),
        (["--gpu.backend", "cuda"], "--gpu.backend"),
        (["--docker.host", "/var/run/docker.sock"], "--docker.host"),
        (["--path.procfs", "/nonexistent"], "--path.procfs"),
        (["--history.size", "0"], "--history.size"),
        (["--events.buffer", "lots"], "--events.buffer"),
        (["--node.name", " "], "--node.name"),
        (["--config.file", "/nonexistent.yml"], "--config.file"),
    ],
)
def test_invalid_values_are_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_config(parse(*argv), env={})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("content", ["[1, 2]", "poll.intervals: 1s", "a: [unclosed"])
def test_invalid_files(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=r"--config\.file") as info:
        load_config(parse("--config.file", str(path)), env={})
    assert "\n" not in str(info.value)


def test_config_is_frozen() -> None:
    config = load_config(parse(), env={})
    with pytest.raises(AttributeError):
        config.poll_interval_s = 1.0  # type: ignore[misc]


def test_task_flags() -> None:
    assert load_config(parse(), env={}).task_rules == TaskRules(TaskMode.BURST, 0.5, 2.0)
    config = load_config(
        parse("--task.default-mode", "memory", "--task.idle-gap", "1s",
              "--task.idle-timeout", "10s"),
        env={},
    )  # fmt: skip
    assert config.task_rules == TaskRules(TaskMode.MEMORY, 1.0, 10.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--task.default-mode", "Burst"), "--task.default-mode 'Burst': must be one of"),
        (("--task.idle-gap", "0"), "--task.idle-gap"),
        (("--task.idle-gap", "3s"), "--task.idle-timeout '2s': must be at least --task.idle-gap"),
    ],
)
def test_bad_task_flags(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(parse(*argv), env={})
