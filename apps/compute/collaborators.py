"""An instance's collaborators: people given that one instance (and its notebooks and kubeconfig),
not its workspace. They come in by invitation (apps/invitations); its workspace's members change
their access and remove them. A removal takes effect at once: the access layer finds nothing for
them from then on (apps/workspaces/access.py), so their next API call, page, live message and
notebook request through the proxy are refused."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from apps.audit.actions import SYSTEM, Origin, do_log_event
from apps.audit.events import Event
from apps.compute.models import Collaborator, Instance
from apps.errors import ActionError, Conflict
from apps.workspaces.live import notify


def _check_access(access: str) -> None:
    if access not in Collaborator.Access.values:
        raise ActionError("Choose read (look only) or write (open its notebooks, its kubeconfig).", field="access")


def do_set_collaborator(
    instance: Instance, user: Any, access: str, *, acting_user: Any, origin: Origin = SYSTEM
) -> Collaborator:
    """Share the instance with `user`, or change their access to it."""
    _check_access(access)
    with transaction.atomic():
        instance = Instance.objects.select_for_update().select_related("workspace").get(pk=instance.pk)
        if instance.state not in Instance.LIVE_STATES:
            raise Conflict(f"Instance {instance.name} has ended: there is nothing to share.")
        collaborator, created = Collaborator.objects.get_or_create(
            instance=instance, user=user, defaults={"access": access, "added_by": acting_user}
        )
        if not created and collaborator.access != access:
            collaborator.access = access
            collaborator.save(update_fields=["access"])
        do_log_event(
            Event.COLLABORATOR_SET,
            collaborator,
            acting_user=acting_user,
            origin=origin,
            workspace=instance.workspace,
            data={"instance": instance.name, "user": user.get_username(), "access": access},
        )
        # Their open pages hear it (and a page of someone now read-only closes its socket).
        notify(instance.workspace_id, "collaborator", {"id": collaborator.pk}, instance_id=instance.pk)
    return collaborator


def do_remove_collaborator(collaborator: Collaborator, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    with transaction.atomic():
        collaborator = (
            Collaborator.objects.select_for_update().select_related("instance", "user").get(pk=collaborator.pk)
        )
        instance, pk = collaborator.instance, collaborator.pk
        do_log_event(
            Event.COLLABORATOR_REMOVE,
            collaborator,
            acting_user=acting_user,
            origin=origin,
            workspace=instance.workspace,
            data={"instance": instance.name, "user": collaborator.user.get_username()},
        )
        collaborator.delete()
        # The next message to their open pages finds them gone, and closes the socket.
        notify(instance.workspace_id, "collaborator", {"id": pk}, instance_id=instance.pk)
