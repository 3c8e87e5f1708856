"""Elastic pools through the portal, with the operator's command as the provider (a real program
that records what it is asked): a gang that fits no running node starts the nodes its shape needs,
is admitted on them, and its reason says what it waits for; empty nodes stop after the delay, never
below the minimum; a start that fails marks the node failed and nothing is placed there; a spent
budget starts nothing, saying why. Every decision is recorded and counted in /metrics."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.elastic import scaling
from apps.elastic.models import PoolScaling, ScalingDecision
from apps.inventory.actions import do_save_cluster
from apps.inventory.models import GPU, Allocation, Cluster, Node, NodePool
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from apps.scheduling.adapter import run_cycle
from apps.workspaces.models import GPUQuota
from tests.personas import World

pytestmark = pytest.mark.django_db


@pytest.fixture
def hook(tmp_path: Path) -> tuple[Path, Path]:
    """The operator's program: appends its arguments to a log; fails for a node named in `failing`."""
    log, failing = tmp_path / "calls.log", tmp_path / "failing"
    script = tmp_path / "scale.sh"
    script.write_text(f"""#!/bin/sh
echo "$@" >> {log}
for node in "$@"; do
  if [ -f {failing} ] && grep -qx "$node" {failing}; then echo "no capacity for $node" >&2; exit 3; fi
done
""")
    script.chmod(0o755)
    return script, log


def elastic_pool(script: Path, **limits: Any) -> PoolScaling:
    """Cluster burst: node b1 up, b2 and b3 powered down, 4 h100 each; an elastic pool of them."""
    burst = do_save_cluster(Cluster(), {"name": "burst", "kind": "slurm", "connection": {"partition": "elastic"}},
                            acting_user=None)  # fmt: skip
    pool = NodePool.objects.create(cluster=burst, name="elastic")
    for name, state in (("b1", Node.State.READY), ("b2", Node.State.POWERED_DOWN), ("b3", Node.State.POWERED_DOWN)):
        node = Node.objects.create(pool=pool, name=name, cpu_cores=64, memory_gb=512, state=state)
        GPU.objects.bulk_create(GPU(node=node, index=i, gpu_type="h100", model="H100") for i in range(4))
    values = {"min_nodes": 1, "max_nodes": 3, "scale_down_delay_s": 600, **limits}
    return PoolScaling.objects.create(pool=pool, provider="command", command=str(script), **values)


def gang(world: World, replicas: int, name: str = "gang") -> Job:
    burst = Cluster.objects.get(name="burst")
    return check_submit_job(world.team_a, name=name, command="true", gpu_type="h100", gpus_per_replica=Decimal(4),
                            replicas=replicas, requested_cluster=burst, acting_user=world.alice)  # fmt: skip


def states() -> dict[str, str]:
    return dict(Node.objects.filter(pool__name="elastic").values_list("name", "state"))


def test_a_gang_starts_the_nodes_it_needs_runs_there_and_idle_nodes_stop_after_the_delay(
    world: World, hook: tuple[Path, Path]
) -> None:
    script, log = hook
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=Decimal(12))
    elastic_pool(script)
    job = gang(world, 2)
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED  # one node of four GPUs is up; the gang needs two

    [change] = scaling.upkeep()
    assert change.reason == "adding 1 node (b2) to h100 on burst for 1 pending workload of team-a"
    assert log.read_text() == "up burst elastic b2\n" and states() == {
        "b1": "ready",
        "b2": "ready",
        "b3": "powered_down",
    }
    run_cycle()
    job.refresh_from_db()
    assert job.state == Job.State.ADMITTED
    assert set(Allocation.objects.filter(workload=job).values_list("gpu__node__name", flat=True)) == {"b1", "b2"}

    # Done: its nodes are empty from now; after the delay one stops, the minimum's one stays.
    do_cancel_job(job, acting_user=world.alice)
    now = timezone.now()
    assert scaling.upkeep(now) == []  # empty from now on
    assert scaling.upkeep(now + timedelta(seconds=300)) == []  # not long enough
    [stop] = scaling.upkeep(now + timedelta(seconds=601))
    assert stop.action == "down" and log.read_text().splitlines()[-1] == "down burst elastic b1"
    assert states() == {"b1": "powered_down", "b2": "ready", "b3": "powered_down"}
    assert scaling.upkeep(now + timedelta(seconds=2000)) == []  # the minimum of one stays up
    assert [d.action for d in ScalingDecision.objects.order_by("at", "id")] == ["up", "down"]


def test_a_node_that_fails_to_start_is_marked_failed_and_no_work_goes_there(
    world: World, hook: tuple[Path, Path], tmp_path: Path
) -> None:
    script, log = hook
    (tmp_path / "failing").write_text("b2\n")
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=Decimal(12))
    elastic_pool(script)
    job = gang(world, 2)
    scaling.upkeep()
    assert states()["b2"] == "failed"
    failed = ScalingDecision.objects.get(action="failed")
    assert failed.nodes == ["b2"] and "no capacity for b2" in failed.reason
    run_cycle()
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED
    [again] = scaling.upkeep()  # the next start goes to another node
    assert again.nodes and log.read_text().splitlines()[-1] == "up burst elastic b3"


def test_a_spent_budget_or_the_maximum_starts_nothing_and_the_reason_says_what_the_work_waits_for(
    world: World, hook: tuple[Path, Path]
) -> None:
    script, log = hook
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=Decimal(12))
    pool = elastic_pool(script, budget_gpu_hours=10, used_gpu_hours=10.0, budget_month=f"{timezone.now():%Y-%m}")
    gang(world, 2)
    assert scaling.upkeep() == [] and not log.exists()
    PoolScaling.objects.filter(pk=pool.pk).update(used_gpu_hours=0.0, max_nodes=1)
    assert scaling.upkeep() == [] and not log.exists()  # one node up is the maximum already

    # A node asked to start and not up yet: the queue says what the gang waits for.
    PoolScaling.objects.filter(pk=pool.pk).update(max_nodes=3, provider="slurm")
    Node.objects.filter(name="b2").update(state=Node.State.POWERING_UP)
    ready_by = (timezone.now() + timedelta(minutes=5)).isoformat()
    job = Job.objects.get(name="gang")
    PoolScaling.objects.filter(pk=pool.pk).update(starting_for={f"job:{job.pk}": {"nodes": 1, "ready_by": ready_by}})
    run_cycle()
    job.refresh_from_db()
    assert job.wait_reason.endswith("; waiting for 1 node to start (at most 5 min)")


def test_the_metrics_show_each_pools_nodes_by_state_and_its_decisions(
    world: World, hook: tuple[Path, Path], settings: Any
) -> None:
    settings.PORTAL_METRICS_TOKEN = "a-scrapers-token-of-some-length"
    script, _ = hook
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=Decimal(12))
    elastic_pool(script)
    gang(world, 2)
    scaling.upkeep()
    text = (
        Client().get("/metrics", headers={"Authorization": "Bearer a-scrapers-token-of-some-length"}).content.decode()
    )
    assert 'gpuportal_elastic_nodes{cluster="burst",pool="elastic",state="ready"} 2.0' in text
    assert 'gpuportal_elastic_decisions_total{action="up",cluster="burst",pool="elastic"} 1.0' in text
