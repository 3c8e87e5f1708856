"""Workloads that try to take the machine, for real: each runs as a job of team-a on the local
backend, started through the portal, against a live portal that a user of team-b goes on using.

- CPU: a job that asked for one core spins four busy processes; the kernel's own accounting of
  its processes' CPU time shows it gets about one core.
- Memory: a job that asked for 1 GB allocates past it again and again; the kernel kills it, and the
  portal says "killed: out of memory (limit 1 GiB)".
- Processes: a job forks until it is refused; it stops at ``PORTAL_WORKLOAD_PIDS_MAX``, keeps trying,
  is cancelled, and leaves no process and no cgroup behind.

During each, team-b's p95 latency listing its jobs stays within twice its idle value
(tests/security/pressure.py, with a small floor for a 2-core CI machine's noise). And where limits
cannot be applied, the portal starts no user code at all, unless the operator opted out.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from apps.workloads import host
from tests.converge import settle
from tests.personas import World, api_token
from tests.security.pressure import Bystander, assert_within_budget
from workers.backends import cgroups

CI = os.environ.get("CI") == "true"


@pytest.fixture(autouse=True)
def _root() -> None:
    """Creating cgroups (and, for the refusal, mounting) takes root: in CI its absence fails the
    tests rather than skipping them."""
    if os.geteuid() != 0:
        if CI:
            pytest.fail("the resource attack tests need root (deploy/test.sh runs them as root in CI)")
        pytest.skip("creating cgroups needs root")


@dataclass
class Arena:
    world: World
    bystander: Bystander
    jobs: list[Job]

    def submit(self, command: str, **fields: Any) -> Job:
        """A team-a job started at once on this machine (the worker runs in-process)."""
        job = check_submit_job(
            self.world.team_a, name="attack", command=command, acting_user=self.world.alice, gpu_type="h100",
            gpus_per_replica=Decimal("1"), **fields,
        )  # fmt: skip
        self.jobs.append(job)
        job.refresh_from_db()
        return job


@pytest.fixture
def arena(tx_world: World, live_server: Any, settings: Any, tmp_path: Path) -> Iterator[Arena]:
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    settings.PORTAL_RUN_DIR = tmp_path / "run"
    # team-b's own list of jobs: a query of the database, a serializer, the access layer.
    bystander = Bystander(live_server.url, "/api/v1/jobs/?workspace=team-b", api_token(tx_world.charlie))
    arena = Arena(tx_world, bystander, [])
    try:
        yield arena
    finally:
        # Stopped, and not started again: a job the portal stops goes back in line, and would be
        # admitted and started at once with the scheduler and the worker in-process.
        settings.PORTAL_SCHEDULER_TRIGGER = settings.PORTAL_WORKLOAD_TRIGGER = "off"
        host.stop_on_this_machine()


def log_of(job: Job) -> str:
    return host.logs("job", job)[0].decode(errors="replace")


def wait_until(check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
    return result


def _stat_fields(pid: str) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()  # after the command name, which may hold spaces


def group_cpu_s(pgid: int) -> tuple[float, int]:
    """CPU time (user and system) of the live processes of process group ``pgid``, from the kernel's
    per-process accounting in /proc (independent of any cgroup), and how many are busy (running)."""
    ticks, running = 0, 0
    for entry in os.listdir("/proc"):
        fields = _stat_fields(entry) if entry.isdigit() else None
        if fields is None or int(fields[2]) != pgid or fields[0] in ("Z", "X"):
            continue
        ticks += int(fields[11]) + int(fields[12])
        running += fields[0] == "R"
    return ticks / os.sysconf("SC_CLK_TCK"), running


def processes_of(job_dir: str) -> list[int]:
    """Every process on the machine whose environment names the job's directory (its HOME)."""
    marker = f"HOME={job_dir}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker in Path(f"/proc/{entry}/environ").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


# -- CPU ---------------------------------------------------------------------------------------

SPIN_FOUR = "for i in 1 2 3 4; do (while :; do :; done) & done; wait"


@pytest.mark.pressure
def test_a_job_spinning_four_processes_on_one_core_gets_one_core(arena: Arena) -> None:
    idle = arena.bystander.measure()
    job = arena.submit(SPIN_FOUR, cpu_cores=1)
    assert job.state == Job.State.RUNNING, job.failure_reason
    pgid = job.backend_state["replicas"][0]["pgid"]
    wait_until(lambda: group_cpu_s(pgid)[1] >= 1)  # spinning
    # The worst case: the scheduler favours the job over everything else on the machine (a nice
    # value the job itself could not take, for its processes and its session's autogroup), so that,
    # unlimited, it would take both cores however busy the machine is; its quota holds it to one.
    os.setpriority(os.PRIO_PGRP, pgid, -10)
    autogroup = Path(f"/proc/{pgid}/autogroup")
    if autogroup.exists():
        autogroup.write_text("-10")

    used_before, started = group_cpu_s(pgid)[0], time.monotonic()
    attacked = arena.bystander.measure()
    time.sleep(max(0.0, 3.0 - (time.monotonic() - started)))
    used = (group_cpu_s(pgid)[0] - used_before) / (time.monotonic() - started)

    # Four busy processes would take both of a 2-core machine's cores; the quota gives them one.
    assert used <= 1.1, f"the job used {used:.2f} cores"
    assert_within_budget(idle, attacked)


# -- memory ------------------------------------------------------------------------------------

# Allocates (and touches) 64 MiB at a time up to 2 GiB, twice the job's memory, then exits.
ALLOCATE = "chunks = [b'x' * (64 << 20) for _ in range(32)]"
# Two rounds, each killed by the kernel (the loop goes on), then a last one whose end is the job's.
MEMORY_HOG = 'for round in 1 2; do python3 -c "$ALLOCATE"; done; exec python3 -c "$ALLOCATE"'


@pytest.mark.pressure
def test_a_job_allocating_past_its_memory_is_killed_and_the_portal_says_out_of_memory(arena: Arena) -> None:
    idle = arena.bystander.measure()
    job = arena.submit(MEMORY_HOG, memory_gb=1, env={"ALLOCATE": ALLOCATE})
    assert job.state == Job.State.RUNNING, job.failure_reason
    wrapper = job.backend_state["replicas"][0]["pid"]
    attacking = threading.Event()
    attacking.set()

    def watch() -> None:  # the attack lasts as long as its wrapper
        while (fields := _stat_fields(str(wrapper))) is not None and fields[0] not in ("Z", "X"):
            time.sleep(0.02)
        attacking.clear()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    attacked = arena.bystander.measure_while(attacking)
    watcher.join(timeout=60)
    job = settle(job)

    assert (job.state, job.exit_code) == (Job.State.FAILED, 137), (job.state, job.failure_reason, log_of(job))
    assert job.failure_reason == "killed: out of memory (limit 1 GiB)"
    assert job.backend_state["cgroup"]["oom_kills"] >= 3  # each round, not only the last
    assert_within_budget(idle, attacked)


# -- processes ---------------------------------------------------------------------------------

# Forks children that sleep until a fork is refused (at most 500), says how many, then keeps
# trying for a minute: every fork fails while the limit holds.
FORK_BOMB = """
import os, time
def child():
    os.execv("/bin/sleep", ["sleep", "300"])
made, refused = 0, None
while made < 500:
    try:
        pid = os.fork()
    except OSError as exc:
        refused = exc.errno
        break
    if pid == 0:
        child()
    made += 1
print("FORKED", made, "REFUSED", refused, flush=True)
deadline = time.time() + 60
while time.time() < deadline:
    try:
        if os.fork() == 0:
            child()
    except OSError:
        time.sleep(0.001)
"""


@pytest.mark.pressure
def test_a_fork_bomb_stops_at_its_process_limit_and_leaves_nothing_once_cancelled(arena: Arena, settings: Any) -> None:
    settings.PORTAL_WORKLOAD_PIDS_MAX = 64
    idle = arena.bystander.measure()
    job = arena.submit(f"exec python3 -c {shlex.quote(FORK_BOMB)}")
    assert job.state == Job.State.RUNNING, job.failure_reason
    job_dir, cgroup = job.backend_state["job_dir"], job.backend_state["cgroup"]

    # A whole line: the log is read while the job writes it
    said = wait_until(
        lambda: [line for line in log_of(job).splitlines() if re.fullmatch(r"FORKED \d+ REFUSED \d+", line)]
    )
    attacked = arena.bystander.measure()  # while it keeps forking

    _, made, _, refused = said[0].split()
    assert int(made) < 64 and refused == "11", said  # EAGAIN: the job has all its processes
    assert_within_budget(idle, attacked)

    do_cancel_job(job, acting_user=arena.world.alice)  # stopped at once by the in-process worker
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED and job.backend_stopped
    assert processes_of(job_dir) == []
    assert not any(os.path.exists(path) for path in cgroups.Group.from_json(cgroup["group"]).dirs.values())


# -- where limits cannot be applied ------------------------------------------------------------


@pytest.fixture
def read_only_cgroups(tmp_path: Path) -> Iterator[Path]:
    """This machine's cgroup hierarchies, mounted again read-only under a directory of the test's
    own: a cgroup root the portal cannot write, as in a container whose /sys/fs/cgroup is read-only."""
    root, mounted = tmp_path / "cgroup", []
    unified = subprocess.run(["stat", "-f", "-c", "%T", "/sys/fs/cgroup"], capture_output=True, text=True).stdout
    pairs = [(Path("/sys/fs/cgroup"), root)] if unified.strip() == "cgroup2fs" else []
    pairs += [(Path("/sys/fs/cgroup", c), root / c) for c in ("memory", "cpu", "cpuacct", "pids") if not pairs]
    try:
        for source, target in pairs:
            if not source.is_dir():
                continue
            target.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
            mounted.append(target)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)
        yield root
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", str(target)], check=False)


def test_the_portal_starts_no_user_code_where_it_cannot_apply_limits_unless_opted_out(
    arena: Arena, settings: Any, read_only_cgroups: Path
) -> None:
    settings.PORTAL_CGROUP_ROOT = str(read_only_cgroups)

    refused = arena.submit("touch ran")

    assert refused.state == Job.State.FAILED
    assert "workloads cannot be held to their CPU, memory and process limits" in refused.failure_reason
    assert f"may not create cgroups in {read_only_cgroups}" in refused.failure_reason
    assert "PORTAL_RESOURCE_LIMITS=off" in refused.failure_reason
    assert not list((settings.PORTAL_WORK_DIR).rglob("ran"))
    warning = "Workloads have no resource limits:"
    page = Client()
    page.force_login(arena.world.alice)
    assert warning not in page.get("/w/team-a/").content.decode()

    settings.PORTAL_RESOURCE_LIMITS = "off"
    ran = settle(arena.submit("touch ran"))

    assert ran.state == Job.State.SUCCEEDED, ran.failure_reason
    assert ran.backend_state["cgroup"]["applied"] is False
    assert list((settings.PORTAL_WORK_DIR).rglob("ran"))
    shown = page.get("/w/team-a/").content.decode()
    assert warning in shown and "PORTAL_RESOURCE_LIMITS=cgroup" in shown


def test_the_deployment_check_names_a_portal_without_resource_limits(settings: Any) -> None:
    from apps.compute.checks import check_resource_limits

    assert check_resource_limits() == []
    settings.PORTAL_RESOURCE_LIMITS = "off"
    assert [message.id for message in check_resource_limits()] == ["gpuportal.W002"]
