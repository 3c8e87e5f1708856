"""GPU telemetry on the real Slurm: the portal asks Slurm's accounting (`sstat`) about the jobs
holding its devices. deploy/slurm.sh's cluster tracks `gres/gpuutil` and `gres/gpumem` as a site
that gathers GPU usage does, but its simulated devices give slurmd nothing to measure: Slurm
answers for the job's steps without GPU figures, and the portal stores nothing rather than zeros."""

from __future__ import annotations

import subprocess
import time

from django.test import Client

from apps.inventory.models import Allocation, Cluster
from apps.telemetry.collectors import SlurmCollector, collector_for
from apps.telemetry.models import GpuSample
from apps.telemetry.record import sample
from tests.personas import World
from tests.slurm.conftest import Portal, slurm_id


def _steps(slurm_job: str, timeout_s: float = 20.0) -> str:
    """sstat's lines for the job once it has a step running."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(
            ["sstat", "-a", "-n", "-P", "--format=JobID,TRESUsageInTot", "-j", slurm_job],
            capture_output=True, text=True, timeout=15,
        ).stdout  # fmt: skip
        if out.strip() or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def test_a_slurm_job_whose_gpus_slurm_does_not_measure_has_no_telemetry(
    portal: Portal, slurm: Cluster, world: World
) -> None:
    tracked = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=15).stdout
    assert "gres/gpuutil" in tracked and "gres/gpumem" in tracked  # tracked, as a gathering site's
    job = portal.submit("slurm-quiet", "sleep 120")
    running = slurm_id(job["id"])
    assert Allocation.objects.filter(workload_id=job["id"], gpu__node__pool__cluster=slurm).exists()

    steps = _steps(running)
    assert f"{running}.batch|" in steps and "cpu=" in steps  # Slurm answers for the job's steps ...
    assert "gres/gpuutil" not in steps  # ... without GPU figures

    assert isinstance(collector_for(slurm), SlurmCollector)
    assert SlurmCollector(slurm).readings() == []
    assert sample() == 0
    assert not GpuSample.objects.exists()
    alice = Client()
    alice.force_login(world.alice)
    page = alice.get(f"/w/team-a/jobs/{job['id']}/").content.decode()
    assert "No telemetry: the GPUs it holds report no measurements here" in page
