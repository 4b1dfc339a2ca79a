"""The cgroup freezer's pure parsing, and its file work on fake sysfs/procfs trees.

cgroup v2 is tested only here, on fake trees (``tests/fixtures/freezer/sysfs_v2``): the
development machines are cgroup v1, where the integration tests freeze real containers.
The fake trees are copied per test; a write to ``freezer.state`` or ``cgroup.freeze``
changes the file as the kernel would, but nothing freezes, so the test plays the kernel
(``cgroup.events``) where it must. The hand-over's order is checked on a real child process.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.actuator.engine.cgroupfs import (
    ProcCgroup,
    container_cgroup,
    outside_namespace,
    parse_proc_cgroup,
)
from gpuguard.actuator.engine.freezer import (
    FREEZING,
    FROZEN,
    THAWED,
    Cgroup,
    CgroupGone,
    ContainerFreezer,
    FreezerError,
    locate,
    process_state,
    stop_pending,
    v1_state,
    v2_state,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
V1_DIR = f"fs/cgroup/freezer/docker/{ID}"
V2_DIR = f"fs/cgroup/system.slice/docker-{ID}.scope"


def proc_text(name: str) -> str:
    """A ``/proc/<pid>/cgroup`` fixture: the freezer's own, else the exporter's."""
    own = FIXTURES / "freezer" / name
    return (own if own.exists() else FIXTURES / "cgroup" / name).read_text()


@pytest.fixture
def sysfs_v1(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "freezer" / "sysfs_v1", tmp_path / "sys"))


@pytest.fixture
def sysfs_v2(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "freezer" / "sysfs_v2", tmp_path / "sys"))


# --- pure parsing ----------------------------------------------------------------------


def test_a_v1_docker_process_names_its_freezer_and_unified_paths() -> None:
    parsed = parse_proc_cgroup(proc_text("proc_v1_docker.txt"))
    assert parsed == ProcCgroup("freezer", f"/docker/{ID}", f"/docker/{ID}")


def test_a_freezer_sharing_a_mount_keeps_the_mount_name() -> None:
    parsed = parse_proc_cgroup(proc_text("proc_v1_systemd_driver.txt"))
    assert parsed.v1_controllers == "freezer,devices"
    assert parsed.v1_path == f"/system.slice/docker-{ID}.scope"


def test_a_v2_process_has_only_a_unified_path() -> None:
    parsed = parse_proc_cgroup(proc_text("v2_docker_scope_nested.txt"))
    assert parsed == ProcCgroup(None, None, f"/system.slice/docker-{ID}.scope/init")


def test_malformed_lines_are_skipped() -> None:
    assert parse_proc_cgroup("garbage\n\n7:freezer\n") == ProcCgroup(None, None, None)


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("v1_docker.txt", f"/docker/{ID}"),
        ("v2_docker_scope.txt", f"/system.slice/docker-{ID}.scope"),
        ("v2_docker_scope_nested.txt", f"/system.slice/docker-{ID}.scope"),  # not /init
        ("kubepods_cri_containerd.txt", None),  # checked below: a path, compared whole
        ("podman_libpod.txt", f"/machine.slice/libpod-{ID}.scope"),
        ("docker_in_docker.txt", None),  # checked below
    ],
)
def test_the_containers_own_cgroup_in_each_path_form(fixture: str, expected: str | None) -> None:
    line = next(line for line in proc_text(fixture).splitlines() if ID in line)
    path = line.split(":", 2)[2]
    if expected is None:
        expected = path  # the container's cgroup is the whole path
    assert container_cgroup(path, ID) == expected


def test_nested_docker_resolves_each_container_to_its_own_cgroup() -> None:
    path = proc_text("docker_in_docker.txt").split(":", 2)[2].strip()
    assert container_cgroup(path, ID) == path  # the inner container
    assert container_cgroup(path, OTHER) == f"/docker/{OTHER}"  # the outer one: all of it


@pytest.mark.parametrize(
    "path",
    [
        f"/docker/{OTHER}",  # a reused PID now in another container
        "/user.slice/user-0.slice/session-1.scope",  # a host process
        f"/../../system.slice/docker-{ID}.scope",  # seen from another cgroup namespace
        "/",
        f"/docker/{ID}x",
        f"/docker/libpod-conmon-x{ID}.scope",  # not a separate component
    ],
)
def test_no_cgroup_that_is_not_the_containers_own(path: str) -> None:
    assert container_cgroup(path, ID) is None


def test_only_a_full_container_id_is_looked_for() -> None:
    assert container_cgroup(f"/docker/{ID}", ID[:12]) is None


@pytest.mark.parametrize(
    ("text", "state"), [("THAWED\n", THAWED), ("FREEZING\n", FREEZING), ("FROZEN\n", FROZEN)]
)
def test_v1_states(text: str, state: str) -> None:
    assert v1_state(text) == state


def test_an_unknown_v1_state_is_an_error() -> None:
    with pytest.raises(FreezerError, match=r"unknown freezer\.state"):
        v1_state("MELTING\n")


@pytest.mark.parametrize(
    ("freeze", "events", "state"),
    [
        ("0\n", "populated 1\nfrozen 0\n", THAWED),
        ("1\n", "populated 1\nfrozen 0\n", FREEZING),
        ("1\n", "populated 1\nfrozen 1\n", FROZEN),
        ("0\n", "populated 1\nfrozen 1\n", FROZEN),  # an ancestor froze it: nothing runs
        ("0\n", "populated 0\n", THAWED),  # a kernel without the frozen key
    ],
)
def test_v2_states(freeze: str, events: str, state: str) -> None:
    assert v2_state(freeze, events) == state


def test_a_queued_sigstop_shows_in_the_process_or_thread_mask() -> None:
    sigstop = f"{1 << (signal.SIGSTOP - 1):016x}"
    base = "Name:\tpython3\nState:\tD (disk sleep)\nSigPnd:\t0000000000000000\n"
    assert not stop_pending(base + "ShdPnd:\t0000000000000000\n")
    assert stop_pending(base + f"ShdPnd:\t{sigstop}\n")
    assert stop_pending(base.replace("0000000000000000", sigstop) + "ShdPnd:\t0\n")
    assert not stop_pending(base + "ShdPnd:\t0000000000020000\n")  # SIGCHLD only


def test_process_state_reads_past_a_comm_holding_parentheses() -> None:
    assert process_state("4242 (a) b (c)) T 1 4242 4242 0 -1") == "T"
    assert process_state("1 (sleep) S 0 1 1 0 -1") == "S"
    with pytest.raises(ValueError):
        process_state("garbage")


# --- locating a cgroup on fake trees ---------------------------------------------------


def test_locate_v1(sysfs_v1: Path) -> None:
    found = locate(parse_proc_cgroup(proc_text("proc_v1_docker.txt")), ID, sysfs_v1 / "fs/cgroup")
    assert found == Cgroup(1, sysfs_v1 / V1_DIR)


def test_locate_v1_prefers_the_freezer_on_a_hybrid_host(sysfs_v1: Path) -> None:
    # The unified tree (systemd's, at fs/cgroup/unified) holds the container too; runtimes
    # freeze through the v1 freezer there, and so must we.
    proc = ProcCgroup("freezer", f"/docker/{ID}", f"/docker/{ID}")
    assert locate(proc, ID, sysfs_v1 / "fs/cgroup") == Cgroup(1, sysfs_v1 / V1_DIR)


def test_locate_v1_under_a_shared_mount(sysfs_v1: Path) -> None:
    proc = parse_proc_cgroup(proc_text("proc_v1_systemd_driver.txt"))
    found = locate(proc, ID, sysfs_v1 / "fs/cgroup")
    assert found is not None and found.version == 1
    assert found.path.parent.parent.name == "freezer,devices"


def test_locate_v2_takes_the_containers_cgroup_above_its_init(sysfs_v2: Path) -> None:
    proc = parse_proc_cgroup(proc_text("v2_docker_scope_nested.txt"))
    assert locate(proc, ID, sysfs_v2 / "fs/cgroup") == Cgroup(2, sysfs_v2 / V2_DIR)


def test_locate_v2_kubernetes(sysfs_v2: Path) -> None:
    found = locate(
        parse_proc_cgroup(proc_text("kubepods_cri_containerd.txt")), ID, sysfs_v2 / "fs/cgroup"
    )
    assert found is not None and found.path.name == f"cri-containerd-{ID}.scope"


def test_locate_finds_nothing_for_another_container_or_a_missing_tree(
    sysfs_v2: Path, tmp_path: Path
) -> None:
    proc = parse_proc_cgroup(proc_text("v2_docker_scope.txt"))
    assert locate(proc, OTHER, sysfs_v2 / "fs/cgroup") is None
    assert locate(proc, ID, tmp_path / "nowhere") is None


# --- freezing and thawing on fake trees -------------------------------------------------


def test_v1_freeze_and_thaw_write_the_freezer_state(sysfs_v1: Path) -> None:
    cgroup = Cgroup(1, sysfs_v1 / V1_DIR)
    assert cgroup.state() == THAWED
    cgroup.freeze()
    assert (cgroup.path / "freezer.state").read_text() == "FROZEN"
    assert cgroup.state() == FROZEN
    assert cgroup.wait_frozen() < 0.5
    cgroup.thaw()
    assert cgroup.state() == THAWED


def test_v2_freeze_is_done_when_the_kernel_says_frozen(sysfs_v2: Path) -> None:
    cgroup = Cgroup(2, sysfs_v2 / V2_DIR)
    cgroup.freeze()
    assert (cgroup.path / "cgroup.freeze").read_text() == "1"
    assert cgroup.state() == FREEZING
    with pytest.raises(FreezerError, match="not frozen after"):
        cgroup.wait_frozen(timeout_s=0.02)
    (cgroup.path / "cgroup.events").write_text("populated 1\nfrozen 1\n")  # the kernel's part
    assert cgroup.state() == FROZEN
    cgroup.thaw()
    assert (cgroup.path / "cgroup.freeze").read_text() == "0"


def test_pids_cover_the_cgroups_below(sysfs_v2: Path) -> None:
    assert sorted(Cgroup(2, sysfs_v2 / V2_DIR).pids()) == [4242, 4243]


def test_a_removed_cgroup_is_gone_not_a_failure(sysfs_v1: Path) -> None:
    cgroup = Cgroup(1, sysfs_v1 / V1_DIR)
    shutil.rmtree(cgroup.path)
    for operation in (cgroup.state, cgroup.freeze, cgroup.thaw, cgroup.pids):
        with pytest.raises(CgroupGone):
            operation()


# --- ContainerFreezer on fake procfs and sysfs -------------------------------------------


def fake_procfs(root: Path, pid: int, text: str) -> Path:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(text)
    return root


def test_the_cgroup_of_a_container_from_its_init_pid(sysfs_v2: Path, tmp_path: Path) -> None:
    procfs = fake_procfs(tmp_path / "proc", 4242, proc_text("v2_docker_scope_nested.txt"))
    freezer = ContainerFreezer(procfs, sysfs_v2)
    assert freezer.cgroup(ID, 4242) == Cgroup(2, sysfs_v2 / V2_DIR)
    with pytest.raises(CgroupGone):
        freezer.cgroup(ID, 4343)  # no such process: the container stopped
    with pytest.raises(FreezerError, match="has no process"):
        freezer.cgroup(ID, 0)  # Docker's Pid of a container that is not running
    with pytest.raises(FreezerError, match="no freezable cgroup"):
        freezer.cgroup(OTHER, 4242)  # the PID is someone else's now


def test_handover_refuses_processes_it_cannot_see(sysfs_v1: Path, tmp_path: Path) -> None:
    # cgroup.procs lists 0 for a process outside the reader's PID namespace: signalling
    # "0" would hit our own process group, so nothing is signalled and nothing thawed.
    cgroup = Cgroup(1, sysfs_v1 / V1_DIR)
    cgroup.freeze()
    (cgroup.path / "cgroup.procs").write_text("0\n0\n")
    called = []
    with pytest.raises(FreezerError, match="not visible"):
        ContainerFreezer(tmp_path, sysfs_v1).handover(cgroup, lambda: called.append(1))
    assert called == [] and cgroup.state() == FROZEN


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A real process to stop and continue (the fake cgroup lists it)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def state_of(pid: int) -> str:
    return process_state(Path(f"/proc/{pid}/stat").read_text())


def wait_state(pid: int, wanted: str) -> str:
    deadline = time.monotonic() + 5
    while state_of(pid) != wanted and time.monotonic() < deadline:
        time.sleep(0.005)
    return state_of(pid)


def test_handover_stops_thaws_lets_the_runtime_pause_then_continues(
    sysfs_v1: Path, child: subprocess.Popen[bytes]
) -> None:
    cgroup = Cgroup(1, sysfs_v1 / V1_DIR)
    (cgroup.path / "cgroup.procs").write_text(f"{child.pid}\n")
    cgroup.freeze()
    seen = []

    def runtime_pause() -> None:  # what runc must find: thawed, and every process stopped
        seen.append((cgroup.state(), wait_state(child.pid, "T")))
        (cgroup.path / "freezer.state").write_text("FROZEN\n")  # runc freezes it

    ContainerFreezer(Path("/proc"), sysfs_v1).handover(cgroup, runtime_pause)
    assert seen == [(THAWED, "T")]
    assert wait_state(child.pid, "S") == "S"  # continued (the runtime's freeze holds it)
    assert cgroup.state() == FROZEN


def test_a_failed_runtime_pause_refreezes_before_continuing(
    sysfs_v1: Path, child: subprocess.Popen[bytes]
) -> None:
    cgroup = Cgroup(1, sysfs_v1 / V1_DIR)
    (cgroup.path / "cgroup.procs").write_text(f"{child.pid}\n")
    cgroup.freeze()

    def runtime_pause() -> None:
        raise RuntimeError("runc: container not running")

    with pytest.raises(RuntimeError, match="not running"):
        ContainerFreezer(Path("/proc"), sysfs_v1).handover(cgroup, runtime_pause)
    assert cgroup.state() == FROZEN  # still held: through the cgroup again
    assert wait_state(child.pid, "S") == "S"  # and not left stopped


def test_ensure_running_thaws_and_continues_a_stopped_process(
    sysfs_v1: Path, child: subprocess.Popen[bytes]
) -> None:
    cgroup = Cgroup(1, sysfs_v1 / V1_DIR)
    (cgroup.path / "cgroup.procs").write_text(f"{child.pid}\n")
    freezer = ContainerFreezer(Path("/proc"), sysfs_v1)
    assert not freezer.held(cgroup)
    assert freezer.ensure_running(cgroup) is False  # nothing to do
    cgroup.freeze()
    child.send_signal(signal.SIGSTOP)  # what a crash inside a hand-over leaves
    assert wait_state(child.pid, "T") == "T"
    assert freezer.held(cgroup)
    assert freezer.ensure_running(cgroup) is True
    assert cgroup.state() == THAWED
    assert wait_state(child.pid, "S") == "S"
    child.send_signal(signal.SIGSTOP)  # thawed, but a process left stopped: held still
    assert wait_state(child.pid, "T") == "T"
    assert freezer.held(cgroup)
    assert freezer.ensure_running(cgroup) is True
    assert wait_state(child.pid, "S") == "S"


def test_a_stop_queued_but_not_yet_taken_counts_as_held(sysfs_v1: Path, tmp_path: Path) -> None:
    # Between a hand-over's thaw and the runtime's freeze, a process the scheduler has not
    # run yet shows its SIGSTOP pending, not taken: it is held all the same (a reconcile
    # that judged it running forgot a container being paused, which then stayed paused).
    procfs = tmp_path / "proc"
    (procfs / "4242").mkdir(parents=True)
    (procfs / "4242" / "stat").write_text("4242 (python3) S 1 4242 4242 0 -1 4194560\n")
    status = procfs / "4242" / "status"
    status.write_text("Name:\tpython3\nState:\tS (sleeping)\nShdPnd:\t0000000000000000\n")
    cgroup = Cgroup(1, sysfs_v1 / V1_DIR)
    (cgroup.path / "cgroup.procs").write_text("4242\n")
    freezer = ContainerFreezer(procfs, sysfs_v1)
    assert cgroup.state() == THAWED and not freezer.held(cgroup)
    status.write_text("Name:\tpython3\nState:\tS (sleeping)\nShdPnd:\t0000000000040000\n")
    assert freezer.held(cgroup)


# --- a reader in a cgroup namespace of its own (containerd's CRI on cgroup v2) -----------

POD = "kubepods-besteffort-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice"


def test_a_path_that_climbs_out_of_the_readers_namespace_keeps_what_follows() -> None:
    rest = f"kubepods-besteffort.slice/{POD}/cri-containerd-{ID}.scope"
    assert outside_namespace(f"/../../{rest}") == rest
    assert outside_namespace(f"/../{rest}") == rest
    assert outside_namespace(f"/kubepods.slice/{rest}") is None  # does not climb
    assert outside_namespace("/../..") is None  # nothing below the ancestor
    assert outside_namespace(f"/../a/../{rest}") is None  # climbs again after going down
    assert outside_namespace("../a") is None  # not absolute


def kubepods_v2(root: Path, *containers: str) -> Path:
    """A cgroup v2 tree as the systemd driver makes it, with ``containers`` in one pod."""
    pod = root / "fs/cgroup/kubepods.slice/kubepods-besteffort.slice" / POD
    for cid in containers:
        scope = pod / f"cri-containerd-{cid}.scope"
        scope.mkdir(parents=True)
        (scope / "cgroup.freeze").write_text("0\n")
        (scope / "cgroup.events").write_text("populated 1\nfrozen 0\n")
        (scope / "cgroup.procs").write_text("")
    (root / "fs/cgroup/system.slice/containerd.service").mkdir(parents=True)
    return pod


def test_a_tenant_read_from_inside_a_cgroup_namespace_is_found_in_the_hosts_tree(
    tmp_path: Path,
) -> None:
    # The actuator in a pod of its own: the tenant's path climbs out of its namespace.
    pod = kubepods_v2(tmp_path, ID, ID.replace("0", "f"))
    text = f"0::/../../kubepods-besteffort.slice/{POD}/cri-containerd-{ID}.scope\n"
    found = locate(parse_proc_cgroup(text), ID, tmp_path / "fs/cgroup")
    assert found == Cgroup(2, pod / f"cri-containerd-{ID}.scope")
    # A container id that names no cgroup there, or a path naming another container: none.
    other = "9" * 64
    assert locate(parse_proc_cgroup(text), other, tmp_path / "fs/cgroup") is None


def test_a_climbing_path_that_matches_twice_is_refused(tmp_path: Path) -> None:
    kubepods_v2(tmp_path, ID)
    twin = tmp_path / "fs/cgroup/elsewhere.slice/kubepods-besteffort.slice" / POD
    (twin / f"cri-containerd-{ID}.scope").mkdir(parents=True)
    (twin / f"cri-containerd-{ID}.scope" / "cgroup.freeze").write_text("0\n")
    text = f"0::/../kubepods-besteffort.slice/{POD}/cri-containerd-{ID}.scope\n"
    assert locate(parse_proc_cgroup(text), ID, tmp_path / "fs/cgroup") is None
