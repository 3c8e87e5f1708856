"""Two workspaces on the real Slurm: each one's jobs run as its own account, under its own Slurm
account, and cannot read or write the other's files."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from apps.jobs.models import Job
from tests.personas import World
from tests.slurm.conftest import Portal, slurm_id

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as workspace accounts only when the portal is root")


def test_each_workspace_runs_as_its_own_account_and_cannot_reach_the_others_files(
    portal: Portal, world: World, django_capture_on_commit_callbacks: Any
) -> None:
    charlie = Portal(world.client(world.charlie), django_capture_on_commit_callbacks)
    writer = portal.submit("writer", 'echo "team-a data" > secret.txt; id -un; echo "$SLURM_JOB_ACCOUNT"')
    writer = portal.settle(writer["id"], "SUCCEEDED", "FAILED")
    job_dir = Path(Job.objects.get(pk=writer["id"]).backend_state["run"]["job_dir"])
    team_a_dir = job_dir.parent

    probe = (
        f"cat {job_dir}/secret.txt; echo read=$?; "
        f"touch {team_a_dir}/owned.txt; echo write=$?; "
        f"ls {team_a_dir}; echo list=$?; id -un"
    )
    reader = charlie.submit("reader", probe, workspace="team-b")
    reader = charlie.settle(reader["id"], "SUCCEEDED", "FAILED")

    team_a, team_b = f"gpw{world.team_a.pk}", f"gpw{world.team_b.pk}"
    assert portal.logs(writer["id"]).split() == [team_a, "team-a"]
    log = charlie.logs(reader["id"])
    assert "team-a data" not in log
    assert "read=1" in log and "write=1" in log and "list=2" in log, log
    assert log.strip().endswith(team_b)
    assert not (team_a_dir / "owned.txt").exists()
    assert (team_a_dir.stat().st_mode & 0o777, team_a_dir.stat().st_uid) == (
        0o700,
        settings.PORTAL_WORKSPACE_UID_MIN + world.team_a.pk,
    )
    for job, user, account in ((writer, team_a, "team-a"), (reader, team_b, "team-b")):
        sacct = subprocess.run(
            ["sacct", "-j", slurm_id(job["id"]), "-X", "-n", "-P", "-o", "User,Account"],
            capture_output=True, text=True, timeout=15,
        )  # fmt: skip
        assert sacct.stdout.strip() == f"{user}|{account}"
    associations = subprocess.run(
        ["sacctmgr", "-n", "-P", "show", "assoc", "account=team-a", "format=account,user"],
        capture_output=True, text=True, timeout=15,
    )  # fmt: skip
    assert f"team-a|{team_a}" in associations.stdout.split()
