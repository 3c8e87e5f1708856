"""Admins curate compute and notebook profiles; a published profile is visible at once, and a
published notebook profile's environment is built at once, in the background (a provisioning
worker's task), so that its first notebook does not wait for it."""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models.deletion import ProtectedError

from apps.audit.actions import SYSTEM, Origin, apply_changes, do_log_event
from apps.audit.events import Event
from apps.catalog.models import ComputeProfile, InferenceProfile, NotebookProfile
from apps.errors import ActionError, Conflict
from apps.scheduling.trigger import request_prebuild

P = TypeVar("P", ComputeProfile, NotebookProfile)

#: A published notebook profile's environment is built again when one of these changes.
PREBUILT_BY = frozenset({"published", "python_packages"})


class ProfileEvents(NamedTuple):
    """The audit events of one kind of profile."""

    create: Event
    update: Event
    publish: Event
    delete: Event


EVENTS: dict[type[ComputeProfile | NotebookProfile | InferenceProfile], ProfileEvents] = {
    ComputeProfile: ProfileEvents(
        Event.COMPUTE_PROFILE_CREATE,
        Event.COMPUTE_PROFILE_UPDATE,
        Event.COMPUTE_PROFILE_PUBLISH,
        Event.COMPUTE_PROFILE_DELETE,
    ),
    NotebookProfile: ProfileEvents(
        Event.NOTEBOOK_PROFILE_CREATE,
        Event.NOTEBOOK_PROFILE_UPDATE,
        Event.NOTEBOOK_PROFILE_PUBLISH,
        Event.NOTEBOOK_PROFILE_DELETE,
    ),
    InferenceProfile: ProfileEvents(
        Event.INFERENCE_PROFILE_CREATE,
        Event.INFERENCE_PROFILE_UPDATE,
        Event.INFERENCE_PROFILE_PUBLISH,
        Event.INFERENCE_PROFILE_DELETE,
    ),
}


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
        events = EVENTS[type(profile)]
        event = events.create if created else (events.publish if changed.get("published") is True else events.update)
        do_log_event(event, profile, acting_user=acting_user, origin=origin, data=changed)
        if _to_prebuild(profile, created, changed):
            request_prebuild([profile.pk])  # its environment is built now, before anyone waits for it
    return profile


def _to_prebuild(profile: Any, created: bool, changed: dict[str, Any]) -> bool:
    """Whether a saved profile's environment is to be built now: a notebook profile just published,
    or published and given other packages (where the portal builds environments ahead)."""
    if not isinstance(profile, NotebookProfile) or not profile.published:
        return False
    return bool(settings.PORTAL_PREBUILD_ENVIRONMENTS and (created or changed.keys() & PREBUILT_BY))


def do_delete_profile(
    profile: ComputeProfile | NotebookProfile | InferenceProfile, *, acting_user: Any, origin: Origin = SYSTEM
) -> None:
    """Delete a profile nothing was ever launched from; otherwise unpublish it instead."""
    with transaction.atomic():
        do_log_event(EVENTS[type(profile)].delete, profile, acting_user=acting_user, origin=origin)
        try:
            with transaction.atomic():
                profile.delete()
        except ProtectedError:
            raise Conflict(
                f"Profile {profile.name} has been used by instances, notebooks or endpoints; unpublish it instead."
            ) from None
