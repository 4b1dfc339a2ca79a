"""The whole gpuguard stack on loopback: one or more nodes, Prometheus and Alertmanager.

A node is a private dockerd, a gpusim daemon, an exporter, an actuator and its guard (a
process of its own, as in every deployment, sharing the actuator's state directory). Every
process is recorded in ``<dir>/stack.json`` so that another invocation (``gpuguard demo
--stop``) can stop each by its PID and remove every container.
"""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
import socket
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard.actuator.safety.lease import GUARD_LEASE
from gpuguard.demo.stack.alertmanager import AlertmanagerService
from gpuguard.demo.stack.appimage import ensure_app_image
from gpuguard.demo.stack.dockerd import PrivateDockerd, shutdown_engine
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.images import ensure_base_image
from gpuguard.demo.stack.process import ManagedProcess, free_port, http_ok, stop_pid
from gpuguard.demo.stack.prometheus import PrometheusService
from gpuguard.demo.stack.swarm import form_swarm, leave_swarm, name_nodes

RECORD = "stack.json"
STACK_PARTS = (
    "prometheus", "alertmanager", "logs", "report.txt", "webhook.token", "placer.log", "env",
    "timeline-paper-b.png", "timeline-colocation.png",
)  # fmt: skip
ENV_FILE = "env"
# The usual ports when they are free (the first node's exporter and actuator), else any.
DEFAULT_PORTS = {
    "exporter": 10835, "actuator": 10836, "placer": 10837, "prometheus": 9090,
    "alertmanager": 9093,
}  # fmt: skip
Progress = Callable[[str], None]
# What README's "Your own container" shows a new user
# (tests/integration/test_readme_demo.py runs it).
USER_RUN_EXAMPLE = (
    'gpuguard run --deadline 9s --managed -d --name rt-1 -v "$GPUSIM_DIR:/run/gpusim" '
    "gpuguard/workload:local --size 13312 --repeat 3 --sleep-between 1"
)


def gpuguard_argv(command: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", "gpuguard.cli", command, *flags]


@dataclass
class NodeStack:
    """One simulated GPU host: engine, gpusim, exporter, actuator."""

    base_dir: Path
    node_name: str
    time_scale: float = 0.1
    order: str = "fifo"
    poll_interval: str = "0.1s"
    exporter_port: int = 0
    actuator_port: int = 0
    actuator_mode: str = "both"
    extra_actuator_flags: list[str] = field(default_factory=list)
    extra_exporter_flags: list[str] = field(default_factory=list)
    #: ``--trust.all``: the stack's private engine has one tenant, the demo, bench or test
    #: that runs it, whose containers claim real-time, short deadlines and SLOs by label
    #: and must be believed (docs/security.md); False: the exporter's built-in default
    trust_all: bool = True
    #: a command the actuator runs under (``prlimit --nofile=256:256 --`` in a test)
    launcher: tuple[str, ...] = ()
    #: more ``gpusim serve`` options (``{"device": ["name=a", "name=b"]}``)
    gpusim_options: dict[str, object] = field(default_factory=dict)
    engine: PrivateDockerd | None = None
    gpusim: GpusimService | None = None
    exporter: ManagedProcess | None = None
    actuator: ManagedProcess | None = None
    guard: ManagedProcess | None = None

    token_file: Path | None = None

    @property
    def exporter_url(self) -> str:
        return f"http://127.0.0.1:{self.exporter_port}"

    @property
    def actuator_url(self) -> str:
        return f"http://127.0.0.1:{self.actuator_port}"

    def start(self, progress: Progress = lambda _: None) -> NodeStack:
        return self.start_engine(progress).start_services(progress)

    def start_engine(self, progress: Progress = lambda _: None) -> NodeStack:
        """The private dockerd with the base image imported."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.engine = PrivateDockerd(self.base_dir / "docker").start()
        progress(f"[{self.node_name}] dockerd at {self.engine.url}")
        client = self.engine.client()
        ensure_base_image(client)
        client.close()
        return self

    def start_services(self, progress: Progress = lambda _: None) -> NodeStack:
        """gpusim, exporter and actuator, once the engine is up (and in a swarm, if any)."""
        options = {"time_scale": self.time_scale, **self.gpusim_options}
        self.gpusim = GpusimService(self.base_dir / "gpusim", options)
        self.gpusim.start()
        progress(f"[{self.node_name}] gpusim (kernel time scale {self.time_scale})")
        self.start_exporter()
        progress(f"[{self.node_name}] exporter at {self.exporter_url}")
        self.start_guard()
        self.start_actuator()
        progress(f"[{self.node_name}] actuator at {self.actuator_url}")
        return self

    def start_exporter(self) -> None:
        assert self.engine is not None and self.gpusim is not None
        self.exporter_port = free_port(self.exporter_port)
        argv = gpuguard_argv(
            "exporter",
            f"--web.listen-address=127.0.0.1:{self.exporter_port}",
            "--gpu.backend=gpusim",
            f"--gpusim.socket={self.gpusim.socket}",
            f"--docker.host={self.engine.url}",
            f"--node.name={self.node_name}",
            f"--poll.interval={self.poll_interval}",
            *(["--trust.all"] if self.trust_all else []),
            *self.extra_exporter_flags,
        )
        self.exporter = ManagedProcess("exporter", argv, self.base_dir / "exporter.log").start()
        self.exporter.wait_ready(lambda: http_ok(self.exporter_url + "/healthz"))

    @property
    def state_dir(self) -> Path:
        """The actuator's --state.dir, which its guard shares."""
        return self.base_dir / "actuator"

    def start_guard(self) -> None:
        """``gpuguard guard`` on the actuator's state directory (before the actuator)."""
        assert self.engine is not None
        argv = gpuguard_argv(
            "guard", f"--state.dir={self.state_dir}", f"--docker.host={self.engine.url}"
        )
        self.guard = ManagedProcess("guard", argv, self.base_dir / "guard.log").start()
        lease_path = self.state_dir / GUARD_LEASE
        self.guard.wait_ready(lease_path.exists)

    def start_actuator(self) -> None:
        assert self.engine is not None
        self.token_file = self.token_file or make_token_file(self.base_dir / "webhook.token")
        self.actuator_port = free_port(self.actuator_port)
        argv = gpuguard_argv(
            "actuator",
            f"--web.listen-address=127.0.0.1:{self.actuator_port}",
            f"--web.token-file={self.token_file}",
            f"--exporter.url={self.exporter_url}",
            f"--docker.host={self.engine.url}",
            f"--node.name={self.node_name}",
            f"--policy.order={self.order}",
            f"--mode={self.actuator_mode}",
            f"--state.dir={self.state_dir}",
            *self.extra_actuator_flags,
        )
        argv = [*self.launcher, *argv]
        self.actuator = ManagedProcess("actuator", argv, self.base_dir / "actuator.log").start()
        self.actuator.wait_ready(lambda: http_ok(self.actuator_url + "/healthz"))

    def client(self) -> Any:
        assert self.engine is not None
        return self.engine.client()

    def record(self) -> list[dict[str, Any]]:
        """What ``stop_recorded`` needs to stop this node from another process."""
        out: list[dict[str, Any]] = []
        gpusim = self.gpusim.process if self.gpusim is not None else None
        # In stopping order: the actuator (it resumes what it paused), then its guard.
        for proc in (self.actuator, self.guard, self.exporter, gpusim):
            if proc is not None:
                out.append({"kind": "process", "name": proc.name, "pid": proc.pid})
        if self.engine is not None and self.engine.process is not None:
            out.append(
                {
                    "kind": "engine",
                    "name": "dockerd",
                    "pid": self.engine.process.pid,
                    "url": self.engine.url,
                    "base_dir": str(self.engine.base_dir),
                }
            )
        return out

    def stop_actuator(self) -> None:
        """SIGTERM by its PID: it resumes what it paused. Its guard stays, as deployed."""
        if self.actuator is not None:
            self.actuator.stop()
            self.actuator = None

    def stop(self) -> None:
        # Actuator first: on SIGTERM it resumes what it paused, while Docker is still up;
        # then its guard, which would resume whatever the actuator could not.
        self.stop_actuator()
        if self.guard is not None:
            self.guard.stop()
            self.guard = None
        if self.exporter is not None:
            self.exporter.stop()
            self.exporter = None
        if self.gpusim is not None:
            self.gpusim.stop()
        if self.engine is not None:
            self.engine.stop()


def make_token_file(path: Path) -> Path:
    """A random bearer token shared by Alertmanager and the actuators (mode 0600)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(16) + "\n")
        path.chmod(0o600)
    return path


class LocalStack:
    """Nodes plus one Prometheus (fast profile) and one Alertmanager routing per node."""

    def __init__(
        self,
        directory: Path,
        node_names: list[str] | None = None,
        *,
        time_scale: float = 0.1,
        order: str = "fifo",
        poll_interval: str = "0.1s",
        swarm: bool = False,
        placer_flags: list[str] | None = None,
        exporter_flags: list[str] | None = None,
        actuator_flags: list[str] | None = None,
        default_ports: bool = True,
    ) -> None:
        """``default_ports``: the usual ports when they are free (the demo); else any.

        Every actuator is told this stack's Prometheus (``--prometheus.url``: rate control's
        signal), whose port is chosen before the nodes start.
        """
        self.dir = directory
        self.swarm = swarm
        self.ports = DEFAULT_PORTS if default_ports else dict.fromkeys(DEFAULT_PORTS, 0)
        # None: no placer; a list (maybe empty): start one with these extra flags
        self.placer_flags = placer_flags
        self.placer: ManagedProcess | None = None
        self.placer_port = 0
        self.swarm_node_ids: list[str] = []
        token = make_token_file(directory / "webhook.token")
        names = node_names or [socket.gethostname()]
        self.prometheus_port = free_port(self.ports["prometheus"])
        to_prometheus = [f"--prometheus.url=http://127.0.0.1:{self.prometheus_port}"]
        self.nodes = [
            NodeStack(
                directory / f"node-{i}",
                name,
                exporter_port=self.ports["exporter"] if i == 0 else 0,
                actuator_port=self.ports["actuator"] if i == 0 else 0,
                time_scale=time_scale,
                order=order,
                poll_interval=poll_interval,
                token_file=token,
                extra_exporter_flags=list(exporter_flags or []),
                extra_actuator_flags=[*to_prometheus, *(actuator_flags or [])],
            )
            for i, name in enumerate(names)
        ]
        self.token_file = token
        self.prometheus: PrometheusService | None = None
        self.alertmanager: AlertmanagerService | None = None

    def start(self, progress: Progress = lambda _: None) -> LocalStack:
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            for node in self.nodes:
                node.start_engine(progress)
                self._record()
            if self.swarm:
                engines = [node.engine for node in self.nodes if node.engine is not None]
                self.swarm_node_ids = form_swarm(engines)
                names = [node.node_name for node in self.nodes]
                name_nodes(engines[0], dict(zip(self.swarm_node_ids, names, strict=True)))
                progress(f"swarm of {len(engines)} nodes on 127.0.0.1")
            for node in self.nodes:
                node.start_services(progress)
                self._record()
            first = self.nodes[0]
            self.alertmanager = AlertmanagerService(
                self.dir / "alertmanager",
                first.actuator_url + "/api/v1/alerts",
                self.token_file,
                port=free_port(self.ports["alertmanager"]),
                node_webhooks={n.node_name: n.actuator_url + "/api/v1/alerts" for n in self.nodes},
            ).start()
            progress(f"alertmanager at {self.alertmanager.url}")
            self._record()
            self.prometheus = PrometheusService(
                self.dir / "prometheus",
                port=self.prometheus_port,
                profile="fast",
                exporters={f"127.0.0.1:{n.exporter_port}": n.node_name for n in self.nodes},
                actuators=[f"127.0.0.1:{n.actuator_port}" for n in self.nodes],
                alertmanagers=[self.alertmanager.address],
                tenant_engines=[n.engine.url for n in self.nodes if n.engine is not None],
            ).start()
            progress(f"prometheus at {self.prometheus.url} (1 s scrape and evaluation)")
            self._record()
            if self.placer_flags is not None:
                self.start_placer()
                progress(f"placer at {self.placer_url}")
                self._record()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def placer_url(self) -> str:
        return f"http://127.0.0.1:{self.placer_port}"

    def start_placer(self) -> None:
        """``gpuguard placer`` on loopback, reading the records from this stack's Prometheus."""
        assert self.prometheus is not None
        self.placer_port = free_port(self.ports["placer"])
        argv = gpuguard_argv(
            "placer",
            f"--web.listen-address=127.0.0.1:{self.placer_port}",
            f"--prometheus.url={self.prometheus.url}",
            *(self.placer_flags or []),
        )
        self.placer = ManagedProcess("placer", argv, self.dir / "placer.log").start()
        self.placer.wait_ready(lambda: http_ok(self.placer_url + "/healthz"))

    def _record(self) -> None:
        entries: list[dict[str, Any]] = []
        if self.placer is not None:
            entries.append({"kind": "process", "name": "placer", "pid": self.placer.pid})
        for service in (self.prometheus, self.alertmanager):
            if service is not None and service.process is not None:
                entries.append(
                    {"kind": "process", "name": service.process.name, "pid": service.pid}
                )
        for node in self.nodes:
            entries += node.record()
        write_record(self.dir, entries)

    def prepare_user_workloads(self) -> Path:
        """Import the workload image into the first node's engine and write ``<dir>/env``.

        ``. <dir>/env`` points the docker CLI, ``gpuguard run``, ``gpuguard ps`` and
        ``gpuguard nodes`` at that node, and names its gpusim directory (``GPUSIM_DIR``) to
        mount at ``/run/gpusim`` in a container running ``gpuguard/workload:local``; it puts
        the ``gpuguard`` that runs the demo on ``PATH``, so a new shell needs nothing else.
        """
        node = self.nodes[0]
        assert node.engine is not None and node.gpusim is not None
        client = node.engine.client()
        try:
            ensure_app_image(client)
        finally:
            client.close()
        values = user_env(node.engine.url, node.gpusim, node.exporter_url, node.actuator_url)
        path = self.dir / ENV_FILE
        path.write_text(env_file_text(values, Path(sys.executable).parent))
        return path

    def urls_text(self) -> str:
        lines = ["The stack is up on 127.0.0.1:"]
        if self.prometheus is not None:
            lines.append(
                f"  Prometheus    {self.prometheus.url}  (alerts: {self.prometheus.page('alerts')})"
            )
        if self.alertmanager is not None:
            lines.append(f"  Alertmanager  {self.alertmanager.url}")
        if self.placer is not None:
            lines.append(f"  Placer        {self.placer_url}/api/v1/nodes")
        for node in self.nodes:
            lines.append(
                f"  [{node.node_name}] exporter {node.exporter_url}/metrics  "
                f"state {node.exporter_url}/api/v1/state"
            )
            lines.append(f"  [{node.node_name}] actuator {node.actuator_url}/api/v1/nodes")
            if node.engine is not None:
                lines.append(f"  [{node.node_name}] docker   DOCKER_HOST={node.engine.url}")
        if (self.dir / ENV_FILE).exists():
            lines += [
                "Run your own managed container with a deadline on it (README, Getting started):",
                f"  . {self.dir / ENV_FILE}",
                f"  {USER_RUN_EXAMPLE}",
                "  gpuguard ps",
            ]
        return "\n".join(lines)

    def stop(self) -> None:
        if self.placer is not None:
            self.placer.stop()
            self.placer = None
        if self.swarm:
            leave_swarm([node.engine for node in self.nodes if node.engine is not None])
        for service in (self.prometheus, self.alertmanager):
            if service is not None:
                service.stop()
        self.prometheus = self.alertmanager = None
        # The nodes share nothing: each stops in its own order, all at once.
        with ThreadPoolExecutor(max_workers=len(self.nodes) or 1) as pool:
            for stopped in [pool.submit(node.stop) for node in self.nodes]:
                stopped.result()
        (self.dir / RECORD).unlink(missing_ok=True)

    @staticmethod
    def stop_recorded(directory: Path) -> int:
        return stop_recorded(directory)

    @staticmethod
    def clean(directory: Path) -> None:
        """Remove what a stopped stack left in ``directory`` (only the parts it makes)."""
        for child in directory.glob("*"):
            if child.name.startswith("node-") or child.name in STACK_PARTS:
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)


def user_env(
    docker_host: str, gpusim: GpusimService, exporter_url: str, actuator_url: str
) -> dict[str, str]:
    """What ``.stack/env`` exports: the engine, the exporter and actuator, and gpusim's
    directory (to mount in containers) and socket (for ``gpusim status`` on the host)."""
    return {
        "DOCKER_HOST": docker_host,
        "GPUSIM_DIR": str(gpusim.dir),
        "GPUSIM_SOCKET": str(gpusim.socket),
        "GPUGUARD_EXPORTER_URL": exporter_url,
        "GPUGUARD_ACTUATOR_URL": actuator_url,
    }


def env_file_text(values: dict[str, str], bin_dir: Path) -> str:
    """``.stack/env``: ``values`` exported, and ``bin_dir`` (the venv's ``bin``, where the
    ``gpuguard`` running the demo lives) first on ``PATH`` when it holds ``gpuguard``."""
    lines = ["# . this file: the demo's first node for docker and gpuguard"]
    if (bin_dir / "gpuguard").exists():
        lines.append(f'export PATH={shlex.quote(str(bin_dir))}:"$PATH"')
    lines += [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
    return "\n".join(lines) + "\n"


def running_recorded(directory: Path) -> list[dict[str, Any]]:
    """The processes a stack recorded in ``directory`` that still run (none: no stack up)."""
    path = directory / RECORD
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [e for e in entries if _is_ours(int(e["pid"]), e["name"])]


def stop_recorded(directory: Path) -> int:
    """Stop every process a stack recorded in ``directory``; returns how many were alive."""
    path = directory / RECORD
    if not path.exists():
        return 0
    stopped = 0
    for entry in json.loads(path.read_text()):
        pid = int(entry["pid"])
        if not _is_ours(pid, entry["name"]):
            continue
        stopped += 1
        if entry["kind"] == "engine":
            shutdown_engine(entry["url"], pid, Path(entry["base_dir"]))
        else:
            stop_pid(pid)
    path.unlink()
    return stopped


def _is_ours(pid: int, name: str) -> bool:
    """Guard against PID reuse: the process must still be the one we started."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    markers = {
        "dockerd": "dockerd",
        "gpusim": "gpusim",
        "exporter": "exporter",
        "actuator": "actuator",
        "prometheus": "prometheus",
        "alertmanager": "alertmanager",
        "guard": " guard ",
        "placer": "placer",
    }
    return markers.get(name, name) in cmdline


def write_record(directory: Path, entries: list[dict[str, Any]]) -> None:
    tmp = directory / (RECORD + ".tmp")
    tmp.write_text(json.dumps(entries, indent=1))
    tmp.replace(directory / RECORD)
