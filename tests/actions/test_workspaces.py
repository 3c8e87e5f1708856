"""Private workspaces on first sign-in, and the quota settings they start with."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.audit.models import AuditEvent
from apps.workspaces.actions import ensure_private_workspace, parse_gpu_quota
from apps.workspaces.models import Membership, Role, Workspace
from tests.personas import PASSWORD, World


def new_user(username: str) -> Any:
    return get_user_model().objects.create_user(username, f"{username}@example.org", PASSWORD)


def private_workspaces(user: Any) -> Any:
    return Workspace.objects.filter(kind=Workspace.Kind.PRIVATE, assigned_user=user)


def test_it_creates_a_private_workspace_on_first_sign_in(world: World, settings: Any) -> None:
    settings.PORTAL_PRIVATE_GPU_QUOTA = "h100=2, a100=0.5"
    settings.PORTAL_PRIVATE_MAX_INSTANCES = 3
    settings.PORTAL_PRIVATE_MAX_NOTEBOOKS = 5
    settings.PORTAL_PRIVATE_CPU_CORES = 12
    settings.PORTAL_PRIVATE_MEMORY_GB = 48
    dora = new_user("dora")
    assert not private_workspaces(dora).exists()

    assert Client().login(username="dora", password=PASSWORD)

    [workspace] = private_workspaces(dora)
    assert (workspace.name, workspace.display_name) == ("dora", "dora's workspace")
    assert (workspace.assignee_kind, workspace.assigned_user) == (Workspace.Assignee.USER, dora)
    limits = (workspace.max_instances, workspace.max_notebooks, workspace.cpu_cores, workspace.memory_gb)
    assert limits == (3, 5, 12, 48)
    quotas = {q.gpu_type: q.gpus for q in workspace.gpu_quotas.all()}
    assert quotas == {"h100": Decimal("2"), "a100": Decimal("0.5")}
    assert Membership.objects.get(workspace=workspace).user == dora
    assert Membership.objects.get(workspace=workspace).role == Role.OWNER
    [event] = AuditEvent.objects.filter(action="workspace.create", workspace=workspace)
    assert (event.actor, event.data) == (dora, {"private": True})


def test_it_creates_the_private_workspace_only_once(world: World) -> None:
    new_user("dora")
    for _ in range(3):
        assert Client().login(username="dora", password=PASSWORD)

    assert Workspace.objects.filter(kind=Workspace.Kind.PRIVATE, name__startswith="dora").count() == 1
    assert AuditEvent.objects.filter(action="workspace.create", target_repr__startswith="dora").count() == 1


def test_it_keeps_the_private_workspace_of_a_persona(world: World) -> None:
    before = private_workspaces(world.alice).get()

    assert Client().login(username="alice", password=PASSWORD)

    assert private_workspaces(world.alice).get() == before


def test_it_picks_a_free_name_for_a_private_workspace(world: World) -> None:
    user = new_user("Team-A")

    assert ensure_private_workspace(user).name == "team-a-2"


@pytest.mark.parametrize(
    "username, name",
    [
        ("Dora.Explorer@example.org", "dora-explorer-example-org"),
        ("___", "user"),
        ("a" * 49 + ".b", "a" * 49),
        ("x" * 80, "x" * 50),
    ],
)
def test_it_makes_a_valid_workspace_name_of_any_username(world: World, username: str, name: str) -> None:
    workspace = ensure_private_workspace(new_user(username))

    assert workspace.name == name
    workspace.full_clean()


def test_it_parses_a_default_gpu_quota() -> None:
    assert parse_gpu_quota("") == {}
    assert parse_gpu_quota("h100=1, a100-80gb=0.5,") == {"h100": Decimal("1"), "a100-80gb": Decimal("0.5")}


@pytest.mark.parametrize("spec", ["h100", "h100=two", "H100=1", "h100=-1", "=1", "h100=nan", "h100=inf"])
def test_it_refuses_a_bad_default_gpu_quota(spec: str) -> None:
    with pytest.raises(ValueError, match="expected TYPE=COUNT, e.g. h100=2"):
        parse_gpu_quota(spec)
