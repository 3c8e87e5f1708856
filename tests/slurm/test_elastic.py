"""An elastic pool on the real Slurm, through Slurm's own power saving: partition elastic's two nodes
start powered down; a gang that needs both makes the autoscaler power them up (Slurm runs its resume
program, which starts their slurmd), the gang runs there, and once they stand empty for the pool's
delay they are powered down again (checked with ``scontrol show node``)."""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.elastic import scaling
from apps.elastic.models import PoolScaling, ScalingDecision
from apps.inventory.actions import do_register_cluster
from apps.inventory.models import Node
from apps.jobs.models import Job
from apps.scheduling.adapter import run_cycle
from apps.workspaces.models import GPUQuota
from tests.personas import World
from tests.slurm.conftest import Portal, slurm_id, squeue

NODES = ("node5", "node6")


def slurm_state(node: str) -> str:
    out = subprocess.run(["scontrol", "show", "node", node, "-o"], capture_output=True, text=True, timeout=15)
    return next((f.split("=", 1)[1] for f in out.stdout.split() if f.startswith("State=")), "")


def until(what: str, predicate: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: {[slurm_state(n) for n in NODES]}"
        time.sleep(0.5)


@pytest.fixture
def powered_down() -> None:
    """Both elastic nodes powered down, as deploy/slurm.sh leaves them (and as the test leaves them)."""
    if any("POWERED_DOWN" not in slurm_state(n) for n in NODES):
        subprocess.run(["scontrol", "update", f"NodeName={','.join(NODES)}", "State=POWER_DOWN"],
                       capture_output=True, timeout=15)  # fmt: skip
    until("the elastic nodes powered down", lambda: all("POWERED_DOWN" in slurm_state(n) for n in NODES))


def test_a_gang_powers_up_the_nodes_it_needs_runs_there_and_they_power_down_after_the_delay(
    portal: Portal, world: World, powered_down: None, django_capture_on_commit_callbacks: Any
) -> None:
    elastic = do_register_cluster("elastic", kind="slurm", connection={"partition": "elastic"}, acting_user=world.admin)
    pool = elastic.pools.get()
    PoolScaling.objects.create(pool=pool, provider="slurm", min_nodes=0, max_nodes=2, scale_down_delay_s=60,
                               start_timeout_s=60)  # fmt: skip
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=Decimal(8))
    assert scaling.upkeep() == []  # nothing waits: they stay down
    assert set(Node.objects.filter(pool=pool).values_list("state", flat=True)) == {"powered_down"}

    job = portal.submit("elastic-gang", 'echo "on $SLURMD_NODENAME gpus $CUDA_VISIBLE_DEVICES"', cluster="elastic",
                        gpus_per_replica="4", replicas=2)  # fmt: skip
    assert job["state"] == "QUEUED"
    started = time.monotonic()
    [change] = scaling.upkeep()
    assert change.reason == "adding 2 nodes (node5, node6) to h100 on elastic for 1 pending workload of team-a"
    run_cycle()
    assert Job.objects.get(pk=job["id"]).wait_reason.endswith("; waiting for 2 nodes to start (at most 1 min)")
    until("powered up", lambda: all("POWER" not in slurm_state(n) for n in NODES))
    scaling.upkeep()
    assert set(Node.objects.filter(pool=pool).values_list("state", flat=True)) == {"ready"}
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle()  # admitted on them, and started on Slurm
    job = portal.settle(job["id"], "SUCCEEDED", "FAILED", timeout_s=60)
    assert job["state"] == "SUCCEEDED", job
    ready_s = time.monotonic() - started
    nodes = sorted(portal.logs(job["id"], r).split()[1] for r in (0, 1))
    assert nodes == ["node5", "node6"] and squeue(slurm_id(job["id"])) == ""
    assert ready_s < 60

    now = timezone.now()
    assert scaling.upkeep(now) == []  # empty from now
    [stop] = scaling.upkeep(now + timedelta(seconds=61))
    assert stop.action == "down" and len(stop.nodes) == 2
    until("powered down", lambda: all("POWERED_DOWN" in slurm_state(n) for n in NODES))
    scaling.upkeep(now + timedelta(seconds=70))
    assert set(Node.objects.filter(pool=pool).values_list("state", flat=True)) == {"powered_down"}
    assert [d.action for d in ScalingDecision.objects.order_by("at", "id")] == ["up", "down"]
