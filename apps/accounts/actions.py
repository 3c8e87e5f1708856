"""State changes of users and groups."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction

from apps.accounts.api_tokens import revoke_all
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


def do_end_sso_access(user: Any, *, reason: str, acting_user: Any = None, origin: Origin = SYSTEM) -> None:
    """End every way in that `user` holds besides the identity provider, which no longer signs them
    in: their password is made unusable (they sign in through the provider, and have none), which
    ends all their sessions, changes their credential stamp (apps/accounts/stamps.py: their
    notebooks' sign-ins and their workloads' tokens end) and, through apps/accounts/signals.py,
    revokes their personal tokens and the CLI sign-ins they allowed, all with `reason`. The
    break-glass admin keeps a password they have: only their tokens are revoked."""
    with transaction.atomic():
        user = get_user_model().objects.select_for_update().get(pk=user.pk)
        if user.get_username() == settings.PORTAL_BREAK_GLASS_ADMIN and user.has_usable_password():
            revoke_all(user, reason=reason, acting_user=acting_user, origin=origin)
        else:
            user.set_unusable_password()
            user._credentials_change_reason = reason
            user.save(update_fields=["password"])
        data = {"from": "sso", "access_ended": reason}
        do_log_event(Event.USER_UPDATE, user, acting_user=acting_user, origin=origin, data=data)


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
