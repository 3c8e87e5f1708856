"""Every action writes exactly one audit event: who, what, in which workspace, from where."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser, Group

from apps.accounts.actions import do_deactivate_user, do_delete_group, do_save_group, do_save_user
from apps.audit.actions import SYSTEM, Origin
from apps.audit.models import AuditEvent
from apps.catalog.actions import do_delete_profile, do_save_profile
from apps.catalog.models import ComputeProfile
from apps.compute import actions as compute
from apps.inventory.actions import do_delete_cluster, do_save_cluster, do_sync_local_cluster
from apps.inventory.discovery import parse_declared
from apps.inventory.models import Cluster
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.workspaces import actions as workspaces
from apps.workspaces.models import Cohort, GPUQuota
from tests.personas import World

FROM_CLI = Origin(via=AuditEvent.Via.CLI, ip_address="203.0.113.7")


class Act:
    """Runs one action with the test's origin, remembering which events came before it."""

    def __init__(self, origin: Origin):
        self.origin = origin
        self.before: set[int] = set()
        self.actor: Any = None

    def __call__(self, action: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.before = set(AuditEvent.objects.values_list("pk", flat=True))
        self.actor = kwargs["acting_user"]
        return action(*args, origin=self.origin, **kwargs)


def _instance(world: World) -> Any:
    return compute.check_launch_instance(world.team_a, name="box", profile=world.cpu_small, acting_user=world.alice)


def _notebook(world: World) -> Any:
    return compute.check_launch_notebook(
        world.team_a, instance=_instance(world), name="nb", profile=world.minimal, acting_user=world.alice
    )


def _job(world: World) -> Any:
    return check_submit_job(world.team_a, name="train", command="train", acting_user=world.alice)


# Per action: the workspace its event names (None for platform-wide objects), and a case that
# prepares what the action needs and runs it through `act`.
Case = Callable[[World, Act], object]
CASES: dict[str, tuple[str | None, Case]] = {
    "instance.launch": ("team-a", lambda w, act: act(
        compute.check_launch_instance, w.team_a, name="box", profile=w.cpu_small, acting_user=w.alice
    )),
    "instance.update": ("team-a", lambda w, act: act(
        compute.do_update_instance, _instance(w), description="new", acting_user=w.bob
    )),
    "instance.delete": ("team-a", lambda w, act: act(compute.do_delete_instance, _instance(w), acting_user=w.bob)),
    "notebook.launch": ("team-a", lambda w, act: act(
        compute.check_launch_notebook, w.team_a, instance=_instance(w), name="nb", profile=w.minimal, acting_user=w.bob
    )),
    "notebook.update": ("team-a", lambda w, act: act(
        compute.do_update_notebook, _notebook(w), description="new", acting_user=w.alice
    )),
    "notebook.delete": ("team-a", lambda w, act: act(compute.do_delete_notebook, _notebook(w), acting_user=w.alice)),
    "job.submit": ("team-a", lambda w, act: act(
        check_submit_job, w.team_a, name="t", command="c", gpu_type="h100", gpus_per_replica=Decimal(1),
        acting_user=w.alice,
    )),
    "job.cancel": ("team-a", lambda w, act: act(do_cancel_job, _job(w), acting_user=w.bob)),
    "workspace.create": ("lab", lambda w, act: act(workspaces.do_create_workspace, name="lab", acting_user=w.admin)),
    "workspace.update": ("team-a", lambda w, act: act(
        workspaces.do_update_workspace, w.team_a, max_notebooks=9, acting_user=w.admin
    )),
    "workspace.delete": (None, lambda w, act: act(workspaces.do_delete_workspace, w.team_b, acting_user=w.admin)),
    "membership.set": ("team-a", lambda w, act: act(
        workspaces.do_set_membership, w.team_a, w.bob, "member", acting_user=w.alice
    )),
    "membership.remove": ("team-a", lambda w, act: act(
        workspaces.do_remove_membership, w.team_a.memberships.get(user=w.victor), acting_user=w.alice
    )),
    "quota.set": ("team-b", lambda w, act: act(
        workspaces.do_set_gpu_quota, w.team_b, "a100", gpus=Decimal(2), acting_user=w.admin
    )),
    "quota.delete": ("team-b", lambda w, act: act(
        workspaces.do_delete_gpu_quota, GPUQuota.objects.get(workspace=w.team_b), acting_user=w.admin
    )),
    "cohort.create": (None, lambda w, act: act(workspaces.do_save_cohort, None, name="lab", acting_user=w.admin)),
    "cohort.delete": (None, lambda w, act: act(
        workspaces.do_delete_cohort, Cohort.objects.create(name="lab"), acting_user=w.admin
    )),
    "computeprofile.publish": (None, lambda w, act: act(
        do_save_profile, ComputeProfile.objects.create(name="draft"), published=True, acting_user=w.admin
    )),
    "computeprofile.delete": (None, lambda w, act: act(
        do_delete_profile, ComputeProfile.objects.create(name="draft"), acting_user=w.admin
    )),
    "user.create": (None, lambda w, act: act(do_save_user, get_user_model()(username="dora"), acting_user=w.admin)),
    "user.deactivate": (None, lambda w, act: act(do_deactivate_user, w.bob, acting_user=w.admin)),
    "group.create": (None, lambda w, act: act(do_save_group, Group(), name="team-c", acting_user=w.admin)),
    "group.delete": (None, lambda w, act: act(
        do_delete_group, Group.objects.create(name="team-c"), acting_user=w.admin
    )),
    "cluster.create": (None, lambda w, act: act(
        do_save_cluster, Cluster(name="slurm", kind="slurm"), {"connection": {"token": "x"}}, acting_user=w.admin
    )),
    "cluster.delete": (None, lambda w, act: act(
        do_delete_cluster, Cluster.objects.create(name="slurm", kind="slurm"), acting_user=w.admin
    )),
    "cluster.discover": (None, lambda w, act: act(
        do_sync_local_cluster, parse_declared("8xh100"), acting_user=w.admin
    )),
}  # fmt: skip


@pytest.mark.parametrize("origin", [FROM_CLI, SYSTEM], ids=["cli", "system"])
@pytest.mark.parametrize("action", CASES)
def test_it_writes_one_audit_event_per_action(world: World, action: str, origin: Origin) -> None:
    workspace, case = CASES[action]
    act = Act(origin)

    case(world, act)

    [event] = AuditEvent.objects.exclude(pk__in=act.before)
    assert event.action == action
    assert (event.actor, event.actor_name) == (act.actor, act.actor.username)
    assert (event.via, event.ip_address) == (origin.via, origin.ip_address)
    assert (event.workspace.name if event.workspace else None) == workspace
    assert event.target_id and event.target_repr


def test_it_stops_an_instances_notebooks_with_an_event_each(world: World) -> None:
    notebook = _notebook(world)
    before = set(AuditEvent.objects.values_list("pk", flat=True))

    compute.do_delete_instance(notebook.instance, acting_user=world.bob, origin=FROM_CLI)

    events = AuditEvent.objects.exclude(pk__in=before).order_by("id")
    assert [(e.action, e.target_id, e.actor, e.via) for e in events] == [
        ("notebook.delete", str(notebook.pk), world.bob, "cli"),
        ("instance.delete", str(notebook.instance_id), world.bob, "cli"),
    ]


def test_it_keeps_credentials_out_of_the_audit_trail(world: World) -> None:
    CASES["cluster.create"][1](world, Act(SYSTEM))

    [event] = AuditEvent.objects.filter(action="cluster.create")
    assert "token" not in str(event.data)


def test_it_writes_no_event_for_an_update_that_changes_nothing(world: World) -> None:
    instance = _instance(world)
    before = AuditEvent.objects.count()

    compute.do_update_instance(instance, description="", acting_user=world.alice)

    assert AuditEvent.objects.count() == before


def test_it_records_an_anonymous_actor_as_the_system(world: World) -> None:
    check_submit_job(world.team_a, name="cron", command="true", acting_user=AnonymousUser())

    [event] = AuditEvent.objects.filter(action="job.submit")
    assert (event.actor, event.actor_name) == (None, "")
