"""Platform admins set each workspace's disk quota (API and console); bad values are refused with a
message on the field, owners cannot change it, and a portal without quotas says so on every page."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.workspaces.checks import check_disk_quota
from apps.workspaces.models import GIB, Workspace, WorkspaceDisk
from tests.personas import World

WARNING = "Workspaces have no disk quota:"


@pytest.mark.parametrize("value", [0, -1, 16_001, "lots", 1.5, None, True])
def test_a_bad_quota_is_refused_with_a_message_on_the_field(world: World, value: Any) -> None:
    answer = world.client(world.admin).patch("/api/v1/workspaces/team-a/", {"disk_gb": value}, format="json")

    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["fields"]["disk_gb"]
    assert Workspace.objects.get(name="team-a").disk_gb == 50


def test_an_admin_sets_it_and_a_new_workspace_gets_the_settings_default(world: World, settings: Any) -> None:
    admin = world.client(world.admin)
    settings.PORTAL_WORKSPACE_DISK_GB = 7

    changed = admin.patch("/api/v1/workspaces/team-a/", {"disk_gb": 200}, format="json")
    created = admin.post("/api/v1/workspaces/", {"name": "lab"}, format="json")

    assert changed.status_code == 200 and changed.json()["disk_gb"] == 200
    assert created.status_code == 201 and created.json()["disk_gb"] == 7 and created.json()["disk"] is None
    assert Workspace.objects.get(name="team-a").disk_gb == 200


def test_an_owner_may_not_change_it(world: World) -> None:
    answer = world.client(world.alice).patch("/api/v1/workspaces/team-a/", {"disk_gb": 500}, format="json")

    assert answer.status_code == 403
    assert Workspace.objects.get(name="team-a").disk_gb == 50


def test_a_smaller_quota_than_the_files_take_is_refused(world: World) -> None:
    WorkspaceDisk.objects.create(
        workspace=world.team_a, size_bytes=50 * GIB, used_bytes=3 * GIB + 1, measured_at=timezone.now()
    )
    admin = world.client(world.admin)

    refused = admin.patch("/api/v1/workspaces/team-a/", {"disk_gb": 3}, format="json")
    allowed = admin.patch("/api/v1/workspaces/team-a/", {"disk_gb": 4}, format="json")

    assert refused.status_code == 400
    assert refused.json()["error"]["fields"]["disk_gb"] == [
        "The workspace's files take 4 GB of its disk: free space there before lowering its quota below that."
    ]
    assert allowed.status_code == 200 and allowed.json()["disk_gb"] == 4


def _form(workspace: Workspace, **changes: Any) -> dict[str, Any]:
    """The console's workspace form as it comes filled in for ``workspace``."""
    fields = ("display_name", "description", "max_instances", "max_notebooks", "cpu_cores", "memory_gb", "disk_gb")
    form = {name: getattr(workspace, name) for name in fields}
    form.update(
        assignee_kind=workspace.assignee_kind,
        assigned_group=workspace.assigned_group.name if workspace.assigned_group else "",
        fair_share_weight=str(workspace.fair_share_weight),
    )
    return {**form, **changes}


def test_the_console_form_sets_it_and_shows_what_is_wrong(world: World) -> None:
    client = Client()
    client.force_login(world.admin)
    url = "/console/workspaces/team-a/"
    assert 'name="disk_gb"' in client.get(url).content.decode()

    refused = client.post(url, _form(world.team_a, disk_gb="0"))
    saved = client.post(url, _form(world.team_a, disk_gb="120"))

    assert refused.status_code == 400
    assert 'id="disk_gb-error"' in refused.content.decode() and "greater than or equal to 1" in refused.content.decode()
    assert saved.status_code == 302
    world.team_a.refresh_from_db()
    assert world.team_a.disk_gb == 120 and world.team_a.assigned_group and world.team_a.assigned_group.name == "team-a"


def test_every_page_warns_while_workspaces_have_no_disk_quota(world: World, settings: Any) -> None:
    client = Client()
    client.force_login(world.alice)
    assert WARNING not in client.get("/w/team-a/").content.decode()
    assert check_disk_quota() == []

    settings.PORTAL_DISK_QUOTA = "off"

    page = client.get("/w/team-a/").content.decode()
    assert WARNING in page and "PORTAL_DISK_QUOTA=on" in page
    assert "This portal gives workspaces no disk quota" in page
    assert [message.id for message in check_disk_quota()] == ["gpuportal.W003"]
    assert WARNING not in Client().get("/login/").content.decode()
