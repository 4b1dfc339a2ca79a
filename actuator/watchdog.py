"""The lease that outlives a ``kill -9``: resume what a dead actuator left paused.

At start the actuator spawns ``python -m gpuguard.actuator.watchdog`` in a session of its own. The
watchdog blocks on a pidfd of the actuator until the actuator's process ends, however it
ends, then unpauses every container the journal says the actuator paused, writes the emptied
journal back, and exits. After a clean shutdown the journal is already empty and it just
exits. A journal rewritten by a newer actuator (another PID) is left to that actuator.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gpuguard import resources
from gpuguard.actuator.audit import AUDIT_FILE, AuditLog
from gpuguard.actuator.journal import JOURNAL_FILE, atomic_write_json, read_journal

WATCHDOG_PID_FILE = "watchdog.pid"


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: tells a process from a later one with the same PID."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def wait_for_exit(pid: int, start_ticks: int) -> None:
    """Return once the process (pid, start_ticks) no longer runs."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError, AttributeError):
        fd = None
    if proc_start_ticks(pid) != start_ticks:
        if fd is not None:
            os.close(fd)
        return  # already gone (or the PID is someone else's now)
    if fd is None:  # no pidfd (old kernel): poll
        while proc_start_ticks(pid) == start_ticks:
            time.sleep(0.2)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def resume_journalled(state_dir: Path, docker_host: str | None, owner_pid: int) -> int:
    """Unpause every container in the journal of ``owner_pid``; returns how many."""
    import docker
    import docker.errors

    path = state_dir / JOURNAL_FILE
    doc = read_journal(path)
    if not doc or doc.get("pid") != owner_pid or not doc.get("paused"):
        return 0
    audit = AuditLog(state_dir / AUDIT_FILE)
    api = (
        docker.APIClient(base_url=docker_host, timeout=10)
        if docker_host
        else docker.from_env(timeout=10).api
    )
    resumed = 0
    for cid in list(doc["paused"]):
        for attempt in range(20):
            try:
                if api.inspect_container(cid)["State"].get("Paused"):
                    api.unpause(cid)
                    resumed += 1
                    audit.write(
                        "watchdog_resume", container_id=cid, owner_pid=owner_pid, result="ok"
                    )
                break
            except docker.errors.NotFound:
                break
            except Exception as exc:  # keep trying: tenants are frozen
                if attempt == 19:
                    audit.write(
                        "watchdog_resume", container_id=cid, result="failed", detail=str(exc)
                    )
                time.sleep(0.5)
        doc["paused"].pop(cid, None)
        atomic_write_json(path, doc)
    audit.close()
    return resumed


def spawn(state_dir: Path, docker_host: str | None) -> subprocess.Popen[bytes]:
    """Start the watchdog for the calling process; its PID goes to ``watchdog.pid``."""
    me = os.getpid()
    ticks = proc_start_ticks(me)
    argv = [
        sys.executable,
        "-m",
        "gpuguard.actuator.watchdog",
        "--pid",
        str(me),
        "--start-ticks",
        str(ticks),
    ]
    argv += ["--state.dir", str(state_dir)]
    if docker_host:
        argv += ["--docker.host", docker_host]
    env = dict(os.environ)
    root = str(resources.IMPORT_ROOT)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    with open(state_dir / "watchdog.log", "ab") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=env,
        )  # fmt: skip
    (state_dir / WATCHDOG_PID_FILE).write_text(f"{proc.pid}\n")
    return proc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuguard.actuator.watchdog", description=__doc__)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--start-ticks", type=int, required=True)
    parser.add_argument("--state.dir", dest="state_dir", type=Path, required=True)
    parser.add_argument("--docker.host", dest="docker_host", default=None)
    args = parser.parse_args(argv)
    wait_for_exit(args.pid, args.start_ticks)
    resumed = resume_journalled(args.state_dir, args.docker_host, args.pid)
    if resumed:
        print(f"watchdog: actuator {args.pid} died; resumed {resumed} container(s)", flush=True)
    with contextlib.suppress(OSError):
        pidfile = args.state_dir / WATCHDOG_PID_FILE
        if pidfile.read_text().strip() == str(os.getpid()):
            pidfile.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
