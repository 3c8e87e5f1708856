"""The admin console: profiles, workspaces and quotas, inventory, users and groups, the cluster dashboard."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from apps.audit.models import AuditEvent
from apps.catalog.models import ComputeProfile
from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.workspaces.models import Cohort, GPUQuota, Workspace
from tests.personas import World
from tests.web.conftest import queries

SignedIn = Callable[[Any], Client]
PAGES = [
    "/console/",
    "/console/profiles/",
    "/console/workspaces/",
    "/console/workspaces/team-a/",
    "/console/inventory/",
    "/console/people/",
    "/console/profiles/compute/new/",
    "/console/people/users/new/",
]


def test_the_console_is_for_platform_admins_only(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    for url in PAGES:
        assert alice.get(url).status_code == 403, url
    admin = signed_in(world.admin)
    for url in PAGES:
        assert admin.get(url).status_code == 200, url


def test_an_admin_creates_and_publishes_a_profile_for_some_groups(world: World, signed_in: SignedIn) -> None:
    admin = signed_in(world.admin)
    bad = admin.post(
        "/console/profiles/compute/new/",
        {"name": "gpu-2", "gpu_count": "2", "cpu_cores": "4", "memory_gb": "32", "kind": "slice"},
    )
    assert bad.status_code == 400 and "A profile with GPUs names their type." in bad.content.decode()
    created = admin.post(
        "/console/profiles/compute/new/",
        {
            "name": "gpu-2",
            "display_name": "Two H100",
            "gpu_type": "h100",
            "gpu_count": "2",
            "cpu_cores": "16",
            "memory_gb": "128",
            "kind": "slice",
            "visible_to": ["team-a"],
        },
    )
    assert created["Location"] == "/console/profiles/"
    profile = ComputeProfile.objects.get(name="gpu-2")
    assert not profile.published and [g.name for g in profile.visible_to.all()] == ["team-a"]
    admin.post("/console/profiles/compute/gpu-2/publish/", {"published": "true"})
    profile.refresh_from_db()
    assert profile.published
    assert AuditEvent.objects.filter(action="computeprofile.publish", via=AuditEvent.Via.WEB).exists()
    listed = admin.get("/console/profiles/").content.decode()
    assert 'data-profile="gpu-2"' in listed and "Unpublish<span" in listed
    admin.post("/console/profiles/compute/gpu-2/publish/", {"published": "false"})
    assert not ComputeProfile.objects.get(name="gpu-2").published


def test_an_admin_sets_and_lowers_a_quota(world: World, signed_in: SignedIn) -> None:
    admin = signed_in(world.admin)
    admin.post("/console/workspaces/team-a/quotas/", {"gpu_type": "h100", "gpus": "2", "borrowing_limit": "1"})
    quota = GPUQuota.objects.get(workspace=world.team_a, gpu_type="h100")
    assert (quota.gpus, quota.borrowing_limit, quota.lending_limit) == (Decimal("2"), Decimal("1"), None)
    refused = admin.post("/console/workspaces/team-a/quotas/", {"gpu_type": "H 100", "gpus": "-1"}, follow=True)
    assert "The quota was not saved." in refused.content.decode()
    page = admin.get("/console/workspaces/team-a/").content.decode()
    assert 'data-quota="h100"' in page
    admin.post("/console/workspaces/team-a/quotas/h100/delete/")
    assert not GPUQuota.objects.filter(workspace=world.team_a).exists()


def test_an_admin_edits_a_workspaces_policies_and_assignment(world: World, signed_in: SignedIn) -> None:
    admin = signed_in(world.admin)
    admin.post("/console/cohorts/", {"name": "research"})
    form = {
        "display_name": "Team A",
        "assignee_kind": "team",
        "assigned_group": "team-a",
        "max_instances": "5",
        "max_notebooks": "3",
        "cpu_cores": "64",
        "memory_gb": "256",
        "fair_share_weight": "2.5",
        "cohort": "research",
        "can_borrow": "on",
        "allowed_gpu_types": "h100, a100",
        "max_runtime_s": "",
    }
    response = admin.post("/console/workspaces/team-a/", form)
    assert response["Location"] == "/console/workspaces/team-a/"
    workspace = Workspace.objects.get(name="team-a")
    assert workspace.cohort == Cohort.objects.get(name="research") and workspace.can_borrow
    assert workspace.fair_share_weight == Decimal("2.5") and workspace.allowed_gpu_types == ["h100", "a100"]
    missing_group = admin.post("/console/workspaces/team-a/", {**form, "assigned_group": ""})
    assert missing_group.status_code == 400 and "Name the group of the team." in missing_group.content.decode()
    created = admin.post(
        "/console/workspaces/new/", {**form, "name": "team-c", "assignee_kind": "", "assigned_group": ""}
    )
    assert created["Location"] == "/console/workspaces/team-c/"


def test_an_admin_manages_users_and_groups(world: World, signed_in: SignedIn) -> None:
    admin = signed_in(world.admin)
    admin.post("/console/people/groups/", {"name": "vision"})
    weak = admin.post("/console/people/users/new/", {"username": "dana", "password": "123"})
    assert weak.status_code == 400 and "This password is too short" in weak.content.decode()
    admin.post(
        "/console/people/users/new/",
        {"username": "dana", "password": "a-long-passphrase-9", "groups": ["vision", "team-a"], "is_active": "on"},
    )
    dana = get_user_model().objects.get(username="dana")
    assert dana.check_password("a-long-passphrase-9") and {g.name for g in dana.groups.all()} == {"vision", "team-a"}
    admin.post("/console/people/users/dana/deactivate/")
    dana.refresh_from_db()
    assert not dana.is_active
    refused = admin.post("/console/people/groups/team-a/delete/", follow=True).content.decode()
    assert "Group team-a is assigned to workspace team-a; reassign it first." in refused
    admin.post("/console/people/groups/vision/delete/")
    assert not Group.objects.filter(name="vision").exists()


def test_the_cluster_dashboard_shows_the_queue_utilisation_and_holders(
    world: World, signed_in: SignedIn, committed: Any
) -> None:
    with committed():
        check_submit_job(
            world.team_a,
            name="big",
            command="true",
            gpu_type="h100",
            gpus_per_replica=Decimal(4),
            acting_user=world.alice,
        )
    with committed():
        check_submit_job(
            world.team_a,
            name="waits",
            command="true",
            gpu_type="h100",
            gpus_per_replica=Decimal(1),
            acting_user=world.alice,
        )
    admin = signed_in(world.admin)
    waiting = Job.objects.get(name="waits")
    page = admin.get("/console/").content.decode()
    assert "waits" in page and waiting.wait_reason.split(":")[0] in page
    assert "local" in page and "4 / 8" in page  # the cluster: 4 of 8 H100 held
    inventory = admin.get("/console/inventory/").content.decode()
    assert inventory.count("job <strong>big</strong>") == 4
    data = admin.get("/console/usage.json").json()
    assert data["limits"] == {"h100": 8.0}


def test_console_lists_cost_the_same_queries_for_many_rows(world: World, signed_in: SignedIn, committed: Any) -> None:
    admin = signed_in(world.admin)
    before = {url: queries(admin, url) for url in ("/console/", "/console/inventory/", "/console/workspaces/")}
    for i in range(6):
        with committed():
            check_submit_job(
                world.team_a,
                name=f"j{i}",
                command="true",
                gpu_type="h100",
                gpus_per_replica=Decimal(1),
                acting_user=world.alice,
            )
        Workspace.objects.create(name=f"extra-{i}")
    assert {url: queries(admin, url) for url in before} == before
