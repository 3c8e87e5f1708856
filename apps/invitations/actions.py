"""Inviting someone to a workspace, or to one instance, by email, and their acceptance.

An owner invites an address to the workspace with a role; a member (or owner) invites one to an
instance, as its collaborator with read or write access (apps/compute/collaborators.py). The
portal mails a link that carries a secret (only its SHA-256 is kept). Sending it again mails a new
link; the old one stops working, and says that a newer one replaced it. The link is good once, for
`PORTAL_INVITATION_DAYS` days, until withdrawn, and only for an account with that address: one
that has it already (a local account, or one from the identity provider), or, without single
sign-on, one the invitee makes from the link. Accepting gives the role (never lowering one the
user holds already), or the instance's access.

Sending is limited per inviting user and per workspace, per hour (`PORTAL_INVITATIONS_PER_*_HOUR`),
counted from the audit log: an invitation made or sent again counts once.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
from datetime import timedelta
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.template.loader import render_to_string
from django.utils import timezone

from apps.audit.actions import SYSTEM, Origin, do_log_event
from apps.audit.events import Event
from apps.audit.models import AuditEvent
from apps.compute.collaborators import do_set_collaborator
from apps.compute.models import Collaborator, Instance
from apps.errors import ActionError, Conflict, TooMany
from apps.invitations.models import Invitation, ReplacedLink
from apps.workspaces.actions import do_set_membership
from apps.workspaces.models import ROLE_RANK, Membership, Role, Workspace

logger = logging.getLogger(__name__)

SENDINGS = (Event.INVITATION_CREATE.value, Event.INVITATION_RESEND.value)
HOUR = timedelta(hours=1)


class Gone(ActionError):
    """The invitation was used, withdrawn or has expired."""

    status_code = HTTPStatus.GONE
    code = "gone"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def find(secret: str) -> Invitation | None:
    """The invitation a link's secret belongs to, whatever its state, also by a link that sending it
    again replaced (then its `by_replaced_link` is true); None for no such link."""
    if not secret or len(secret) > 100:
        return None
    rows = Invitation.objects.select_related("workspace", "instance", "invited_by")
    hashed = digest(secret)
    found = rows.filter(digest=hashed).first()
    if found is None:
        found = rows.filter(replaced_links__digest=hashed).first()
        if found is not None:
            found.by_replaced_link = True
    return found


def same_address(a: str, b: str) -> bool:
    return bool(a) and bool(b) and a.strip().casefold() == b.strip().casefold()


def _check_rate(workspace: Workspace, acting_user: Any) -> None:
    since = timezone.now() - HOUR
    sent = AuditEvent.objects.filter(action__in=SENDINGS, created_at__gt=since)
    for rows, limit, whose in (
        (sent.filter(actor=acting_user), settings.PORTAL_INVITATIONS_PER_USER_HOUR, "you"),
        (sent.filter(workspace=workspace), settings.PORTAL_INVITATIONS_PER_WORKSPACE_HOUR, f"workspace {workspace}"),
    ):
        times = list(rows.order_by("-created_at").values_list("created_at", flat=True)[:limit])
        if len(times) >= limit:
            wait = math.ceil((times[-1] + HOUR - timezone.now()).total_seconds())
            minutes = max(1, math.ceil(wait / 60))
            raise TooMany(
                f"{limit} invitations an hour is the most {whose} may send; try again in {minutes} minute"
                f"{'s' if minutes != 1 else ''}.",
                retry_after=max(1, wait),
            )


def _send(invitation: Invitation, secret: str, base_url: str) -> None:
    """Mail the link; a failure is kept on the invitation (shown, and it can be sent again)."""
    link = f"{base_url.rstrip('/')}/invitations/{secret}/"
    context = {"invitation": invitation, "link": link, "inviter": invitation.invited_by}
    message = EmailMessage(
        subject=f"{_inviter(invitation)} invited you to {_subject(invitation)} on GPU Portal",
        body=render_to_string("invitations/email.txt", context),
        to=[invitation.email],
    )
    try:
        message.send()
    except Exception as error:  # SMTP refused, unreachable, timed out...
        logger.warning("could not mail the invitation %s", invitation.pk, exc_info=True)
        Invitation.objects.filter(pk=invitation.pk).update(send_error=f"{type(error).__name__}: {error}"[:500])
        invitation.send_error = f"{type(error).__name__}: {error}"[:500]
        return
    now = timezone.now()
    Invitation.objects.filter(pk=invitation.pk).update(sent_at=now, send_error="")
    invitation.sent_at, invitation.send_error = now, ""


def _subject(invitation: Invitation) -> str:
    if invitation.instance_id is not None:
        return f"instance {invitation.instance.name} of {invitation.workspace}"
    return str(invitation.workspace)


def _inviter(invitation: Invitation) -> str:
    user = invitation.invited_by
    if user is None:
        return "An admin"
    return user.get_full_name() or user.get_username()


def do_invite(
    workspace: Workspace,
    email: str,
    role: str,
    *,
    base_url: str,
    acting_user: Any,
    origin: Origin = SYSTEM,
    instance: Instance | None = None,
    access: str = "",
) -> Invitation:
    """Invite `email` to the workspace with `role`, or to `instance` (of that workspace) with
    `access`, and mail the link. The caller has checked that the acting user may manage the
    workspace (for an instance: change it)."""
    if instance is not None:
        if instance.workspace_id != workspace.pk:
            raise ActionError(f"Instance {instance.name} is not in {workspace}.", field="instance")
        if access not in Collaborator.Access.values:
            raise ActionError("Choose read (look only) or write (open its notebooks, its kubeconfig).", field="access")
        role = ""
    elif role not in Role.values:
        raise ActionError("Choose owner, member or viewer.", field="role")
    elif access:
        raise ActionError("Access is for an invitation to an instance; give a role instead.", field="access")
    email = email.strip()
    secret = secrets.token_urlsafe(32)
    with transaction.atomic():
        Workspace.objects.select_for_update().filter(pk=workspace.pk).first()  # one sender at a time
        _check_rate(workspace, acting_user)
        if Membership.objects.filter(workspace=workspace, user__email__iexact=email, user__is_active=True).exists():
            raise Conflict(f"{email} is a member of {workspace} already.", field="email")
        if instance is not None:
            if instance.state not in Instance.LIVE_STATES:
                raise Conflict(f"Instance {instance.name} has ended: there is nothing to share.", field="instance")
            if Collaborator.objects.filter(instance=instance, user__email__iexact=email).exists():
                raise Conflict(f"{email} is a collaborator on {instance.name} already.", field="email")
        waiting = Invitation.objects.filter(
            workspace=workspace,
            instance=instance,
            email__iexact=email,
            accepted_at__isnull=True,
            withdrawn_at__isnull=True,
            expires_at__gt=timezone.now(),
        )
        if waiting.exists():
            to = f"instance {instance.name}" if instance is not None else str(workspace)
            raise Conflict(f"{email} has an invitation to {to} waiting: send it again instead.", field="email")
        invitation = Invitation.objects.create(
            workspace=workspace,
            instance=instance,
            email=email,
            role=role,
            access=access if instance is not None else "",
            digest=digest(secret),
            invited_by=acting_user,
            expires_at=timezone.now() + timedelta(days=settings.PORTAL_INVITATION_DAYS),
            times_sent=1,
        )
        do_log_event(
            Event.INVITATION_CREATE,
            invitation,
            acting_user=acting_user,
            origin=origin,
            workspace=workspace,
            data=_what(invitation),
        )
    _send(invitation, secret, base_url)
    return invitation


def do_resend(invitation: Invitation, *, base_url: str, acting_user: Any, origin: Origin = SYSTEM) -> Invitation:
    """Mail a pending invitation again, with a new link (the old one stops working) and a new expiry."""
    secret = secrets.token_urlsafe(32)
    with transaction.atomic():
        Workspace.objects.select_for_update().filter(pk=invitation.workspace_id).first()
        invitation = (
            Invitation.objects.select_for_update(of=("self",))
            .select_related("workspace", "instance")
            .get(pk=invitation.pk)
        )
        if invitation.state in (Invitation.State.ACCEPTED, Invitation.State.WITHDRAWN):
            raise Conflict(f"The invitation of {invitation.email} was {invitation.state}: it cannot be sent again.")
        _check_rate(invitation.workspace, acting_user)
        ReplacedLink.objects.create(invitation=invitation, digest=invitation.digest)
        invitation.digest = digest(secret)
        invitation.expires_at = timezone.now() + timedelta(days=settings.PORTAL_INVITATION_DAYS)
        invitation.times_sent += 1
        invitation.save(update_fields=["digest", "expires_at", "times_sent"])
        do_log_event(
            Event.INVITATION_RESEND,
            invitation,
            acting_user=acting_user,
            origin=origin,
            workspace=invitation.workspace,
            data={"email": invitation.email},
        )
    _send(invitation, secret, base_url)
    return invitation


def do_withdraw(invitation: Invitation, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    """Withdraw a pending invitation: its link stops working at once."""
    with transaction.atomic():
        invitation = Invitation.objects.select_for_update().select_related("workspace").get(pk=invitation.pk)
        if invitation.state == Invitation.State.ACCEPTED:
            whence = "the instance's collaborators" if invitation.instance_id else "the members"
            raise Conflict(f"{invitation.email} accepted already: remove them from {whence} instead.")
        if invitation.withdrawn_at is not None:
            return
        invitation.withdrawn_at = timezone.now()
        invitation.save(update_fields=["withdrawn_at"])
        do_log_event(
            Event.INVITATION_WITHDRAW,
            invitation,
            acting_user=acting_user,
            origin=origin,
            workspace=invitation.workspace,
            data={"email": invitation.email},
        )


def check_usable(invitation: Invitation | None) -> Invitation:
    """The invitation, if its link may still be used; else why not."""
    if invitation is None:
        raise ActionError("This invitation link is not valid: check that it was copied whole.")
    if invitation.state == Invitation.State.ACCEPTED:
        raise Gone("This invitation was accepted already; each link works once.")
    if invitation.state == Invitation.State.WITHDRAWN:
        raise Gone("This invitation was withdrawn. Ask whoever invited you for a new one.")
    if invitation.by_replaced_link:
        raise Gone(
            "This invitation link was replaced by a newer one when the invitation was sent again: use the "
            "link in the latest mail, or ask whoever invited you to send it again."
        )
    if invitation.state == Invitation.State.EXPIRED:
        raise Gone("This invitation has expired. Ask whoever invited you to send it again.")
    if invitation.instance is not None and invitation.instance.state not in Instance.LIVE_STATES:
        raise Gone(f"Instance {invitation.instance.name}, which this invitation shares, has ended.")
    return invitation


def do_accept(secret: str, user: Any, *, origin: Origin = SYSTEM) -> Invitation:
    """Accept an invitation as `user`, whose address must be the invited one."""
    with transaction.atomic():
        found = find(secret)
        locked = None
        if found is not None:
            rows = Invitation.objects.select_for_update(of=("self",)).select_related("workspace", "instance")
            locked = rows.filter(pk=found.pk).first()
            if locked is not None:
                locked.by_replaced_link = found.by_replaced_link  # a replaced link never accepts it
        invitation = check_usable(locked)
        if not same_address(user.email, invitation.email):
            raise ActionError(
                f"This invitation is for {invitation.email}, and you are signed in as {user.get_username()}"
                f"{f' ({user.email})' if user.email else ''}. Sign out, and sign in with that address's account."
            )
        workspace = invitation.workspace
        if invitation.instance is not None:
            held_access = Collaborator.objects.filter(instance=invitation.instance, user=user).first()
            if held_access is None or (held_access.access, invitation.access) == ("read", "write"):
                do_set_collaborator(invitation.instance, user, invitation.access, acting_user=user, origin=origin)
        else:
            held = Membership.objects.filter(workspace=workspace, user=user).values_list("role", flat=True).first()
            if held is None or ROLE_RANK[Role(held)] < ROLE_RANK[Role(invitation.role)]:
                do_set_membership(workspace, user, invitation.role, acting_user=user, origin=origin)
        invitation.accepted_at = timezone.now()
        invitation.accepted_by = user
        invitation.save(update_fields=["accepted_at", "accepted_by"])
        do_log_event(
            Event.INVITATION_ACCEPT,
            invitation,
            acting_user=user,
            origin=origin,
            workspace=workspace,
            data=_what(invitation),
        )
    return invitation


def _what(invitation: Invitation) -> dict[str, str]:
    """What the audit log keeps of an invitation: the address, and the role or the instance's access."""
    if invitation.instance is None:
        return {"email": invitation.email, "role": invitation.role}
    return {"email": invitation.email, "instance": invitation.instance.name, "access": invitation.access}
