"""State changes of users and groups."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction

from apps.audit.actions import SYSTEM, Origin, apply_changes, do_log_event
from apps.audit.events import Event
from apps.errors import ActionError, Conflict
from apps.workspaces.models import Workspace


def do_save_user(user: Any, *, acting_user: Any, origin: Origin = SYSTEM, **fields: Any) -> Any:
    """Create (an unsaved user) or change a user; `password` is hashed, `groups` replaces theirs."""
    password = fields.pop("password", None)
    groups = fields.pop("groups", None)
    created = user.pk is None
    with transaction.atomic():
        changed = apply_changes(user, fields)
        if password:
            user.set_password(password)
            changed["password"] = "changed"
        elif created:
            user.set_unusable_password()
        if user.pk is not None and user.pk == getattr(acting_user, "pk", None) and fields.get("is_staff") is False:
            raise Conflict("You cannot remove your own platform-admin rights.", field="is_staff")
        try:
            with transaction.atomic():
                user.save()
        except IntegrityError:
            raise ActionError(f"A user named {user.username} already exists.", field="username") from None
        if groups is not None:
            user.groups.set(groups)
            changed["groups"] = sorted(g.name for g in groups)
        event = Event.USER_CREATE if created else Event.USER_UPDATE
        do_log_event(event, user, acting_user=acting_user, origin=origin, data=changed)
    return user


def do_deactivate_user(user: Any, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    """Users are deactivated, never deleted, so the audit trail keeps who did what."""
    if user.pk == getattr(acting_user, "pk", None):
        raise Conflict("You cannot deactivate yourself.")
    with transaction.atomic():
        user.is_active = False
        user.save(update_fields=["is_active"])
        do_log_event(Event.USER_DEACTIVATE, user, acting_user=acting_user, origin=origin)


def do_save_group(group: Group, *, acting_user: Any, origin: Origin = SYSTEM, **fields: Any) -> Group:
    created = group.pk is None
    with transaction.atomic():
        changed = apply_changes(group, fields)
        try:
            with transaction.atomic():
                group.save()
        except IntegrityError:
            raise ActionError(f"A group named {group.name} already exists.", field="name") from None
        event = Event.GROUP_CREATE if created else Event.GROUP_UPDATE
        do_log_event(event, group, acting_user=acting_user, origin=origin, data=changed)
    return group


def do_delete_group(group: Group, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    """Delete a group that no workspace is assigned to (a team workspace needs its group)."""
    assigned = sorted(Workspace.objects.filter(assigned_group=group).values_list("name", flat=True))
    if assigned:
        raise Conflict(f"Group {group.name} is assigned to workspace {', '.join(assigned)}; reassign it first.")
    with transaction.atomic():
        do_log_event(Event.GROUP_DELETE, group, acting_user=acting_user, origin=origin)
        group.delete()
