"""The portal on the real Slurm that deploy/slurm.sh runs: partition gpu, node[1-4] x 4 simulated h100.

Every test here skips, saying why, only where Slurm's commands are not installed; where they are
(CI installs and starts Slurm) and the cluster does not answer, the tests fail.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.inventory.actions import do_register_cluster
from apps.inventory.models import Cluster
from apps.jobs.models import Job
from apps.workloads.host import reconcile
from tests.personas import World

SETTLE_S = 30.0


@pytest.fixture(scope="session", autouse=True)
def slurm_answers() -> None:
    if shutil.which("sinfo") is None:
        pytest.skip(
            "Slurm's commands (sinfo) are not installed here: `bash deploy/slurm.sh start` installs and starts Slurm"
        )
    try:
        sinfo = subprocess.run(["sinfo", "-h", "-p", "gpu", "-o", "%D %t"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("sinfo did not answer in 15 s: start Slurm with `bash deploy/slurm.sh start`")
    if sinfo.returncode != 0 or not sinfo.stdout.strip():
        pytest.fail(f"Slurm does not answer ({sinfo.stderr.strip()}): start it with `bash deploy/slurm.sh start`")


@pytest.fixture
def slurm(world: World) -> Cluster:
    """Slurm's partition gpu, registered as the cluster 'slurm' from what Slurm reports."""
    return do_register_cluster("slurm", kind="slurm", connection={"partition": "gpu"}, acting_user=world.admin)


def squeue(slurm_id: str) -> str:
    """The job's line in squeue ('' once it has left the queue)."""
    out = subprocess.run(["squeue", "-h", "-j", slurm_id, "-o", "%i %T %N"], capture_output=True, text=True, timeout=15)
    return out.stdout.strip()


def slurm_id(job_id: int) -> str:
    run: dict[str, Any] = Job.objects.get(pk=job_id).backend_state or {}
    return str(run.get("job_id", ""))


@dataclass
class Portal:
    """The portal's API as alice (owner of team-a) uses it, with the worker's steps run in-process."""

    client: APIClient
    capture: Any  # django_capture_on_commit_callbacks

    def submit(self, name: str, command: str, **body: Any) -> dict[str, Any]:
        """POST a job for the cluster 'slurm'; once committed the scheduler admits it and the worker starts it."""
        body = {"workspace": "team-a", "name": name, "command": command, "cluster": "slurm", "gpu_type": "h100",
                "gpus_per_replica": "1", "memory_gb": 1, **body}  # fmt: skip
        with self.capture(execute=True):
            response = self.client.post("/api/v1/jobs/", body, format="json")
        assert response.status_code == 201, response.json()
        return self.job(response.json()["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        response = self.client.get(f"/api/v1/jobs/{job_id}/")
        assert response.status_code == 200, response.json()
        return response.json()  # type: ignore[no-any-return]

    def logs(self, job_id: int, replica: int = 0) -> str:
        response = self.client.get(f"/api/v1/jobs/{job_id}/logs/", {"replica": replica})
        assert response.status_code == 200, response.json()
        return response.json()["text"]  # type: ignore[no-any-return]

    def cancel(self, job_id: int) -> dict[str, Any]:
        with self.capture(execute=True):
            response = self.client.post(f"/api/v1/jobs/{job_id}/cancel/")
        assert response.status_code == 200, response.json()
        return self.job(job_id)

    def settle(self, job_id: int, *states: str, timeout_s: float = SETTLE_S) -> dict[str, Any]:
        """Run the worker's periodic reconcile until the job is in one of `states`."""
        deadline = time.monotonic() + timeout_s
        while True:
            reconcile(sweep=False)
            job = self.job(job_id)
            if job["state"] in states:
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {job['state']}, not {states}: {job}")
            time.sleep(0.2)


@pytest.fixture
def portal(
    world: World, slurm: Cluster, settings: Any, shared_work: Path, django_capture_on_commit_callbacks: Any
) -> Iterator[Portal]:
    """Jobs start as soon as they are admitted, on Slurm (the 'local' cluster has room too, and would
    be tried first were they not sent to Slurm). Afterwards every Slurm job a test left is cancelled."""
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"
    settings.PORTAL_WORK_DIR = shared_work
    yield Portal(world.client(world.alice), django_capture_on_commit_callbacks)
    left = [slurm_id(pk) for pk in Job.objects.values_list("pk", flat=True)]
    if any(left):
        subprocess.run(["scancel", *filter(None, left)], capture_output=True, timeout=15)
