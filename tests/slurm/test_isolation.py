"""Two workspaces on the real Slurm: each one's jobs run as its own account, under its own Slurm
account, and cannot read or write the other's files."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from apps.jobs.models import Job
from apps.workspaces.unix import account_uid, ensure_account
from tests.personas import World
from tests.security.test_hostile_workloads import ATTACK, leaks_in
from tests.slurm.conftest import Portal, slurm_id

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as workspace accounts only when the portal is root")


def test_each_workspace_runs_as_its_own_account_and_cannot_reach_the_others_files(
    portal: Portal, world: World, django_capture_on_commit_callbacks: Any
) -> None:
    charlie = Portal(world.client(world.charlie), django_capture_on_commit_callbacks)
    writer = portal.submit("writer", 'echo "team-a data" > secret.txt; id -un; echo "$SLURM_JOB_ACCOUNT"')
    writer = portal.settle(writer["id"], "SUCCEEDED", "FAILED")
    job_dir = Path(Job.objects.get(pk=writer["id"]).backend_state["job_dir"])
    team_a_dir = job_dir.parent

    probe = (
        f"cat {job_dir}/secret.txt; echo read=$?; "
        f"touch {team_a_dir}/owned.txt; echo write=$?; "
        f"ls {team_a_dir}; echo list=$?; id -un"
    )
    reader = charlie.submit("reader", probe, workspace="team-b")
    reader = charlie.settle(reader["id"], "SUCCEEDED", "FAILED")

    team_a, team_b = ensure_account(world.team_a).user, ensure_account(world.team_b).user
    assert portal.logs(writer["id"]).split() == [team_a, "team-a"]
    log = charlie.logs(reader["id"])
    assert "team-a data" not in log
    assert "read=1" in log and "write=1" in log and "list=2" in log, log
    assert log.strip().endswith(team_b)
    assert not (team_a_dir / "owned.txt").exists()
    assert (team_a_dir.stat().st_mode & 0o777, team_a_dir.stat().st_uid) == (
        0o700,
        account_uid(world.team_a),
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


def test_a_slurm_job_reaches_nothing_of_the_portal_or_another_workspace(
    portal: Portal, world: World, django_capture_on_commit_callbacks: Any, tmp_path: Path
) -> None:
    """The hostile job of tests/security, on Slurm: no sandbox there, but its own account, which
    Unix permissions keep from the portal's private files, its processes and team-b's."""
    data = Path(tempfile.mkdtemp(prefix="gpuportal-data-"))  # the portal's data directory: 0700
    (data / "portal.sqlite3").write_text("every API token of the portal")
    (data / "secret_key").write_text("the portal's SECRET_KEY")
    proxy_token, team_b_secret = "proxy-token-" + os.urandom(8).hex(), "team-b-secret-" + os.urandom(8).hex()
    stand_in = subprocess.Popen(["sleep", "300"], env={"PATH": "/usr/bin:/bin", "CONFIGPROXY_AUTH_TOKEN": proxy_token})
    charlie = Portal(world.client(world.charlie), django_capture_on_commit_callbacks)
    victim = charlie.submit("victim", "echo team-b data > data.txt; exec sleep 300", workspace="team-b",
                            env={"TEAM_B_SECRET": team_b_secret})  # fmt: skip
    victim_dir = Path(Job.objects.get(pk=victim["id"]).backend_state["job_dir"])
    try:
        victim_pid = _wait_for_process_with(team_b_secret)
        targets = {
            "read": {
                "database": str(data / "portal.sqlite3"),
                "secret-key": str(data / "secret_key"),
                "team-b-file": str(victim_dir / "data.txt"),
                "team-b-log": str(victim_dir / ".portal" / "replica-0.log"),
            },
            "write": {"team-b-dir": str(victim_dir.parent / "owned.txt")},
            "secrets": {"proxy-token": proxy_token, "team-b-secret": team_b_secret},
            "signal": {"portal": stand_in.pid, "team-b-job": victim_pid},
        }
        attacker = portal.submit("attacker", f"python3 -c {shlex.quote(ATTACK)} {shlex.quote(json.dumps(targets))}")
        attacker = portal.settle(attacker["id"], "SUCCEEDED", "FAILED")
        assert attacker["state"] == "SUCCEEDED", portal.logs(attacker["id"])
        assert leaks_in(portal.logs(attacker["id"])) == set()
    finally:
        stand_in.kill()
        stand_in.wait()
        shutil.rmtree(data, ignore_errors=True)


def _wait_for_process_with(marker: str, timeout_s: float = 20.0) -> int:
    """The pid of the process whose environment holds ``marker`` (read as root)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/environ").read_bytes():
                    return int(entry)
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no process holds {marker}")
