"""A GPU provisioning request on Slurm is a real Slurm reservation: made on the nodes the portal's
inventory names (Slurm's own node names), for a workspace's Slurm account; that account's jobs run in
it through the backend's own submit path, every other job keeps off its nodes until it is released.

The tests run as root, as the portal does where it submits as each workspace's Unix account (the
account a reservation names only exists then).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from apps.inventory.models import Cluster, Node
from workers.backends.base import BackendError, InstanceSpec, JobSpec, RunAs
from workers.backends.slurm import SlurmBackend
from workers.backends.slurm_reservations import (
    create_reservation,
    delete_reservation,
    list_reservations,
    reservation_name,
    reservation_nodes,
    show_reservation,
    update_reservation,
)

pytestmark = pytest.mark.slow  # real Slurm jobs: run first (tests/conftest.py)

#: The workspace account whose jobs run in the reservations, made as apps/workspaces/unix.py makes them.
ACCOUNT = ("gpw-slurmres", 200_615)
WORKSPACE = "team-res"
#: GPR ids of these tests: far above any a test database hands out, so the names are these tests' alone.
GPR_IDS = (990_001, 990_002, 990_003, 990_004)
SLURM_TIME = "%Y-%m-%dT%H:%M:%S"


def squeue_line(job_id: str) -> list[str]:
    """State, node list and reason of a job ([] once it has left the queue)."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%N|%r"], capture_output=True, text=True, timeout=15)
    return out.stdout.strip().split("|") if out.stdout.strip() else []


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g}s"
        time.sleep(0.25)


def local(text: str) -> datetime:
    return datetime.strptime(text, SLURM_TIME).astimezone()


@pytest.fixture(scope="module")
def account() -> RunAs:
    """The workspace's own Unix account, as the portal makes it when it runs as root."""
    if os.geteuid() != 0:
        pytest.skip("a workspace's Slurm account (which a reservation names) is made only where the portal is root")
    name, uid = ACCOUNT
    with contextlib.suppress(KeyError):
        entry = pwd.getpwnam(name)
        return RunAs(name, entry.pw_uid, entry.pw_gid)
    for argv in (
        ["groupadd", "--gid", str(uid), name],
        [
            "useradd",
            "--uid",
            str(uid),
            "--gid",
            str(uid),
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ],
    ):
        subprocess.run(argv, capture_output=True, check=False, timeout=30)
    entry = pwd.getpwnam(name)
    return RunAs(name, entry.pw_uid, entry.pw_gid)


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    """A work directory the workspace's account can reach, as a cluster's shared filesystem is."""
    work = Path(tempfile.mkdtemp(prefix="gpuportal-slurmres-")) / "work"
    work.parent.chmod(0o711)
    work.mkdir(mode=0o711)
    yield work
    SlurmBackend().sweep_orphans(str(work))
    shutil.rmtree(work.parent, ignore_errors=True)


@pytest.fixture
def backend(work: Path, account: RunAs) -> SlurmBackend:
    """The backend as the worker makes it; the workspace's Slurm account exists, as after its first job."""
    made = SlurmBackend(owner=str(work), start_timeout_s=60)
    assert made.ensure_account(WORKSPACE, account) == WORKSPACE
    return made


@pytest.fixture
def names() -> Iterator[list[str]]:
    """The tests' reservation names, none left from an earlier run; every one is deleted afterwards."""
    made = [reservation_name(gpr_id) for gpr_id in GPR_IDS]
    for name in made:
        delete_reservation(name)
    yield made
    for name in made:
        with contextlib.suppress(BackendError):
            delete_reservation(name)


@pytest.fixture
def others() -> Iterator[list[str]]:
    """Job ids of jobs of another account (root's) that a test submitted; cancelled afterwards."""
    submitted: list[str] = []
    yield submitted
    if submitted:
        subprocess.run(["scancel", *submitted], capture_output=True, timeout=15)


@pytest.fixture
def node(slurm: Cluster) -> str:
    """A node of the cluster as the portal's inventory knows it (registered from what Slurm reports)."""
    known = [str(name) for name in Node.objects.filter(pool__cluster=slurm).values_list("name", flat=True)]
    sinfo = subprocess.run(["sinfo", "-h", "-N", "-p", "gpu", "-o", "%N"], capture_output=True, text=True, timeout=15)
    assert sorted(known) == sorted(set(sinfo.stdout.split())) == ["node1", "node2", "node3", "node4"]
    return max(known)


def submit_other(others: list[str], *args: str, command: str = "sleep 1") -> str:
    """A one-GPU batch job of root's own account (not the workspace's)."""
    argv = ["sbatch", "--parsable", "-p", "gpu", "--gres=gpu:1", "-o", "/dev/null", *args, "--wrap", command]
    job_id = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=True).stdout.strip().split(";")[0]
    others.append(job_id)
    return job_id


def job_spec(work: Path, account: RunAs, key: str, reservation: str) -> JobSpec:
    return JobSpec(
        key=key,
        workspace=WORKSPACE,
        name=key,
        command='echo "on $SLURMD_NODENAME"; sleep 300',
        work_dir=str(work / WORKSPACE),
        devices=[["0"]],
        run_as=account,
        reservation=reservation,
    )


def test_it_reserves_the_inventorys_nodes_for_the_workspaces_account(
    backend: SlurmBackend, names: list[str], node: str
) -> None:
    name = names[0]
    start, end = datetime.now(UTC) - timedelta(minutes=1), datetime.now(UTC) + timedelta(minutes=10)

    shown = create_reservation(name, account=WORKSPACE, nodes=[node], start=start, end=end)

    assert name == "gpuportal-gpr-990001"
    assert shown == show_reservation(name)
    fields = ("ReservationName", "Nodes", "Accounts", "State")
    assert [shown[field] for field in fields] == [name, node, WORKSPACE, "ACTIVE"]
    assert "IGNORE_JOBS" in shown["Flags"].split(",")
    assert local(shown["StartTime"]) <= datetime.now(UTC)  # a start in the past: now
    assert abs(local(shown["EndTime"]) - end) < timedelta(seconds=1)
    assert [r["ReservationName"] for r in list_reservations()].count(name) == 1

    # Made again (a reconcile that did not see it): updated to what is asked, not a second one.
    later = end + timedelta(minutes=5)
    again = create_reservation(name, account=WORKSPACE, nodes=["node3", node], start=start, end=later)

    assert abs(local(again["EndTime"]) - later) < timedelta(seconds=1)
    assert reservation_nodes(again) == ["node3", node]
    assert [r["ReservationName"] for r in list_reservations()].count(name) == 1


def test_a_reservation_that_starts_later_waits_and_can_be_moved(
    backend: SlurmBackend, account: RunAs, names: list[str]
) -> None:
    name = names[1]
    start = (datetime.now(UTC) + timedelta(hours=6)).replace(microsecond=0)
    end = start + timedelta(hours=2)

    shown = create_reservation(name, account=WORKSPACE, nodes=["node2"], start=start, end=end, users=[account.user])

    assert (shown["State"], shown["Accounts"], shown["Users"]) == ("INACTIVE", WORKSPACE, account.user)
    assert (local(shown["StartTime"]), local(shown["EndTime"])) == (start, end)
    moved = update_reservation(name, start=start + timedelta(hours=1), end=end + timedelta(hours=3))
    assert (local(moved["StartTime"]), local(moved["EndTime"])) == (
        start + timedelta(hours=1),
        end + timedelta(hours=3),
    )
    again = create_reservation(name, account=WORKSPACE, nodes=["node2"], start=start, end=end)
    assert (local(again["StartTime"]), local(again["EndTime"])) == (start, end)


def test_its_accounts_job_runs_on_its_node_and_other_jobs_wait_until_it_is_released(
    backend: SlurmBackend, work: Path, account: RunAs, names: list[str], others: list[str], node: str
) -> None:
    name = names[2]
    create_reservation(
        name, account=WORKSPACE, nodes=[node], start=datetime.now(UTC), end=datetime.now(UTC) + timedelta(minutes=10)
    )

    backend.start_job(job_spec(work, account, "in-reservation", name))

    state = backend.get_state()
    assert state["nodes"] == [node]
    assert squeue_line(state["job_id"])[:2] == ["RUNNING", node]
    pinned = submit_other(others, f"--nodelist={node}")
    anywhere = [submit_other(others, "--gres=gpu:4", command="sleep 60") for _ in range(3)]  # a whole node each
    time.sleep(2)  # a scheduling pass or two (bf_interval=5, batch_sched_delay=0)
    pinned_state, _, reason = squeue_line(pinned)
    assert pinned_state == "PENDING" and ("ReqNodeNotAvail" in reason or "Reservation" in reason), reason
    placed = [squeue_line(job_id) for job_id in anywhere]
    assert all(line[0] == "PENDING" or line[1] not in ("", node) for line in placed), placed  # elsewhere, or waits
    subprocess.run(["scancel", *anywhere], capture_output=True, timeout=15, check=True)

    extended = update_reservation(name, end=datetime.now(UTC) + timedelta(minutes=30))
    assert local(extended["EndTime"]) > datetime.now(UTC) + timedelta(minutes=29)
    assert squeue_line(pinned)[0] == "PENDING"

    # Released early while the job runs in it: Slurm ends that job as at the reservation's end.
    delete_reservation(name)
    wait_for(lambda: backend.poll().state == "exited", "the job in the released reservation ended")
    wait_for(lambda: show_reservation(name) is None, "the released reservation is gone")
    wait_for(lambda: not squeue_line(pinned) or squeue_line(pinned)[0] != "PENDING", "the other job started")
    ran = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", pinned, "-o", "NodeList"], capture_output=True, text=True, timeout=15
    ).stdout.split()
    assert ran == [node] or squeue_line(pinned)[1] == node
    delete_reservation(name)  # twice: nothing to do


def test_bad_requests_are_refused_with_slurms_reason(
    backend: SlurmBackend, work: Path, account: RunAs, names: list[str]
) -> None:
    name = names[3]
    now = datetime.now(UTC)
    asked = {"account": WORKSPACE, "start": now, "end": now + timedelta(minutes=10)}

    with pytest.raises(BackendError) as unknown_node:
        create_reservation(name, nodes=["node99"], **asked)  # type: ignore[arg-type]
    with pytest.raises(BackendError) as backwards:
        create_reservation(
            name, nodes=["node1"], account=WORKSPACE, start=now + timedelta(hours=2), end=now + timedelta(hours=1)
        )
    with pytest.raises(BackendError) as unknown_account:
        create_reservation(name, nodes=["node1"], account="no-such-account", start=now, end=asked["end"])  # type: ignore[arg-type]
    with pytest.raises(BackendError) as missing:
        update_reservation(name, end=now + timedelta(hours=1))
    with pytest.raises(BackendError) as not_there:
        backend.start_job(job_spec(work, account, "no-reservation", name))
    with pytest.raises(BackendError) as instance_not_there:
        backend.start_instance(
            InstanceSpec(
                key="no-reservation-instance",
                workspace=WORKSPACE,
                name="instance",
                work_dir=str(work / WORKSPACE),
                run_as=account,
                reservation=name,
            )
        )

    assert unknown_node.value.permanent and "Invalid node name specified" in unknown_node.value.message
    assert unknown_node.value.message.startswith(f"Slurm could not create reservation {name} of node99 for account")
    assert backwards.value.permanent and "must be after its start" in backwards.value.message
    assert unknown_account.value.permanent and "Invalid account" in unknown_account.value.message
    assert missing.value.permanent and missing.value.message == f"Slurm has no reservation {name} to update"
    for refused in (not_there.value, instance_not_there.value):
        assert refused.permanent and "Requested reservation is invalid" in refused.message
    assert show_reservation(name) is None
    delete_reservation(name)  # a reservation Slurm does not have: nothing to do
