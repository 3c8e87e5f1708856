"""A workspace's disk quota, for real: jobs on this machine write into their workspace's own disk
(a mounted image, as root), the admin sets its size, and the workspace's page and API show it."""

from __future__ import annotations

import io
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from apps.jobs.actions import do_cancel_job
from apps.jobs.models import Job
from apps.workspaces import disks
from apps.workspaces.models import Workspace, WorkspaceDisk
from tests.ci_skips import in_ci
from tests.converge import settle
from tests.personas import World
from tests.workspaces.local_jobs import (
    GIB,
    LocalPortal,
    fill_command,
    local_portal,
    log_of,
    wait_for_content,
    wrote,
)
from workers.backends import diskquota

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 and not in_ci(os.environ), reason="a workspace's disk is mounted by a portal run as root"
)
MB = 1 << 20


@pytest.fixture
def portal(
    world: World, settings: Any, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> Iterator[LocalPortal]:
    yield from local_portal(world, settings, tmp_path, django_capture_on_commit_callbacks)


def image_of(workspace: Workspace) -> Path:
    return disks.image_path(workspace.pk)


def test_a_job_writing_past_its_quota_gets_enospc_and_nothing_else_fills(portal: LocalPortal, world: World) -> None:
    team_a = portal.set_disk_gb(world.team_a, 1)

    job = settle(portal.submit(team_a, world.alice, fill_command(3 * GIB)))

    written, why = wrote(log_of(job))
    assert why == "ENOSPC" and 0.9 * GIB < written <= GIB, (written, why)
    # What it wrote is in its disk, which holds no more than the quota: not on the machine's own
    # filesystem beside the portal's data (the directory under the mount holds nothing).
    assert image_of(team_a).stat().st_blocks * 512 <= GIB + 8 * MB
    subprocess.run(["umount", str(portal.root / "work" / "team-a")], check=True)
    assert list((portal.root / "work" / "team-a").iterdir()) == []
    # Another workspace writes into its own disk all the while.
    other = settle(portal.submit(world.team_b, world.charlie, fill_command(64 * MB)))
    assert wrote(log_of(other)) == (64 * MB, "done")


def test_the_page_and_the_api_show_the_disk_and_what_fills_it(portal: LocalPortal, world: World) -> None:
    job = settle(portal.submit(world.team_a, world.alice, "head -c 30000000 /dev/urandom > blob"))
    assert job.state == Job.State.SUCCEEDED, log_of(job)

    assert disks.upkeep()["measured"] == 1  # the scheduler loop's thread measures; no request walks files

    body = world.client(world.alice).get("/api/v1/workspaces/team-a/").json()
    assert body["disk_gb"] == 50
    disk = body["disk"]
    assert 45 * GIB < disk["size_bytes"] <= 50 * GIB and disk["used_bytes"] >= 30_000_000
    assert disk["largest"][0]["name"] == f"job-{job.pk}" and disk["largest"][0]["bytes"] >= 30_000_000
    assert disk["complete"] and disk["note"] == ""
    client = Client()
    client.force_login(world.alice)
    page = client.get("/w/team-a/").content.decode()
    assert 'id="disk-title"' in page and "quota 50 GB" in page and f"job-{job.pk}" in page
    assert "28.6\xa0MB" in page  # filesizeformat writes a no-break space


def test_an_admin_grows_the_quota_while_a_job_runs(portal: LocalPortal, world: World) -> None:
    """Online where the kernel lets the portal grow a mounted filesystem; else once the job ends."""
    team_a = portal.set_disk_gb(world.team_a, 1)
    sleeper = portal.submit(team_a, world.alice, "echo kept > ../kept.txt; exec sleep 300")
    assert sleeper.state == Job.State.RUNNING, sleeper.failure_reason
    wait_for_content(portal.root / "work" / "team-a" / "kept.txt")

    grown = world.client(world.admin).patch("/api/v1/workspaces/team-a/", {"disk_gb": 2}, format="json")
    assert grown.status_code == 200, grown.content
    disks.upkeep()

    measured = WorkspaceDisk.objects.get(workspace=team_a)
    if measured.note:  # this machine refuses to grow a mounted filesystem (no CAP_SYS_RESOURCE)
        assert "grows to 2 GB" in measured.note and measured.size_bytes < GIB
        assert "grows to 2 GB" in world.client(world.alice).get("/api/v1/workspaces/team-a/").json()["disk"]["note"]
        with portal.committed():
            do_cancel_job(sleeper, acting_user=world.alice)
        disks.upkeep()
        measured.refresh_from_db()
    assert measured.note == "" and 1.8 * GIB < measured.size_bytes <= 2 * GIB
    assert (portal.root / "work" / "team-a" / "kept.txt").read_text() == "kept\n"


def test_a_disk_unmounted_by_a_restart_is_mounted_again_with_its_files(portal: LocalPortal, world: World) -> None:
    workspace_dir = portal.root / "work" / "team-a"
    first = settle(portal.submit(world.team_a, world.alice, "echo kept > ../kept.txt"))
    assert first.state == Job.State.SUCCEEDED, log_of(first)

    subprocess.run(["umount", str(workspace_dir)], check=True)  # as a reboot leaves it
    second = settle(portal.submit(world.team_a, world.alice, "cat ../kept.txt; df --output=size -B1M .."))
    assert "kept" in log_of(second) and int(log_of(second).split()[-1]) > 40_000  # its 50 GB disk again

    subprocess.run(["umount", str(workspace_dir)], check=True)
    disks.upkeep()  # the scheduler loop mounts it again too: the jobs' artifacts are there to read
    assert (workspace_dir / "kept.txt").read_text() == "kept\n"


def test_a_portal_that_cannot_mount_starts_no_user_code_unless_the_operator_opts_out(
    portal: LocalPortal, world: World, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(diskquota, "_is_root", lambda: False)  # as a portal run as an ordinary user

    refused = portal.submit(world.team_a, world.alice, "echo ran > ../ran.txt")

    assert refused.state == Job.State.FAILED
    assert "run as root" in refused.failure_reason and "PORTAL_DISK_QUOTA=off" in refused.failure_reason
    assert not (portal.root / "work" / "team-a" / "ran.txt").exists() and not image_of(world.team_a).exists()

    settings.PORTAL_DISK_QUOTA = "off"
    ran = settle(portal.submit(world.team_a, world.alice, "echo ran > ../ran.txt"))
    assert ran.state == Job.State.SUCCEEDED and (portal.root / "work" / "team-a" / "ran.txt").exists()


def test_a_deleted_workspace_loses_its_disk(portal: LocalPortal, world: World) -> None:
    admin = world.client(world.admin)
    assert admin.post("/api/v1/workspaces/", {"name": "scratch"}, format="json").status_code == 201
    scratch = Workspace.objects.get(name="scratch")
    from apps.workspaces.actions import do_set_membership

    do_set_membership(scratch, world.charlie, "member", acting_user=world.admin)
    job = settle(portal.submit(scratch, world.charlie, "echo x > x.txt"))
    disk = disks.disk_of(scratch)
    assert job.state == Job.State.SUCCEEDED and diskquota.is_mounted(disk)

    assert admin.delete("/api/v1/workspaces/scratch/").status_code == 204
    assert disks.upkeep()["released"] == 1

    assert not diskquota.is_mounted(disk) and not Path(disk.image).exists()


def test_the_embedded_portals_stop_unmounts_the_disks_and_the_next_start_mounts_them(
    portal: LocalPortal, world: World
) -> None:
    sleeper = portal.submit(world.team_a, world.alice, "echo kept > ../kept.txt; exec sleep 300")
    assert sleeper.state == Job.State.RUNNING, sleeper.failure_reason
    disk = disks.disk_of(world.team_a)
    kept = portal.root / "work" / "team-a" / "kept.txt"
    wait_for_content(kept)

    call_command("stop_local_workloads", stdout=io.StringIO())  # what the embedded portal runs as it stops

    assert not diskquota.is_mounted(disk) and not kept.exists()
    disks.upkeep()
    assert kept.read_text() == "kept\n"
