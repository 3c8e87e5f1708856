"""Resource limits of local workloads (workers/backends/cgroups.py), for real: the kernel's cgroups.

This machine (like CI) runs as root with the cgroup v1 controllers mounted read-write under
/sys/fs/cgroup, so these tests hold real processes to real limits: a replica past its memory is
killed by the kernel, past its CPU quota throttled, past ``pids.max`` refused a fork. cgroup v2 has
no controllers here (they are bound to v1): what the portal writes for v2 is checked on a plain
directory laid out as a cgroup2 hierarchy, which shows the files and values but not the kernel's
enforcement of them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.backends.test_local import log_text, wait_exit, wait_for
from tests.personas import World
from tests.proxy import Proxy
from workers.backends import BackendError, JobSpec, cgroups
from workers.backends.local import _WRAPPER, LocalBackend

REPO = Path(__file__).resolve().parents[2]
CI = os.environ.get("CI") == "true"


@pytest.fixture(autouse=True)
def _root() -> None:
    """Creating cgroups takes root here: in CI, where the security properties must be checked, its
    absence fails the tests rather than skipping them."""
    if os.geteuid() != 0:
        if CI:
            pytest.fail("the cgroup tests need root (deploy/test.sh runs them as root in CI)")
        pytest.skip("creating cgroups needs root")


@pytest.fixture
def make_backend(tmp_path: Path) -> Iterator[Callable[..., LocalBackend]]:
    """Backends with this test's own run directory (so its own cgroups); what a failing test left
    running is stopped."""
    made: list[LocalBackend] = []

    def make(**settings: Any) -> LocalBackend:
        settings.setdefault("run_dir", str(tmp_path / "run"))
        backend = LocalBackend(teardown_grace_s=settings.pop("teardown_grace_s", 1.0), **settings)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        if backend.get_state():
            backend.stop(grace_s=0)


def spec(tmp_path: Path, command: str, **fields: Any) -> JobSpec:
    values: dict[str, Any] = {"key": "job-1", "workspace": "ws", "name": "test", "work_dir": str(tmp_path / "work")}
    values.update(fields)
    return JobSpec(command=command, **values)


def groups_of(state: dict[str, Any]) -> tuple[cgroups.Group, list[cgroups.Group]]:
    cgroup = state["cgroup"]
    return cgroups.Group.from_json(cgroup["group"]), [cgroups.Group.from_json(g) for g in cgroup["replicas"]]


# Each control file as cgroup v1 names it (in its controller's hierarchy) and as v2 does.
CONTROLS = {
    "memory limit": ("memory", "memory.limit_in_bytes", "memory.max"),
    "memory used": ("memory", "memory.usage_in_bytes", "memory.current"),
    "cpu quota": ("cpu", "cpu.cfs_quota_us", "cpu.max"),
    "pids": ("pids", "pids.max", "pids.max"),
}


def control(group: cgroups.Group, name: str) -> int:
    """A group's limit or usage, whichever cgroup version holds it (v2's ``cpu.max``: its quota)."""
    controller, v1_file, v2_file = CONTROLS[name]
    if group.version == 2:
        return int(Path(group.dirs["unified"], v2_file).read_text().split()[0])
    return int(Path(group.dirs[controller], v1_file).read_text())


def python(code: str) -> str:
    return f"python3 -c {shlex.quote(code)}"


# Allocates (and touches) 32 MiB at a time, up to 1 GiB, then says it did.
ALLOCATE = """
chunks = []
for _ in range(32):
    chunks.append(b"x" * (32 << 20))
print("ALLOCATED", flush=True)
"""

# Forks children that sleep until it can fork no more (or has 200), and says how many it made.
FORK_UNTIL_REFUSED = """
import os
made, refused = 0, None
while made < 200:
    try:
        pid = os.fork()
    except OSError as exc:
        refused = exc.errno
        break
    if pid == 0:
        os.execv("/bin/sleep", ["sleep", "60"])
    made += 1
print("FORKED", made, "REFUSED", refused, flush=True)
"""


def test_a_replica_past_its_memory_is_killed_by_the_kernel_and_the_portal_says_so(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend()
    backend.start(spec(tmp_path, python(ALLOCATE), memory_gb=0.25))

    status = wait_exit(backend)

    assert "ALLOCATED" not in log_text(backend)
    assert (status.exit_code, status.message) == (137, "killed: out of memory (limit 0.25 GiB)")
    assert backend.get_state()["cgroup"]["oom_kills"] >= 1
    group, _ = groups_of(backend.get_state())
    assert not any(os.path.exists(path) for path in group.dirs.values())  # removed with the workload


def test_a_replica_is_held_to_its_cpu_cores(make_backend: Callable[..., LocalBackend], tmp_path: Path) -> None:
    backend = make_backend()
    backend.start(spec(tmp_path, "for i in 1 2; do (while :; do :; done) & done; wait", cpu_cores=0.5))
    _, [leaf] = groups_of(backend.get_state())
    assert control(leaf, "cpu quota") == 50000
    wait_for(lambda: len(cgroups.members(leaf)) >= 4)  # bash, its two loops, the log's writer (and bubblewrap's)

    used_before, started = cgroups.cpu_usage_s(leaf), time.monotonic()
    time.sleep(2.0)
    used_after, elapsed = cgroups.cpu_usage_s(leaf), time.monotonic() - started

    assert used_before is not None and used_after is not None
    # Two busy loops would take two cores (this machine has two); the quota holds them to half of one.
    assert (used_after - used_before) / elapsed < 0.5 * 1.2


def test_a_replica_cannot_fork_past_its_processes(make_backend: Callable[..., LocalBackend], tmp_path: Path) -> None:
    backend = make_backend(pids_max=32)
    backend.start(spec(tmp_path, python(FORK_UNTIL_REFUSED)))

    # The whole line, not its first word: unbuffered output may reach the log a word at a time.
    made, refused = wait_for(lambda: re.search(r"FORKED (\d+) REFUSED (\S+)\n", log_text(backend))).groups()
    assert int(made) < 32 and refused == "11"  # EAGAIN: the group has its 32 processes
    _, [leaf] = groups_of(backend.get_state())
    assert control(leaf, "pids") == 32
    backend.stop(grace_s=0)


def test_a_process_that_left_its_process_group_does_not_outlive_the_workload(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    """Without a sandbox (its PID namespace ends every process in it), a process in a new session of
    its own escapes the group signal; its cgroup still holds it, and is emptied when the workload ends."""
    backend = make_backend(sandbox="off")
    backend.start(spec(tmp_path, "setsid sleep 300 & echo $! > escaped; wait"))
    escaped_file = Path(backend.get_state()["job_dir"], "escaped")
    wait_for(escaped_file.exists)
    escaped = int(wait_for(lambda: escaped_file.read_text().strip()))
    group, [leaf] = groups_of(backend.get_state())
    assert escaped in cgroups.members(leaf)

    backend.stop(grace_s=0)

    assert not Path(f"/proc/{escaped}").exists() or Path(f"/proc/{escaped}/stat").read_text().split()[2] == "Z"
    assert not any(os.path.exists(path) for path in group.dirs.values())


def test_sweeping_an_orphan_removes_its_group(make_backend: Callable[..., LocalBackend], tmp_path: Path) -> None:
    """A start its worker never recorded (it died first) is swept, its cgroup with it."""
    owner = str(tmp_path / "work")
    orphan = make_backend(owner=owner)
    orphan.start(spec(tmp_path, "sleep 300"))
    group, _ = groups_of(orphan.get_state())

    assert make_backend(owner=owner).sweep_orphans(owner) == ["job-1"]

    assert not any(os.path.exists(path) for path in group.dirs.values())


def test_an_instances_notebooks_run_in_its_group_under_its_limits(proxy: Proxy, tx_world: World, settings: Any) -> None:
    """Launched through the API, as people do: the notebook's server (a real Jupyter) runs in a leaf
    of its instance's group, bound by the instance's limits, and the kernel counts its memory as the
    instance's."""
    from apps.catalog.models import NotebookProfile
    from apps.compute.models import Instance, Notebook
    from apps.workloads import host

    NotebookProfile.objects.create(name="kernel-only", image="quay.io/jupyter/base-notebook", published=True)
    client = tx_world.client(tx_world.alice)
    try:
        body = {"workspace": "team-a", "name": "box", "profile": "cpu-small"}
        instance = Instance.objects.get(pk=client.post("/api/v1/instances/", body, format="json").json()["id"])
        body = {"workspace": "team-a", "name": "lab", "instance": instance.pk, "profile": "kernel-only"}
        notebook = Notebook.objects.get(pk=client.post("/api/v1/notebooks/", body, format="json").json()["id"])
        assert (instance.state, notebook.state) == (Instance.State.RUNNING, Notebook.State.READY), (
            instance.failure_reason or notebook.failure_reason
        )
        instance_group, [holder] = groups_of(instance.backend_state)
        leaf, [server] = groups_of(notebook.backend_state)

        assert holder == instance_group.child(cgroups.HOLDER)
        assert control(instance_group, "memory limit") == 8 << 30  # cpu-small's
        assert control(instance_group, "cpu quota") == 200000
        assert control(instance_group, "pids") == settings.PORTAL_WORKLOAD_PIDS_MAX
        assert leaf == server and leaf == instance_group.child(Path(leaf.directories()[0]).name)
        assert notebook.backend_state["cgroup"]["limits"] == instance.backend_state["cgroup"]["limits"]
        assert notebook.backend_state["replicas"][0]["pid"] in cgroups.members(leaf)
        used = control(leaf, "memory used")
        assert used > 0 and control(instance_group, "memory used") >= used

        assert client.delete(f"/api/v1/instances/{instance.pk}/").status_code in (200, 204)  # its notebook first
        assert not any(os.path.exists(path) for path in [*leaf.dirs.values(), *instance_group.dirs.values()])
    finally:
        settings.PORTAL_SCHEDULER_TRIGGER = settings.PORTAL_WORKLOAD_TRIGGER = "off"  # stopped, not started again
        host.stop_on_this_machine()


def test_it_refuses_to_start_where_limits_cannot_be_applied_unless_they_are_off(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    nowhere = tmp_path / "not-a-cgroup"
    nowhere.mkdir()
    refused = make_backend(cgroup_root=str(nowhere))
    with pytest.raises(BackendError) as refusal:
        refused.start(spec(tmp_path, "touch ran"))

    assert refusal.value.permanent
    assert "cannot be held to their CPU, memory and process limits" in refusal.value.message
    assert f"{nowhere} has neither a cgroup2 hierarchy" in refusal.value.message
    assert "PORTAL_RESOURCE_LIMITS=off" in refusal.value.message
    assert refused.get_state() == {} and not Path(tmp_path, "work", "job-1", "ran").exists()

    unlimited = make_backend(cgroup_root=str(nowhere), resource_limits="off")
    unlimited.start(spec(tmp_path, "touch ran"))
    assert wait_exit(unlimited).exit_code == 0 and Path(tmp_path, "work", "job-1", "ran").exists()
    assert unlimited.get_state()["cgroup"] == {
        "applied": False,
        "reason": "resource limits are off (PORTAL_RESOURCE_LIMITS=off)",
    }


# Run in a mount namespace of its own where every cgroup hierarchy is mounted read-only.
READ_ONLY_START = """
import json, sys
from workers.backends import BackendError, JobSpec
from workers.backends.local import LocalBackend
work = sys.argv[1]
try:
    job = JobSpec(key="job-1", workspace="ws", name="t", command="touch ran", work_dir=work)
    LocalBackend(run_dir=work + "/run").start(job)
    print(json.dumps({"started": True}))
except BackendError as exc:
    print(json.dumps({"started": False, "message": exc.message, "permanent": exc.permanent}))
"""


def test_it_refuses_to_start_where_the_cgroup_hierarchies_are_read_only(tmp_path: Path) -> None:
    remount = (
        'for m in /sys/fs/cgroup /sys/fs/cgroup/*; do mountpoint -q "$m" || continue; '
        'mount -o remount,bind,ro "$m" || exit 9; done; exec "$@"'
    )
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", remount, "sh",
         sys.executable, "-c", READ_ONLY_START, str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["started"] is False and outcome["permanent"] is True
    assert "may not create cgroups in /sys/fs/cgroup" in outcome["message"]
    assert "read-only" in outcome["message"] and not (tmp_path / "job-1" / "ran").exists()


def test_a_wrapper_that_cannot_join_its_group_runs_nothing(tmp_path: Path) -> None:
    exit_file, ran = tmp_path / "exit", tmp_path / "ran"
    missing = f"{tmp_path}/gone/cgroup.procs"
    result = subprocess.run(
        ["bash", "-c", _WRAPPER, "portal-job", str(exit_file), missing, "touch", str(ran)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 125 and exit_file.read_text().strip() == "125"
    assert f"could not join the cgroup {missing}: not started" in result.stderr
    assert not ran.exists()


def test_each_group_is_named_after_its_portal_and_workload(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    """Two portals on one machine (their own run directories) starting the same key never share a group."""
    first, second = make_backend(run_dir=str(tmp_path / "a")), make_backend(run_dir=str(tmp_path / "b"))
    first.start(spec(tmp_path, "sleep 30"))
    second.start(spec(tmp_path, "sleep 30", work_dir=str(tmp_path / "other")))

    group_a, _ = groups_of(first.get_state())
    group_b, _ = groups_of(second.get_state())
    assert set(group_a.directories()).isdisjoint(group_b.directories())
    for path in [*group_a.directories(), *group_b.directories()]:
        assert Path(path).parent.parent.name == cgroups.PARENT and Path(path).name.startswith("job-1-")


# -- what is written where ---------------------------------------------------------------------


def test_limits_are_written_as_each_cgroup_version_expects() -> None:
    limits = cgroups.Limits(cpu_cores=1.5, memory_gb=4, pids_max=100)

    assert cgroups.limit_files(2, limits) == {
        "unified": [
            ("cpu.max", "150000 100000"),
            ("memory.max", str(4 << 30)),
            ("memory.swap.max", "0"),
            ("pids.max", "100"),
        ]
    }
    assert cgroups.limit_files(1, limits) == {
        "memory": [
            ("memory.memsw.limit_in_bytes", "-1"),
            ("memory.limit_in_bytes", str(4 << 30)),
            ("memory.memsw.limit_in_bytes", str(4 << 30)),
        ],
        "cpu": [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "150000")],
        "pids": [("pids.max", "100")],
    }
    assert cgroups.Limits(0.001, 0.5).cpu_quota_us == 1000 and cgroups.Limits(1, 0.5).memory_text() == "0.5 GiB"


def v2_tree(root: Path, controllers: str = "cpuset cpu io memory hugetlb pids rdma misc") -> str:
    """A directory laid out as a cgroup2 mount's root, and the mountinfo line that mounts it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    return f"40 31 0:38 / {root} rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n"


def test_it_finds_a_cgroup2_hierarchy_with_the_controllers_and_writes_its_groups_there(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    mountinfo = v2_tree(root)

    hierarchy = cgroups.detect(str(root), "p1", mountinfo=mountinfo, own="0::/system.slice/gpuportal.service\n")

    assert hierarchy == cgroups.Hierarchy(2, cgroups.Group(2, {"unified": f"{root}/gpuportal/p1"}))
    Path(hierarchy.root.dirs["unified"]).mkdir(parents=True)
    workload, [leaf] = cgroups.instance_groups(hierarchy, "instance-1", cgroups.Limits(2, 1, 64))
    written = {path.name: path.read_text() for path in Path(workload.dirs["unified"]).iterdir() if path.is_file()}
    # memory.swap.max is only written where the kernel has it (swap accounting on): a plain
    # directory has none.
    assert written == {
        "cpu.max": "200000 100000",
        "memory.max": str(1 << 30),
        "pids.max": "64",
        "cgroup.subtree_control": "+memory +cpu +pids",
    }
    assert leaf.procs_files() == [f"{root}/gpuportal/p1/instance-1/holder/cgroup.procs"]


def test_it_says_what_a_cgroup2_hierarchy_lacks(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    mountinfo = v2_tree(root, controllers="cpu io memory")

    with pytest.raises(cgroups.Unavailable, match=f"the cgroup2 hierarchy at {root} has no pids controller"):
        cgroups.detect(str(root), "p1", mountinfo=mountinfo, own="0::/\n")


def test_it_finds_this_machines_hierarchies() -> None:
    """On v1 (this machine, CI): inside the portal's own cgroup of each controller's hierarchy; on v2,
    at the root of the hierarchy, which root may write."""
    hierarchy = cgroups.detect("/sys/fs/cgroup", "p1")
    own = cgroups.parse_own_cgroups(Path("/proc/self/cgroup").read_text())

    if hierarchy.version == 2:
        assert hierarchy.root.dirs == {"unified": "/sys/fs/cgroup/gpuportal/p1"}
        return
    assert set(hierarchy.root.dirs) >= {"memory", "cpu", "pids"}
    for controller, path in hierarchy.root.dirs.items():
        base = os.path.normpath(f"/sys/fs/cgroup/{controller}/{own[controller]}")
        assert path == f"{base}/gpuportal/p1"


def test_a_bind_mounted_subtree_is_found_from_the_portals_own_cgroup() -> None:
    """A container's view: its cgroup's subtree mounted at the mount point (mountinfo's root field)."""
    mountinfo = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    mount = cgroups.parse_mountinfo(mountinfo)[0]
    assert cgroups._inside(mount, "/docker/abc/worker") == "/sys/fs/cgroup/memory/worker"
    assert cgroups._inside(mount, "/elsewhere") == "/sys/fs/cgroup/memory"
    assert cgroups.parse_own_cgroups("3:cpu,cpuacct:/a\n0::/b\n") == {"cpu": "/a", "cpuacct": "/a", "unified": "/b"}
