"""Launching and deleting instances and notebooks: hard limits, queueing, releasing GPUs."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from apps.catalog.models import ComputeProfile, NotebookProfile
from apps.compute.actions import check_launch_instance, check_launch_notebook, do_delete_instance
from apps.compute.models import Instance, Notebook
from apps.errors import ActionError, Conflict, LimitExceeded
from apps.inventory.models import Allocation
from apps.jobs.actions import check_submit_job
from apps.workspaces.models import Cohort, GPUQuota, Workspace
from tests.actions.refusals import refused
from tests.personas import World


def profile(name: str, gpus: str = "0", gpu_type: str = "h100", **fields: Any) -> ComputeProfile:
    return ComputeProfile.objects.create(
        name=name,
        gpu_type=gpu_type if Decimal(gpus) else "",
        gpu_count=Decimal(gpus),
        published=fields.pop("published", True),
        **fields,
    )


def launch(world: World, name: str = "box", profile: ComputeProfile | None = None, **kwargs: Any) -> Instance:
    return check_launch_instance(
        kwargs.pop("workspace", world.team_a),
        name=name,
        profile=profile or world.cpu_small,
        acting_user=kwargs.pop("user", world.alice),
        **kwargs,
    )


@pytest.fixture
def run_cycles(django_capture_on_commit_callbacks: Any) -> Any:
    """Run what actions queue on commit (the inline scheduling cycle) as in production."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


# --- hard limits ----------------------------------------------------------------------------


def test_it_refuses_an_instance_beyond_max_instances(world: World) -> None:
    for i in range(3):
        launch(world, f"box-{i}")
    with refused(
        LimitExceeded, "Workspace team-a already has 3 instances, its limit; delete one before launching another."
    ):
        launch(world, "box-3")


def test_it_counts_only_live_instances_against_max_instances(world: World) -> None:
    boxes = [launch(world, f"box-{i}") for i in range(3)]
    do_delete_instance(boxes[0], acting_user=world.alice)

    assert launch(world, "box-3").state == Instance.State.QUEUED


def test_it_refuses_a_name_in_use(world: World) -> None:
    launch(world, "box")
    with refused(ActionError, "An instance named box already exists in team-a.", field="name"):
        launch(world, "box")


def test_it_refuses_more_cpu_than_the_workspace_may_use(world: World) -> None:
    big = profile("cpu-huge", cpu_cores=300)
    with refused(
        LimitExceeded, "This asks for 300 CPU cores; workspace team-a may use at most 256.", field="cpu_cores"
    ):
        launch(world, profile=big)


def test_it_refuses_more_memory_than_the_workspace_may_use(world: World) -> None:
    big = profile("mem-huge", memory_gb=4096)
    with refused(
        LimitExceeded, "This asks for 4096 GB of memory; workspace team-a may use at most 2048 GB.", field="memory_gb"
    ):
        launch(world, profile=big)


def test_it_refuses_more_gpus_than_the_workspace_could_ever_hold(world: World) -> None:
    with refused(
        LimitExceeded,
        "This asks for 5 h100 GPUs; workspace team-a can never hold more than 4 (4 nominal, no borrowing).",
        field="gpus_per_replica",
    ):
        launch(world, profile=profile("gpu-5", "5"))


def test_it_counts_what_the_cohort_could_lend_in_the_ceiling(world: World) -> None:
    lab = Cohort.objects.create(name="lab")
    Workspace.objects.filter(pk=world.team_a.pk).update(cohort=lab, can_borrow=True)
    Workspace.objects.filter(pk=world.team_b.pk).update(cohort=lab)
    GPUQuota.objects.filter(workspace=world.team_b).update(lending_limit=2)

    assert launch(world, "six", profile=profile("gpu-6", "6")).state == Instance.State.QUEUED
    with refused(
        LimitExceeded,
        "This asks for 7 h100 GPUs; workspace team-a can never hold more than 6 (4 nominal + 2 borrowable).",
    ):
        launch(world, "seven", profile=profile("gpu-7", "7"))


def test_it_caps_the_ceiling_at_the_borrowing_limit(world: World) -> None:
    lab = Cohort.objects.create(name="lab")
    Workspace.objects.filter(pk=world.team_a.pk).update(cohort=lab, can_borrow=True)
    Workspace.objects.filter(pk=world.team_b.pk).update(cohort=lab)
    GPUQuota.objects.filter(workspace=world.team_a).update(borrowing_limit=1)

    with refused(
        LimitExceeded,
        "This asks for 6 h100 GPUs; workspace team-a can never hold more than 5 (4 nominal + 1 borrowable).",
    ):
        launch(world, profile=profile("gpu-6", "6"))


def test_it_refuses_a_gpu_type_the_workspace_has_no_quota_for(world: World) -> None:
    lab = Cohort.objects.create(name="lab")
    Workspace.objects.filter(pk=world.team_a.pk).update(cohort=lab, can_borrow=True)
    Workspace.objects.filter(pk=world.team_b.pk).update(cohort=lab)
    GPUQuota.objects.filter(workspace=world.team_a).delete()

    # The scheduler never lends to a workspace without a quota of the type: refuse now, not queue forever.
    with refused(
        LimitExceeded,
        "This asks for 1 h100 GPUs; workspace team-a can never hold more than 0 (no h100 quota).",
    ):
        launch(world, profile=world.gpu_1)


def test_it_refuses_a_gpu_type_the_workspace_may_not_use(world: World) -> None:
    Workspace.objects.filter(pk=world.team_a.pk).update(allowed_gpu_types=["a100", "l4"])
    with refused(ActionError, "Workspace team-a may not use h100 GPUs (allowed: a100, l4).", field="gpu_type"):
        launch(world, profile=world.gpu_1)


def test_it_refuses_a_gpu_type_no_cluster_has(world: World) -> None:
    GPUQuota.objects.create(workspace=world.team_a, gpu_type="a100", gpus=4)
    with refused(LimitExceeded, "No cluster has a100 GPUs.", field="gpu_type"):
        launch(world, profile=profile("a100-1", "1", gpu_type="a100"))


def test_it_refuses_a_replica_larger_than_the_largest_node(world: World) -> None:
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=16)
    with refused(
        LimitExceeded,
        "One replica asks for 16 h100 GPUs, but the largest node has 8; split the work into more replicas.",
    ):
        launch(world, profile=profile("gpu-16", "16"))


def test_it_refuses_a_share_above_one_that_is_not_whole(world: World) -> None:
    with refused(
        ActionError,
        "1.5 GPUs: more than one device must be a whole number (1, 2, 8...); a share of one device is 0.25, "
        "0.333, 0.5, 0.667 or 0.75.",
    ):
        launch(world, profile=profile("gpu-1-5", "1.5"))


def test_it_refuses_a_profile_the_workspace_does_not_allow(world: World) -> None:
    world.team_a.allowed_profiles.set([world.cpu_small])
    with refused(ActionError, "Workspace team-a does not allow profile gpu-1.", field="profile"):
        launch(world, profile=world.gpu_1)
    assert launch(world, profile=world.cpu_small).state == Instance.State.QUEUED


def test_it_refuses_an_unpublished_profile(world: World) -> None:
    draft = profile("draft", published=False)
    with refused(ActionError, "Profile draft is not available to you.", field="profile"):
        launch(world, profile=draft)


def test_it_refuses_a_profile_visible_only_to_another_team(world: World) -> None:
    theirs = profile("team-b-only")
    theirs.visible_to.set(world.charlie.groups.all())
    with refused(ActionError, "Profile team-b-only is not available to you.", field="profile"):
        launch(world, profile=theirs)
    assert launch(world, profile=theirs, workspace=world.team_b, user=world.charlie).state == Instance.State.QUEUED


# --- queueing -------------------------------------------------------------------------------


def test_it_queues_a_request_that_fits_the_quota_but_not_what_is_free_now(world: World, run_cycles: Any) -> None:
    with run_cycles():
        check_submit_job(
            world.team_a,
            name="big",
            command="train",
            gpu_type="h100",
            gpus_per_replica=Decimal("4"),
            acting_user=world.alice,
        )
    with run_cycles():
        instance = launch(world, profile=world.gpu_1)

    instance.refresh_from_db()
    assert instance.state == Instance.State.QUEUED
    assert instance.wait_reason == "waiting for quota: 4 of 4 h100 in use in workspace team-a, this needs 1"
    assert (instance.workspace_queue_position, instance.cluster_queue_position) == (1, 1)
    assert not instance.allocations.exists()


def test_it_admits_a_launch_when_the_cycle_runs_on_commit(world: World, run_cycles: Any) -> None:
    with run_cycles():
        instance = launch(world, profile=world.gpu_1)

    instance.refresh_from_db()
    assert instance.state == Instance.State.PROVISIONING
    assert instance.allocations.count() == 1


# --- deleting -------------------------------------------------------------------------------


def test_it_releases_gpus_and_stops_notebooks_when_an_instance_is_deleted(world: World, run_cycles: Any) -> None:
    with run_cycles():
        instance = launch(world, profile=world.gpu_1)
    notebook = check_launch_notebook(
        world.team_a, instance=instance, name="nb", profile=world.minimal, acting_user=world.alice
    )
    assert Allocation.objects.filter(workload=instance).count() == 1

    deleted = do_delete_instance(instance, acting_user=world.alice)

    assert deleted.state == Instance.State.DELETED
    assert deleted.finished_at is not None
    assert not Allocation.objects.exists()
    notebook.refresh_from_db()
    assert notebook.state == Notebook.State.STOPPED
    assert notebook.stopped_at is not None


def test_it_admits_the_next_in_line_when_an_instance_is_deleted(world: World, run_cycles: Any) -> None:
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=1)
    with run_cycles():
        first = launch(world, "first", profile=world.gpu_1)
    with run_cycles():
        second = launch(world, "second", profile=world.gpu_1)
    second.refresh_from_db()
    assert second.state == Instance.State.QUEUED

    with run_cycles():
        do_delete_instance(first, acting_user=world.alice)

    second.refresh_from_db()
    assert second.state == Instance.State.PROVISIONING


def test_it_clears_the_queue_position_of_a_deleted_queued_instance(world: World, run_cycles: Any) -> None:
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=1)
    with run_cycles():
        launch(world, "first", profile=world.gpu_1)
    with run_cycles():
        queued = launch(world, "second", profile=world.gpu_1)

    deleted = do_delete_instance(queued, acting_user=world.alice)

    deleted.refresh_from_db()
    assert (deleted.wait_reason, deleted.workspace_queue_position, deleted.cluster_queue_position) == ("", None, None)


def test_it_refuses_to_delete_an_instance_twice(world: World) -> None:
    instance = launch(world)
    do_delete_instance(instance, acting_user=world.alice)
    with refused(Conflict, "Instance box is already deleted."):
        do_delete_instance(instance, acting_user=world.alice)


# --- notebooks ------------------------------------------------------------------------------


def notebook(world: World, instance: Instance, name: str = "nb", **kwargs: Any) -> Notebook:
    return check_launch_notebook(
        kwargs.pop("workspace", world.team_a),
        instance=instance,
        name=name,
        profile=kwargs.pop("profile", world.minimal),
        acting_user=kwargs.pop("user", world.alice),
    )


def test_it_refuses_a_notebook_beyond_max_notebooks(world: World) -> None:
    instance = launch(world)
    for i in range(3):
        notebook(world, instance, f"nb-{i}")
    with refused(
        LimitExceeded, "Workspace team-a already has 3 notebooks, its limit; delete one before launching another."
    ):
        notebook(world, instance, "nb-3")


def test_it_refuses_a_notebook_on_another_workspaces_instance(world: World) -> None:
    theirs = launch(world, workspace=world.team_b, user=world.charlie)
    with refused(ActionError, "The instance belongs to another workspace.", field="instance"):
        notebook(world, theirs)


def test_it_refuses_a_notebook_on_a_deleted_instance(world: World) -> None:
    instance = do_delete_instance(launch(world), acting_user=world.alice)
    with refused(ActionError, "Instance box is deleted.", field="instance"):
        notebook(world, instance)


def test_it_refuses_an_unpublished_notebook_profile(world: World) -> None:
    draft = NotebookProfile.objects.create(name="draft", image="quay.io/jupyter/base-notebook")
    instance = launch(world)
    with refused(ActionError, "Notebook profile draft is not available to you.", field="profile"):
        notebook(world, instance, profile=draft)


def test_it_refuses_a_notebook_name_in_use(world: World) -> None:
    instance = launch(world)
    notebook(world, instance, "nb")
    with refused(ActionError, "A notebook named nb already exists in team-a.", field="name"):
        notebook(world, instance, "nb")
