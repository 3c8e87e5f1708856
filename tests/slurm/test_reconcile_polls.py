"""A reconcile pass asks the real Slurm about all its running jobs at once: one ``squeue`` for them
all, and one ``sacct`` for those squeue no longer lists (SlurmBackend.polling), however many jobs
run. Slurm's commands are counted by wrappers first on PATH that log each call and run the real one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from decimal import Decimal
from pathlib import Path

import pytest

from apps.jobs.models import Job
from apps.workloads.host import reconcile
from apps.workspaces.models import GPUQuota
from tests.personas import World
from tests.slurm.conftest import Portal, slurm_id, squeue


class Counted:
    """``squeue`` and ``sacct`` wrappers in a directory put first on PATH."""

    def __init__(self, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log = directory / "calls.log"
        for command in ("squeue", "sacct"):
            real = shutil.which(command)
            assert real is not None
            wrapper = directory / command
            wrapper.write_text(f'#!/bin/sh\necho {command} >> "{self.log}"\nexec {real} "$@"\n')
            wrapper.chmod(0o755)
        monkeypatch.setenv("PATH", f"{directory}:{os.environ['PATH']}")

    def calls(self) -> dict[str, int]:
        """How many times each ran since the last call of this (and forget them)."""
        lines = self.log.read_text().split() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        return {command: lines.count(command) for command in ("squeue", "sacct")}


def _ended_in_sacct(job_ids: list[str], timeout_s: float = 30.0) -> None:
    """Until squeue lists none of them and sacct has the final record of each."""
    deadline = time.monotonic() + timeout_s
    while any(squeue(j) for j in job_ids) or not all(_final(j) for j in job_ids):
        assert time.monotonic() < deadline, [squeue(j) for j in job_ids]
        time.sleep(0.2)


def _final(job_id: str) -> bool:
    argv = ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=15).stdout.split()
    return bool(out) and out[0] in ("COMPLETED", "FAILED")


def test_a_pass_asks_slurm_once_however_many_jobs_run(
    portal: Portal, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=Decimal(16))  # as many as Slurm has
    running = [portal.submit(f"long-{n}", "sleep 120")["id"] for n in range(4)]
    ending = [portal.submit("ok", "echo PROGRESS 0.5")["id"], portal.submit("fails", "exit 3")["id"]]
    assert {Job.objects.get(pk=pk).state for pk in running + ending} == {Job.State.RUNNING}
    _ended_in_sacct([slurm_id(pk) for pk in ending])
    counted = Counted(tmp_path, monkeypatch)

    reconcile(sweep=False)

    assert counted.calls() == {"squeue": 1, "sacct": 1}  # not one squeue per job, nor a sacct per ended one
    assert [Job.objects.get(pk=pk).state for pk in running] == [Job.State.RUNNING] * 4
    ok, failed = (Job.objects.get(pk=pk) for pk in ending)
    assert (ok.state, ok.exit_code, ok.progress) == (Job.State.SUCCEEDED, 0, 1.0)
    assert (failed.state, failed.exit_code, failed.failure_reason) == (Job.State.FAILED, 3, "failed with exit code 3")

    reconcile(sweep=False)  # only the running ones are asked about now, and squeue lists them all
    assert counted.calls() == {"squeue": 1, "sacct": 0}
    assert [Job.objects.get(pk=pk).state for pk in running] == [Job.State.RUNNING] * 4
