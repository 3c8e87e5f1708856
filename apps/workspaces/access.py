"""The one access layer: which workspaces, and so which tenant objects, a user may see or change.

Every queryset of tenant data passes through `restrict()`. Objects outside it are simply not
found (404), so a user learns nothing about other tenants' objects.

A workload's token (apps/accounts/tokens.py) presents its user scoped to one workspace
(`workspace_scope`): there, the user's own role (an owner's, for a platform admin); elsewhere, none.

An instance can be shared with a collaborator (apps/compute/models.py, `Collaborator`) who is no
member of its workspace: a model that names the way to its collaborators (`COLLABORATORS`: the
instance, and its notebooks) is found for them too. Read access lets them see it (VIEW); write
access lets them work in it (USE: open and start its notebooks, take its kubeconfig). Nothing
changes the instance itself for them (CHANGE), and nothing else of the workspace is found.
Collaborations are a person's: a workload's token, bound to its own workspace, carries none of
its user's.

What runs in a shared workload never holds one person's credential. The token of an instance
that has collaborators, and of the notebooks on it, is confined to that instance
(`instance_scope`, decided at each request since sharing changes while it runs): it acts as a
collaborator of that instance would, with the weakest access any collaborator holds (and never
more than its launcher's own), and holds no role in the workspace. Without collaborators it acts
for its launcher in its workspace again. Whatever it acts as, a workload's token never
administers anything: memberships, sharing, invitations, tokens and a workspace's settings are
refused to it whatever the role (apps/api/permissions.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from django.db.models import Model, Q, QuerySet

from apps.workspaces.models import ROLE_RANK, Membership, Role, Workspace

M = TypeVar("M", bound=Model)

# What each action needs.
VIEW = Role.VIEWER
CHANGE = Role.MEMBER
MANAGE = Role.OWNER
# Work in a shared object (open a notebook, start one on an instance, take a kubeconfig): a
# member's role in the workspace, or a collaborator's write access to that object.
USE = "use"

# The collaborator access that grants each role, for the models that are shared.
_COLLABORATOR_ACCESS = {VIEW: ("read", "write"), USE: ("write",)}


def _roles_at_least(role: str) -> list[str]:
    return [r for r, rank in ROLE_RANK.items() if rank >= ROLE_RANK[Role(role)]]


def _scope(user: Any) -> int | None:
    """The one workspace a workload's token may act in, or None for a user's own credentials."""
    return getattr(user, "workspace_scope", None)


def _confined(user: Any) -> tuple[int, str] | None:
    """The one instance a shared workload's token may act on, and the collaborator access it acts
    with there ("read", "write", or "" for none); None for any other credential."""
    instance = getattr(user, "instance_scope", None)
    return None if instance is None else (instance, getattr(user, "instance_access", ""))


def workspace_ids(user: Any, role: str = VIEW) -> QuerySet[Workspace]:
    """A subquery of the ids of the workspaces where `user` holds at least `role`."""
    role = CHANGE if role == USE else role
    if not getattr(user, "is_authenticated", False) or _confined(user) is not None:
        return Workspace.objects.none().values("pk")
    scope = _scope(user)
    if scope is not None and getattr(user, "owner_in_scope", False):
        return Workspace.objects.filter(pk=scope).values("pk")
    if user.is_staff:
        return Workspace.objects.values("pk")
    granted = Q(memberships__user=user, memberships__role__in=_roles_at_least(role)) | Q(assigned_user=user)
    if ROLE_RANK[Role(role)] <= ROLE_RANK[Role.MEMBER]:
        granted |= Q(assigned_group__in=user.groups.all())
    if scope is not None:
        granted &= Q(pk=scope)
    return Workspace.objects.filter(granted).values("pk")


def restrict(queryset: QuerySet[M], user: Any, role: str = VIEW, *, field: str = "workspace") -> QuerySet[M]:
    """Narrow a queryset of tenant objects to those in workspaces where `user` holds `role`, and,
    for a shared model, those shared with `user` with the access `role` needs."""
    if getattr(user, "is_staff", False) and getattr(user, "is_authenticated", False) and _scope(user) is None:
        return queryset
    if queryset.model is Workspace:
        return queryset.filter(pk__in=workspace_ids(user, role))
    granted = Q(**{f"{field}__in": workspace_ids(user, role)})
    shared = collaborator_grant(queryset.model, user, role)
    return queryset.filter(granted | shared if shared is not None else granted)


def collaborator_grant(model: type[Model], user: Any, role: str) -> Q | None:
    """The rows of `model` shared with `user` with the access `role` needs, or None."""
    from apps.compute.models import Collaborator  # the compute app builds on this one

    field = getattr(model, "COLLABORATORS", None)
    access = _COLLABORATOR_ACCESS.get(role)
    if field is None or access is None or not getattr(user, "is_authenticated", False):
        return None
    confined = _confined(user)
    if confined is not None:  # a shared workload's token: its own instance, as a collaborator
        instance_id, held = confined
        return Q(**{field: instance_id}) if held in access else None
    if _scope(user) is not None:
        return None
    instances = Collaborator.objects.filter(user=user, access__in=access).values("instance_id")
    return Q(**{f"{field}__in": instances})


def may(user: Any, obj: Model, role: str) -> bool:
    """Whether `user` holds `role` on this one object: its workspace's role, or a collaborator's
    access to it. The check for an action on an object that may be shared."""
    return restrict(type(obj)._default_manager.filter(pk=obj.pk), user, role).exists()


def role_in(user: Any, workspace: Workspace) -> str | None:
    """The user's strongest role in the workspace, or None."""
    return roles_in(user, [workspace.pk])[workspace.pk]


def roles_in(user: Any, ids: Iterable[int]) -> dict[int, str | None]:
    """`role_in()` for the workspaces with these ids, in three queries: for lists."""
    held: dict[int, set[str]] = {pk: set() for pk in ids}
    if not getattr(user, "is_authenticated", False) or _confined(user) is not None:
        return dict.fromkeys(held)
    scope = _scope(user)
    if scope is not None and getattr(user, "owner_in_scope", False):
        return {pk: Role.OWNER if pk == scope else None for pk in held}
    if user.is_staff:
        return dict.fromkeys(held, Role.OWNER)
    asked = list(held)
    if scope is not None:
        held = {pk: roles for pk, roles in held.items() if pk == scope}
    for pk, role in Membership.objects.filter(user=user, workspace_id__in=held).values_list("workspace_id", "role"):
        held[pk].add(role)
    groups = set(user.groups.values_list("pk", flat=True))
    assignees = Workspace.objects.filter(pk__in=held).values_list("pk", "assigned_user_id", "assigned_group_id")
    for pk, assigned_user, assigned_group in assignees:
        if assigned_user == user.pk:
            held[pk].add(Role.OWNER)
        elif assigned_group in groups:
            held[pk].add(Role.MEMBER)
    strongest = {pk: max(roles, key=lambda r: ROLE_RANK[Role(r)]) if roles else None for pk, roles in held.items()}
    return {pk: strongest.get(pk) for pk in asked}


def can(user: Any, workspace: Workspace, role: str) -> bool:
    held = role_in(user, workspace)
    return held is not None and ROLE_RANK[Role(held)] >= ROLE_RANK[Role(role)]
