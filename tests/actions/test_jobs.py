"""Submitting and cancelling jobs: gang sizes, hard limits, queueing, releasing GPUs."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from apps.errors import ActionError, Conflict, LimitExceeded
from apps.inventory.models import GPU, Allocation, Node
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from apps.workspaces.models import GPUQuota, Workspace
from tests.actions.refusals import refused
from tests.personas import World


def submit(world: World, gpus: str = "0", replicas: int = 1, **kwargs: Any) -> Job:
    kwargs.setdefault("command", "python train.py")
    return check_submit_job(
        kwargs.pop("workspace", world.team_a),
        name=kwargs.pop("name", "train"),
        gpu_type=kwargs.pop("gpu_type", "h100" if Decimal(gpus) else ""),
        gpus_per_replica=Decimal(gpus),
        replicas=replicas,
        acting_user=kwargs.pop("user", world.alice),
        **kwargs,
    )


@pytest.fixture
def run_cycles(django_capture_on_commit_callbacks: Any) -> Any:
    return lambda: django_capture_on_commit_callbacks(execute=True)


def test_it_queues_a_job_with_what_it_asks_for(world: World) -> None:
    job = submit(world, "2", replicas=2, priority=5, env={"SEED": "1"}, max_runtime_s=60)

    job.refresh_from_db()
    assert job.state == Job.State.QUEUED
    assert (job.gpu_type, job.gpus_per_replica, job.replicas, job.total_gpus) == ("h100", 2, 2, 4)
    assert (job.priority, job.env, job.max_runtime_s, job.created_by) == (5, {"SEED": "1"}, 60, world.alice)


def test_it_drops_the_gpu_type_of_a_cpu_only_job(world: World) -> None:
    assert submit(world, "0", gpu_type="h100").gpu_type == ""


def test_it_refuses_a_job_with_nothing_to_run(world: World) -> None:
    with refused(ActionError, "Give the job a command, an image, or both.", field="command"):
        submit(world, command="")


def test_it_refuses_negative_gpus(world: World) -> None:
    with refused(ActionError, "GPUs cannot be negative.", field="gpus_per_replica"):
        submit(world, "-1", gpu_type="h100")


def test_it_refuses_gpus_without_a_type(world: World) -> None:
    with refused(ActionError, "Name the GPU type of a request with GPUs.", field="gpu_type"):
        submit(world, "1", gpu_type="")


@pytest.mark.parametrize("gpus", ["1.5", "2.25"])
def test_it_refuses_a_share_above_one_that_is_not_whole(world: World, gpus: str) -> None:
    with refused(
        ActionError,
        f"{gpus} GPUs: more than one device must be a whole number (1, 2, 8...); a share of one device is 0.25, "
        "0.333, 0.5, 0.667 or 0.75.",
    ):
        submit(world, gpus)


@pytest.mark.parametrize("gpus", ["0.3", "0.1", "0.6", "0.99", "0.33", "0.334", "0.666"])
def test_it_refuses_a_share_that_is_not_a_quarter_a_third_a_half_or_three_quarters(world: World, gpus: str) -> None:
    with refused(
        ActionError,
        f"{gpus} GPUs: a share of one device is 0.25, 0.333, 0.5, 0.667 or 0.75 (or 0 for no GPU, or a whole "
        "number of devices).",
        field="gpus_per_replica",
    ):
        submit(world, gpus, gpu_type="h100")


def test_no_gpu_is_a_job_on_cpu_cores_alone(world: World) -> None:
    job = submit(world, "0", gpu_type="h100")
    assert (job.state, job.gpu_type, job.gpus_per_replica) == (Job.State.QUEUED, "", 0)


@pytest.mark.parametrize("gpus", ["0.25", "0.333", "0.5", "0.667", "0.75", "1", "4"])
def test_it_accepts_shares_below_one_and_whole_devices(world: World, gpus: str) -> None:
    assert submit(world, gpus).state == Job.State.QUEUED


def test_it_counts_the_whole_gang_against_the_ceiling(world: World) -> None:
    with refused(
        LimitExceeded,
        "This asks for 6 h100 GPUs; workspace team-a can never hold more than 4 (4 nominal, no borrowing).",
    ):
        submit(world, "2", replicas=3)


def test_it_counts_every_replicas_cpu_and_memory(world: World) -> None:
    with refused(LimitExceeded, "This asks for 300 CPU cores; workspace team-a may use at most 256."):
        submit(world, replicas=3, cpu_cores=100)
    with refused(LimitExceeded, "This asks for 2100 GB of memory; workspace team-a may use at most 2048 GB."):
        submit(world, replicas=3, memory_gb=700)


def test_it_refuses_a_replica_larger_than_the_largest_node(world: World) -> None:
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=16)
    with refused(
        LimitExceeded,
        "One replica asks for 16 h100 GPUs, but the largest node has 8; split the work into more replicas.",
    ):
        submit(world, "16")


def test_it_refuses_a_gang_no_cluster_could_hold_at_once(world: World) -> None:
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=16)
    with refused(
        LimitExceeded,
        "This gang asks for 2 replicas of 8 h100 GPUs at once, but no cluster can hold more than 1 of them.",
        field="replicas",
    ):
        submit(world, "8", replicas=2)


def test_it_takes_a_gang_that_spreads_over_two_nodes(world: World) -> None:
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=16)
    node = Node.objects.get()
    second = Node.objects.create(pool=node.pool, name="node-2", cpu_cores=64, memory_gb=512)
    GPU.objects.bulk_create(GPU(node=second, index=i, gpu_type="h100", model="NVIDIA H100") for i in range(8))
    assert submit(world, "8", replicas=2).state == Job.State.QUEUED
    assert submit(world, "0.5", replicas=32, name="halves").state == Job.State.QUEUED


def test_it_refuses_a_gpu_type_the_workspace_may_not_use(world: World) -> None:
    Workspace.objects.filter(pk=world.team_a.pk).update(allowed_gpu_types=["a100"])
    with refused(ActionError, "Workspace team-a may not use h100 GPUs (allowed: a100).", field="gpu_type"):
        submit(world, "1")


def test_it_holds_a_job_to_the_workspaces_runtime_limit(world: World) -> None:
    Workspace.objects.filter(pk=world.team_a.pk).update(max_runtime_s=3600)
    with refused(ActionError, "Workspace team-a allows at most 3600 s of runtime.", field="max_runtime_s"):
        submit(world, max_runtime_s=7200)
    assert submit(world, name="default").max_runtime_s == 3600


def test_it_queues_a_job_that_fits_the_quota_but_not_what_is_free_now(world: World, run_cycles: Any) -> None:
    with run_cycles():
        first = submit(world, "2", replicas=2, name="first")
    with run_cycles():
        second = submit(world, "0.5", name="second")

    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == Job.State.ADMITTED
    assert second.state == Job.State.QUEUED
    assert second.wait_reason == "waiting for quota: 4 of 4 h100 in use in workspace team-a, this needs 0.5"
    assert (second.workspace_queue_position, second.cluster_queue_position) == (1, 1)


def test_it_releases_gpus_when_a_job_is_cancelled(world: World, run_cycles: Any) -> None:
    with run_cycles():
        job = submit(world, "2", replicas=2)
    assert Allocation.objects.filter(workload=job).count() == 4

    cancelled = do_cancel_job(job, acting_user=world.alice)

    assert cancelled.state == Job.State.CANCELLED
    assert cancelled.finished_at is not None
    assert not Allocation.objects.exists()


def test_it_clears_a_cancelled_jobs_place_in_the_queue(world: World, run_cycles: Any) -> None:
    with run_cycles():
        submit(world, "4", name="first")
    with run_cycles():
        queued = submit(world, "1", name="second")
    queued.refresh_from_db()
    assert queued.cluster_queue_position == 1

    cancelled = do_cancel_job(queued, acting_user=world.alice)

    cancelled.refresh_from_db()
    assert (cancelled.wait_reason, cancelled.workspace_queue_position, cancelled.cluster_queue_position) == (
        "",
        None,
        None,
    )


def test_it_refuses_to_cancel_a_job_twice(world: World) -> None:
    job = do_cancel_job(submit(world), acting_user=world.alice)
    with refused(Conflict, "Job train has already finished (cancelled)."):
        do_cancel_job(job, acting_user=world.alice)


@pytest.mark.parametrize("state", [Job.State.SUCCEEDED, Job.State.FAILED])
def test_it_refuses_to_cancel_a_finished_job(world: World, state: str) -> None:
    job = submit(world)
    Job.objects.filter(pk=job.pk).update(state=state)
    with refused(Conflict, f"Job train has already finished ({state.lower()})."):
        do_cancel_job(job, acting_user=world.alice)
