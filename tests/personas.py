"""The people and places every test shares: alice and bob in team A, charlie in team B,
victor who may only look at team A, and a platform admin. One node with 8 declared H100."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from apps.accounts.api_tokens import do_create_token
from apps.catalog.models import ComputeProfile, NotebookProfile
from apps.inventory.actions import do_sync_local_cluster
from apps.inventory.discovery import parse_declared
from apps.workspaces.actions import ensure_private_workspace
from apps.workspaces.models import GPUQuota, Membership, Role, Workspace

PASSWORD = "correct-horse-battery-staple"


@dataclass
class World:
    admin: Any
    alice: Any
    bob: Any
    charlie: Any
    victor: Any
    team_a: Workspace
    team_b: Workspace
    gpu_1: ComputeProfile
    cpu_small: ComputeProfile
    minimal: NotebookProfile

    def client(self, user: Any) -> APIClient:
        """An API client that signs in with a personal token of the user's, as the CLI and SDK do (one
        per user, made on first use)."""
        tokens = self.__dict__.setdefault("_tokens", {})
        if user.pk not in tokens:
            tokens[user.pk] = api_token(user)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {tokens[user.pk]}")
        return client


def api_token(user: Any, name: str = "tests", **options: Any) -> str:
    """A new personal API token of the user's: read-write, for all their workspaces, unless told."""
    return do_create_token(user, name=name, expires_in_days=30, acting_user=user, **options)[1]


def _user(username: str, *, staff: bool = False, groups: tuple[Group, ...] = ()) -> Any:
    user = get_user_model().objects.create_user(
        username, f"{username}@example.org", PASSWORD, is_staff=staff, is_superuser=staff
    )
    user.groups.set(groups)
    ensure_private_workspace(user)
    return user


def _team_workspace(name: str, group: Group, *, h100: int, max_instances: int = 3) -> Workspace:
    workspace = Workspace.objects.create(
        name=name,
        assignee_kind=Workspace.Assignee.TEAM,
        assigned_group=group,
        max_instances=max_instances,
        max_notebooks=3,
        cpu_cores=256,
        memory_gb=2048,
    )
    GPUQuota.objects.create(workspace=workspace, gpu_type="h100", gpus=Decimal(h100))
    return workspace


def make_world() -> World:
    do_sync_local_cluster(parse_declared("8xh100"))
    group_a = Group.objects.create(name="team-a")
    group_b = Group.objects.create(name="team-b")
    world = World(
        admin=_user("admin", staff=True),
        alice=_user("alice", groups=(group_a,)),
        bob=_user("bob", groups=(group_a,)),
        charlie=_user("charlie", groups=(group_b,)),
        victor=_user("victor"),
        team_a=_team_workspace("team-a", group_a, h100=4),
        team_b=_team_workspace("team-b", group_b, h100=4),
        gpu_1=ComputeProfile.objects.create(
            name="gpu-1", gpu_type="h100", gpu_count=Decimal("1"), cpu_cores=8, memory_gb=64, published=True
        ),
        cpu_small=ComputeProfile.objects.create(name="cpu-small", cpu_cores=2, memory_gb=8, published=True),
        minimal=NotebookProfile.objects.create(
            name="minimal", image="quay.io/jupyter/minimal-notebook", python_packages=["jupyterlab"], published=True
        ),
    )
    Membership.objects.create(workspace=world.team_a, user=world.alice, role=Role.OWNER)
    Membership.objects.create(workspace=world.team_a, user=world.victor, role=Role.VIEWER)
    return world
