"""A job names the cluster it must run on: checked against that cluster's nodes, kept across requeues."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from apps.errors import ActionError
from apps.inventory.actions import do_save_cluster, do_sync_local_cluster
from apps.inventory.discovery import parse_declared
from apps.inventory.models import Allocation, Cluster
from apps.jobs.actions import check_submit_job, do_preempt_job, do_requeue_unready_job
from apps.jobs.models import Job
from apps.scheduling.adapter import load_snapshot, run_cycle
from apps.workspaces.actions import do_set_gpu_quota
from tests.personas import World

GPU_JOB = {"workspace": "team-a", "name": "train", "command": "python train.py", "gpu_type": "h100",
           "gpus_per_replica": "1", "memory_gb": 1}  # fmt: skip


def submit(world: World, **body: Any) -> Any:
    return world.client(world.alice).post("/api/v1/jobs/", {**GPU_JOB, **body}, format="json")


def field_error(response: Any, status: int) -> tuple[str, str]:
    assert response.status_code == status, response.json()
    [(field, [message])] = response.json()["error"]["fields"].items()
    return field, message


def test_it_queues_a_job_for_the_cluster_it_names(world: World, slurm: Cluster) -> None:
    response = submit(world, cluster="slurm")

    assert response.status_code == 201, response.json()
    assert (response.json()["cluster"], response.json()["requested_cluster"]) == ("slurm", "slurm")
    assert Job.objects.get(pk=response.json()["id"]).requested_cluster == slurm
    assert submit(world, name="anywhere").json()["requested_cluster"] is None


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ("no-such-cluster", "No cluster is named no-such-cluster."),
        ("Slurm", "Give a cluster's name."),
        (7, "Expected a string."),
        ("slurm\n", "Give a cluster's name."),
    ],
)
def test_it_refuses_a_cluster_that_does_not_exist(world: World, slurm: Cluster, cluster: Any, message: str) -> None:
    assert field_error(submit(world, cluster=cluster), 400) == ("cluster", message)
    assert not Job.objects.exists()


def test_it_refuses_a_disabled_cluster(world: World, slurm: Cluster) -> None:
    do_save_cluster(slurm, {"enabled": False}, acting_user=world.admin)

    assert field_error(submit(world, cluster="slurm"), 400) == ("cluster", "Cluster slurm is disabled.")
    with pytest.raises(ActionError, match="^Cluster slurm is disabled.$"):  # the action checks it too
        check_submit_job(world.team_a, name="t", command="c", requested_cluster=slurm, acting_user=world.alice)


def test_it_refuses_what_the_named_clusters_nodes_could_never_hold(world: World, slurm: Cluster) -> None:
    do_set_gpu_quota(world.team_a, "h100", gpus=Decimal(8), acting_user=world.admin)

    # The local cluster's node has 8 GPUs and 512 GB; Slurm's have 4 GPUs, 8 CPUs and 3 GB (4000 MB).
    assert submit(world, name="big", gpus_per_replica="8").status_code == 201
    assert field_error(submit(world, gpus_per_replica="8", cluster="slurm"), 409) == (
        "gpus_per_replica",
        "One replica asks for 8 h100 GPUs, but the largest node of cluster slurm has 4.",
    )
    assert field_error(submit(world, memory_gb=4, cluster="slurm"), 409) == (
        "memory_gb",
        "One replica asks for 4 GB of memory, but the largest node of cluster slurm has 3.",
    )
    assert field_error(submit(world, cpu_cores=9, cluster="slurm"), 409) == (
        "cpu_cores",
        "One replica asks for 9 CPU cores, but the largest node of cluster slurm has 8.",
    )
    assert field_error(submit(world, gpus_per_replica="0.5", replicas=5, cluster="slurm"), 409) == (
        "replicas",
        "On cluster slurm each replica takes a node of its own, and 4 of its nodes could hold one; "
        "ask for at most 4 replicas.",
    )
    do_sync_local_cluster(parse_declared("8xh100,2xa100"))
    do_set_gpu_quota(world.team_a, "a100", gpus=Decimal(2), acting_user=world.admin)
    assert submit(world, name="a100", gpu_type="a100").status_code == 201
    assert field_error(submit(world, gpu_type="a100", cluster="slurm"), 409) == (
        "gpu_type",
        "Cluster slurm has no a100 GPUs.",
    )
    assert submit(world, name="fits", gpus_per_replica="4", replicas=2, cluster="slurm").status_code == 201


def test_it_keeps_the_request_when_the_job_goes_back_in_line(world: World, slurm: Cluster) -> None:
    job = check_submit_job(
        world.team_a, name="t", command="c", gpu_type="h100", gpus_per_replica=Decimal(1), memory_gb=1,
        requested_cluster=slurm, acting_user=world.alice,
    )  # fmt: skip
    for requeue in (
        lambda: do_preempt_job(job, reason="make room"),
        lambda: do_requeue_unready_job(job, timeout_s=60, backoff_s=0),
    ):
        run_cycle()
        job.refresh_from_db()
        assert (job.state, job.cluster) == (Job.State.ADMITTED, slurm)
        requeue()
        job.refresh_from_db()
        assert (job.state, job.cluster, job.requested_cluster) == (Job.State.QUEUED, None, slurm)
        [pending] = load_snapshot().snapshot.pending
        assert pending.cluster == "slurm"


def test_it_places_a_job_on_the_cluster_it_names(world: World, slurm: Cluster) -> None:
    """Both clusters have room, and 'local' comes first: each job goes where it asked."""
    jobs = [
        check_submit_job(
            world.team_a,
            name=f"t-{gpus}",
            command="c",
            gpu_type="h100" if gpus else "",
            gpus_per_replica=Decimal(gpus),
            memory_gb=1,
            requested_cluster=slurm,
            acting_user=world.alice,
        )  # fmt: skip
        for gpus in (1, 0)
    ]
    anywhere = check_submit_job(
        world.team_a, name="anywhere", command="c", gpu_type="h100", gpus_per_replica=Decimal(1),
        acting_user=world.alice,
    )  # fmt: skip

    run_cycle()

    for job in jobs:
        job.refresh_from_db()
        assert (job.state, job.cluster) == (Job.State.ADMITTED, slurm)
    assert {a.gpu.node.pool.cluster for a in Allocation.objects.filter(workload=jobs[0])} == {slurm}
    anywhere.refresh_from_db()
    assert anywhere.cluster is not None and anywhere.cluster.name == "local"
