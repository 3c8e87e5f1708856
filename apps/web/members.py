"""A workspace's members: everyone who can see it sees who is in it; owners (and platform admins)
add people, change roles and remove them, and invite people by email (resend, withdraw), through the
same actions as the API."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect

from apps.errors import ActionError
from apps.invitations import actions as invitations
from apps.invitations.models import Invitation
from apps.web.common import (
    Errors,
    action_kwargs,
    page,
    posted_email,
    resend_or_withdraw,
    sent_message,
    signed_in,
    workspace_for,
)
from apps.workspaces import actions
from apps.workspaces.access import MANAGE, can
from apps.workspaces.models import Membership, Role, Workspace


def _change(request: HttpRequest, workspace: Workspace, errors: Errors) -> str | None:
    """Apply one change from the form; the message to show once done, or None with `errors`."""
    what = request.POST.get("action", "")
    role = request.POST.get("role", Role.MEMBER)
    if what in ("invite", "resend", "withdraw"):
        return _invitation_change(request, workspace, what, role, errors)
    if what in ("add", "role") and role not in Role.values:
        errors["role"] = ["Choose owner, member or viewer."]
        return None
    try:
        if what == "add":
            username = request.POST.get("username", "").strip()
            user = get_user_model().objects.filter(username=username, is_active=True).first()
            if user is None:
                errors["username"] = [f"No active user is named {username!r}." if username else "Give a username."]
                return None
            actions.do_set_membership(workspace, user, role, **action_kwargs(request))
            return f"{username}'s role in {workspace.name} is now {Role(role).label.lower()}."
        membership = get_object_or_404(Membership, pk=request.POST.get("membership") or 0, workspace=workspace)
        name = membership.user.get_username()
        if what == "role":
            actions.do_set_membership(workspace, membership.user, role, **action_kwargs(request))
            return f"{name}'s role in {workspace.name} is now {Role(role).label.lower()}."
        if what == "remove":
            actions.do_remove_membership(membership, **action_kwargs(request))
            return f"{name} was removed from {workspace.name}."
    except ActionError as exc:
        # The add form shows its fields' errors; a row's refusal (the last owner) is said above the table.
        errors[exc.field if what == "add" and exc.field else "form"] = [exc.message]
        return None
    errors["form"] = ["Unknown change."]
    return None


def _invitation_change(request: HttpRequest, workspace: Workspace, what: str, role: str, errors: Errors) -> str | None:
    base_url = request.build_absolute_uri("/")
    try:
        if what == "invite":
            email = posted_email(request, errors)
            if email is None:
                return None
            done = invitations.do_invite(workspace, email, role, base_url=base_url, **action_kwargs(request))
            return sent_message(done, f"{email} was invited to {workspace.name} as {Role(role).label.lower()}")
        invitation = get_object_or_404(
            Invitation, pk=request.POST.get("invitation") or 0, workspace=workspace, instance__isnull=True
        )
        return resend_or_withdraw(request, invitation, what)
    except ActionError as exc:
        errors[exc.field if what == "invite" and exc.field else "form"] = [exc.message]
        return None


def _add_form_values(request: HttpRequest) -> dict[str, str]:
    """What the add form shows: what was typed into it, not a row's role change."""
    what = request.POST.get("action")
    values = {"username": "", "email": "", "role": Role.MEMBER, "invite_role": Role.MEMBER}
    if what == "add":
        values.update(username=request.POST.get("username", ""), role=request.POST.get("role", Role.MEMBER))
    elif what == "invite":
        values.update(email=request.POST.get("email", ""), invite_role=request.POST.get("role", Role.MEMBER))
    return values


def _pending(workspace: Workspace) -> list[Invitation]:
    """The invitations not yet accepted or withdrawn (expired ones too: they can be sent again)."""
    rows = Invitation.objects.filter(
        workspace=workspace, instance__isnull=True, accepted_at__isnull=True, withdrawn_at__isnull=True
    )
    return list(rows.select_related("invited_by").order_by("-created_at")[:200])


def _kept_owners(workspace: Workspace, rows: list[Membership]) -> set[int]:
    """The memberships the page offers no Remove for: the owners that removing is refused
    (apps/workspaces/actions.py, do_remove_membership): a private workspace's, and a lone owner."""
    owners = [m.pk for m in rows if m.role == Role.OWNER]
    return set(owners) if workspace.kind == Workspace.Kind.PRIVATE or len(owners) == 1 else set()


@signed_in
def members(request: HttpRequest, ws: str) -> HttpResponse:
    errors: Errors = {}
    if request.method == "POST":
        workspace = workspace_for(request, ws, MANAGE)  # another tenant's: 404; a member's: 403
        done = _change(request, workspace, errors)
        if done is not None:
            messages.success(request, done)
            return redirect("web:members", ws=workspace.name)
    else:
        workspace = workspace_for(request, ws)
    rows = list(Membership.objects.filter(workspace=workspace).select_related("user").order_by("user__username"))
    context = {
        "workspace": workspace,
        "rows": rows,
        "kept": _kept_owners(workspace, rows),
        "roles": Role.choices,
        "may_manage": can(request.user, workspace, MANAGE),
        "invitations": _pending(workspace) if can(request.user, workspace, MANAGE) else [],
        "errors": errors,
        "values": _add_form_values(request),
        "invitation_days": settings.PORTAL_INVITATION_DAYS,
    }
    return page(request, "web/members.html", context, status=400 if errors else 200)
