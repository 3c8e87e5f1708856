"""A workload tries to fill the machine's disk, for real: a team-a job writes as fast as it can (four
writers at once, and a file it asks the filesystem to reserve whole), with a disk quota of 1 GB.
Its workspace's disk stops it at the quota with ENOSPC; the machine's own filesystem, the portal's
data directory and team-b's disk keep taking writes, and team-b's p95 latency listing its jobs on
a live portal stays within its budget meanwhile (tests/security/pressure.py). The control runs the
same job with ``PORTAL_DISK_QUOTA=off`` and must get past the quota, so the test fails if the
quota stops working.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.jobs.models import Job
from apps.workspaces import disks
from tests.converge import settle
from tests.personas import World, api_token
from tests.security.pressure import Bystander, Latencies, assert_within_budget
from tests.workspaces.local_jobs import GIB, LocalPortal, fill_command, local_portal, log_of, wrote

MB = 1 << 20

# Four writers at once, each writing 8 MiB blocks with no sync until the filesystem refuses (or
# their share of ``written`` bytes is written), then a file of ``reserved`` bytes reserved at once
# (posix_fallocate). Prints what each managed, as JSON.
ATTACK = r"""
import errno, json, os, sys
from multiprocessing import Pool
limit, reserve = int(sys.argv[1]), int(sys.argv[2])
def write(n):
    written, block = 0, b"\xa5" * (8 << 20)
    try:
        with open(f"flood-{n}", "wb", buffering=0) as out:
            while written < limit // 4:
                written += out.write(block)
    except OSError as exc:
        return written, errno.errorcode.get(exc.errno, str(exc.errno))
    return written, "done"
with Pool(4) as pool:
    writers = pool.map(write, range(4))
try:
    fd = os.open("reserved", os.O_WRONLY | os.O_CREAT, 0o600)
    os.posix_fallocate(fd, 0, reserve)
    reserved = "done"
except OSError as exc:
    reserved = errno.errorcode.get(exc.errno, str(exc.errno))
print("ATTACK=" + json.dumps({"writers": writers, "reserved": reserved}), flush=True)
"""


def attack_command(written: int, reserved: int) -> str:
    return f"python3 -c {shlex.quote(ATTACK)} {written} {reserved}"


def outcome(log: str) -> dict[str, Any]:
    line = next((line for line in log.splitlines() if line.startswith("ATTACK=")), None)
    assert line, f"the attack printed no result: {log[-2000:]!r}"
    result: dict[str, Any] = json.loads(line.removeprefix("ATTACK="))
    return result


@pytest.fixture
def portal(
    world: World, settings: Any, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> Iterator[LocalPortal]:
    yield from local_portal(world, settings, tmp_path, django_capture_on_commit_callbacks)


@pytest.fixture
def live_portal(tx_world: World, live_server: Any, settings: Any, tmp_path: Path) -> Iterator[LocalPortal]:
    """The same, with a live portal for another tenant to use meanwhile (its own transactions)."""
    yield from local_portal(tx_world, settings, tmp_path, None)


def running(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rindex(")") + 2 :].split()[0] not in ("Z", "X")


def measured_during(job: Job, bystander: Bystander) -> Latencies:
    """The bystander's latencies for as long as the job's wrapper runs."""
    attacking = threading.Event()
    attacking.set()

    def watch() -> None:
        while running(job.backend_state["replicas"][0]["pid"]):
            time.sleep(0.02)
        attacking.clear()

    threading.Thread(target=watch, daemon=True).start()
    return bystander.measure_while(attacking, timeout_s=120)


@pytest.mark.skipif(os.geteuid() != 0, reason="a workspace's disk is mounted by a portal run as root")
@pytest.mark.pressure
def test_a_job_filling_the_disk_as_fast_as_it_can_stops_at_its_quota(
    live_portal: LocalPortal, live_server: Any
) -> None:
    portal, world = live_portal, live_portal.world
    team_a = portal.set_disk_gb(world.team_a, 1)
    bystander = Bystander(live_server.url, "/api/v1/jobs/?workspace=team-b", api_token(world.charlie))
    idle = bystander.measure()

    # Each writer's share (2 GiB) is past the whole quota alone: none can finish before the disk is full.
    job = portal.submit(team_a, world.alice, attack_command(8 * GIB, 2 * GIB))
    assert job.state == Job.State.RUNNING, job.failure_reason
    attacked = measured_during(job, bystander)
    job = settle(job, timeout_s=120)

    result = outcome(log_of(job))
    assert [why for _, why in result["writers"]] == ["ENOSPC"] * 4, result
    assert result["reserved"] == "ENOSPC", result
    assert sum(written for written, _ in result["writers"]) <= GIB
    # All it wrote is in its disk, which takes no more of the machine than the quota.
    assert disks.image_path(team_a.pk).stat().st_blocks * 512 <= GIB + 8 * MB
    # Meanwhile the machine and the other tenants still write: the portal's data directory, and
    # team-b's own disk.
    (portal.root / "run" / "still-writable").write_bytes(b"\0" * (16 * MB))
    other = settle(portal.submit(world.team_b, world.charlie, fill_command(64 * MB)))
    assert wrote(log_of(other)) == (64 * MB, "done")
    # And team-b's use of the portal did not slow down past its budget while the disk filled.
    assert_within_budget(idle, attacked)


def test_without_the_quota_the_same_job_writes_past_it(portal: LocalPortal, world: World, settings: Any) -> None:
    """The control: proves the attack writes all it can where nothing holds it to a quota."""
    settings.PORTAL_DISK_QUOTA = "off"
    team_a = portal.set_disk_gb(world.team_a, 1)

    job = settle(portal.submit(team_a, world.alice, attack_command(64 * MB, GIB + 256 * MB)), timeout_s=120)

    result = outcome(log_of(job))
    assert job.state == Job.State.SUCCEEDED and result == {"writers": [[16 * MB, "done"]] * 4, "reserved": "done"}
    # Past its quota, on the machine's own filesystem (reserved at once rather than written: as much
    # of the machine's disk, in a fraction of the time).
    reserved = Path(job.backend_state["job_dir"], "reserved").stat()
    assert reserved.st_blocks * 512 > GIB and not disks.image_path(team_a.pk).exists()
