"""What every page shares: sign-in, the workspace being looked at, the audit origin, and turning
an API serializer's or an action's refusal into messages shown next to the form's fields.

Pages parse their input with the API's own serializers and change state only through the
apps' actions, so a form refuses exactly what the API refuses, with the same words.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import validate_email
from django.db.models import Case, IntegerField, QuerySet, Value, When
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from rest_framework import serializers

from apps.audit.actions import Origin
from apps.audit.models import AuditEvent
from apps.compute.models import Collaborator, Instance
from apps.errors import ActionError
from apps.invitations import actions as invitations
from apps.workspaces.access import CHANGE, VIEW, can, may, restrict
from apps.workspaces.models import Workspace

LOGIN_URL = "web:login"
SESSION_WORKSPACE = "web.workspace"

Errors = dict[str, list[str]]
View = Callable[..., HttpResponse]


def signed_in(view: View) -> View:
    """The page needs a signed-in user; others go to the sign-in page and come back."""
    return login_required(login_url=LOGIN_URL)(view)


def admin_only(view: View) -> View:
    """The admin console: platform admins only."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("The admin console is for platform admins.")
        return view(request, *args, **kwargs)

    return signed_in(wrapped)


def origin(request: HttpRequest) -> Origin:
    return Origin.from_request(request, via=AuditEvent.Via.WEB)


def action_kwargs(request: HttpRequest) -> dict[str, Any]:
    return {"acting_user": request.user, "origin": origin(request)}


def my_workspaces(user: Any) -> QuerySet[Workspace]:
    """The workspaces the user may see: their private one first, then the team workspaces by name."""
    private_first = Case(
        When(kind=Workspace.Kind.PRIVATE, assigned_user=user, then=Value(0)),
        default=Value(1),
        output_field=IntegerField(),
    )
    return restrict(Workspace.objects.all(), user).annotate(_mine=private_first).order_by("_mine", "name")


def workspace_for(request: HttpRequest, name: str, role: str = VIEW) -> Workspace:
    """The workspace named in the URL, through the access layer: another tenant's is a 404.

    A workspace the user sees but may not change (a viewer's) refuses changes with a 403.
    """
    workspace = get_object_or_404(restrict(Workspace.objects.filter(name=name), request.user))
    if role != VIEW and not can(request.user, workspace, role):
        raise PermissionDenied(f"Your role in workspace {workspace.name} does not allow this.")
    request.session[SESSION_WORKSPACE] = workspace.name
    return workspace


def shared_for(
    request: HttpRequest, ws: str, queryset: QuerySet[Any], pk: int, role: str = VIEW
) -> tuple[Workspace, Any]:
    """An instance or notebook named in the URL, for a member of its workspace or a collaborator
    it is shared with; anyone else gets a 404. Someone who sees it without `role` on it (a viewer,
    a read-only collaborator) is refused with a 403."""
    obj = get_object_or_404(restrict(queryset, request.user), pk=pk, workspace__name=ws)
    if role != VIEW and not may(request.user, obj, role):
        raise PermissionDenied(f"Your access to {obj.name} does not allow this.")
    workspace = obj.workspace
    if is_member(request, workspace):
        request.session[SESSION_WORKSPACE] = workspace.name
    return workspace, obj


def is_member(request: HttpRequest, workspace: Workspace) -> bool:
    """Whether the user sees the workspace itself, not only something in it shared with them."""
    return restrict(Workspace.objects.filter(pk=workspace.pk), request.user).exists()


def may_change(request: HttpRequest, workspace: Workspace) -> bool:
    return can(request.user, workspace, CHANGE)


def page(request: HttpRequest, template: str, context: dict[str, Any], *, status: int = 200) -> HttpResponse:
    """Render a full page: the workspace switcher, the workspaces to watch live and the instances
    shared with the user come along. A page of something shared with the user in a workspace that
    is not theirs (`shared_for`) keeps their own workspace in the switcher and the menu."""
    workspaces = list(my_workspaces(request.user).only("name", "display_name", "kind", "assigned_user_id"))
    current = context.get("workspace")
    if current is not None and all(w.pk != current.pk for w in workspaces):
        context.setdefault("live_workspaces", [])
        current = None
    if current is None:
        remembered = request.session.get(SESSION_WORKSPACE)
        current = next((w for w in workspaces if w.name == remembered), workspaces[0] if workspaces else None)
    context = {
        "workspaces": workspaces,
        "current_workspace": current,
        "shared_with_me": shared_with(request),
        **context,
    }
    context.setdefault("live_workspaces", [current.name] if current else [])
    return render(request, template, context, status=status)


def shared_with(request: HttpRequest) -> list[Any]:
    """The live instances shared with the user, for the menu."""
    if not request.user.is_authenticated:
        return []
    rows = Collaborator.objects.filter(user=request.user, instance__state__in=Instance.LIVE_STATES)
    return [c.instance for c in rows.select_related("instance__workspace").order_by("instance__name")[:50]]


def is_fragment(request: HttpRequest) -> bool:
    """An htmx request for one part of a page (a table refreshed by a live update)."""
    return request.headers.get("HX-Request") == "true" and bool(request.GET.get("part"))


def flatten(detail: Any, prefix: str = "") -> Errors:
    """A serializer's nested errors as {"field": ["message", ...]}."""
    if isinstance(detail, dict):
        out: Errors = {}
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            for field, messages in flatten(value, name).items():
                out.setdefault(field, []).extend(messages)
        return out
    if isinstance(detail, list) and any(isinstance(item, (dict, list)) for item in detail):
        out = {}
        for item in detail:
            for field, messages in flatten(item, prefix).items():
                out.setdefault(field, []).extend(messages)
        return out
    items = detail if isinstance(detail, list) else [detail]
    return {prefix or "form": [str(item) for item in items]}


def validated(serializer: serializers.Serializer, errors: Errors) -> dict[str, Any] | None:
    """The serializer's validated data, or None with its messages added to `errors`.

    The model's unique-together check is left to the action, which makes the same check under
    its lock and names the field that clashes ("An instance named X already exists").
    """
    serializer.validators = []
    if serializer.is_valid():
        return dict(serializer.validated_data)
    for field, messages in flatten(serializer.errors).items():
        errors.setdefault("form" if field == "non_field_errors" else field, []).extend(messages)
    return None


def refused(exc: ActionError, errors: Errors, fields: set[str]) -> None:
    """An action's refusal, next to its field when the form has that field, else above the form."""
    field = exc.field if exc.field in fields else "form"
    errors.setdefault(field, []).append(exc.message)


def serializer_context(request: HttpRequest) -> dict[str, Any]:
    return {"request": request}


def get_for(request: HttpRequest, queryset: QuerySet[Any], **lookup: Any) -> Any:
    """One tenant object through the access layer; another tenant's is a 404."""
    return get_object_or_404(restrict(queryset, request.user), **lookup)


def sent_message(invitation: Any, done: str) -> str:
    """What to say once an invitation was made or sent again: whether its mail went out."""
    if invitation.send_error:
        return f"{done}, but the mail could not be sent ({invitation.send_error}): send it again later."
    return f"{done}; the link is in the mail."


def posted_email(request: HttpRequest, errors: Errors) -> str | None:
    """The form's `email`, or None with the field's error."""
    email = request.POST.get("email", "").strip()
    try:
        validate_email(email)
    except ValidationError:
        errors["email"] = ["Give an email address, such as dana@example.org."]
        return None
    return email


def resend_or_withdraw(request: HttpRequest, invitation: Any, what: str) -> str:
    """Send a waiting invitation again ("resend") or withdraw it; the message to show. Refusals
    are the actions' (ActionError)."""
    if what == "resend":
        again = invitations.do_resend(invitation, base_url=request.build_absolute_uri("/"), **action_kwargs(request))
        return sent_message(again, f"The invitation of {invitation.email} was sent again, with a new link")
    invitations.do_withdraw(invitation, **action_kwargs(request))
    return f"The invitation of {invitation.email} was withdrawn: its link no longer works."
