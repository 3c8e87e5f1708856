"""Admins curate compute and notebook profiles; a published profile is visible at once."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db import IntegrityError, transaction
from django.db.models.deletion import ProtectedError

from apps.api.errors import ActionError, Conflict
from apps.audit.actions import SYSTEM, Origin, apply_changes, do_log_event
from apps.catalog.models import ComputeProfile, NotebookProfile

P = TypeVar("P", ComputeProfile, NotebookProfile)


def do_save_profile(profile: P, *, acting_user: Any, origin: Origin = SYSTEM, **fields: Any) -> P:
    """Create (an unsaved profile) or change a profile; `visible_to` is a list of groups."""
    visible_to = fields.pop("visible_to", None)
    created = profile.pk is None
    with transaction.atomic():
        changed = apply_changes(profile, fields)
        try:
            with transaction.atomic():
                profile.save()
        except IntegrityError:
            raise ActionError(f"A profile named {profile.name} already exists.", field="name") from None
        if visible_to is not None:
            profile.visible_to.set(visible_to)
            changed["visible_to"] = sorted(g.name for g in visible_to)
        kind = profile._meta.model_name
        verb = "create" if created else ("publish" if changed.get("published") is True else "update")
        do_log_event(f"{kind}.{verb}", profile, acting_user=acting_user, origin=origin, data=changed)
    return profile


def do_delete_profile(profile: ComputeProfile | NotebookProfile, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    """Delete a profile nothing was ever launched from; otherwise unpublish it instead."""
    with transaction.atomic():
        do_log_event(f"{profile._meta.model_name}.delete", profile, acting_user=acting_user, origin=origin)
        try:
            with transaction.atomic():
                profile.delete()
        except ProtectedError:
            raise Conflict(
                f"Profile {profile.name} has been used by instances or notebooks; unpublish it instead."
            ) from None
