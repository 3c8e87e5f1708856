from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import models
from django.http import HttpRequest

from apps.accounts.addresses import client_address
from apps.audit.events import Event
from apps.audit.models import AuditEvent


@dataclass(frozen=True)
class Origin:
    """Where a request came from, for the audit trail."""

    via: str = AuditEvent.Via.SYSTEM
    ip_address: str | None = None

    @classmethod
    def from_request(cls, request: HttpRequest, via: str = AuditEvent.Via.API) -> Origin:
        agent = request.headers.get("User-Agent", "")
        if via == AuditEvent.Via.API and agent.startswith("gpuportal-cli"):
            via = AuditEvent.Via.CLI
        # Behind the notebook proxy every request comes from the proxy: the client is the address it
        # forwards (apps/accounts/addresses.py), taken only from a trusted proxy.
        return cls(via=via, ip_address=client_address(request))


SYSTEM = Origin()


def do_log_event(
    action: Event,
    target: models.Model,
    *,
    acting_user: Any = None,
    origin: Origin = SYSTEM,
    workspace: Any = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Record one state change. Call it inside the transaction that makes the change.

    `action` is a member of `Event`; anything else, a string of a known value included, is refused
    (`TypeError`), so every place that writes an event type names it."""
    if not isinstance(action, Event):
        raise TypeError(f"An audit event type is a member of apps.audit.events.Event, not {action!r}.")
    user = acting_user if getattr(acting_user, "is_authenticated", False) else None
    return AuditEvent.objects.create(
        actor=user,
        actor_name=user.get_username() if user else "",
        action=action.value,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        target_repr=str(target)[:300],
        workspace=workspace,
        data=data or {},
        via=origin.via,
        ip_address=origin.ip_address,
    )


def apply_changes(obj: models.Model, fields: dict[str, Any]) -> dict[str, Any]:
    """Apply `fields` to `obj` and return the ones that changed, for the audit trail."""
    changed: dict[str, Any] = {}
    for name, value in fields.items():
        if getattr(obj, name) != value:
            setattr(obj, name, value)
            changed[name] = value if isinstance(value, (str, int, bool, list, type(None))) else str(value)
    return changed


def do_log_failed_sign_in(username: str, *, origin: Origin = SYSTEM) -> AuditEvent:
    """A failed sign-in: no one acted, and the target is the username tried (the account, if one has
    that name)."""
    pk = get_user_model().objects.filter(username=username).values_list("pk", flat=True).first()
    return AuditEvent.objects.create(
        action=Event.SIGN_IN_FAILED.value,
        target_type="auth.user",
        target_id="" if pk is None else str(pk),
        target_repr=username[:150],
        via=origin.via,
        ip_address=origin.ip_address,
    )
