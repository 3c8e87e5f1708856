"""An invitation's link (apps/invitations/actions.py): who invited whom, to what, and the one next
step: sign in (through the identity provider, or with a password), make an account for the invited
address (without single sign-on, when none has it), or accept. A link that is not valid, used,
withdrawn or expired gets a page that says which, with 404 or 410.

The link's secret is in the path: the pages' Referrer-Policy (same-origin) keeps it from other
sites, and the page is never cached."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model, login, password_validation
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache

from apps.accounts import oidc
from apps.audit.actions import Origin
from apps.audit.models import AuditEvent
from apps.errors import ActionError
from apps.invitations import actions
from apps.invitations.models import Invitation
from apps.web.common import Errors
from apps.web.sso import sso_context


def _origin(request: HttpRequest) -> Origin:
    return Origin.from_request(request, via=AuditEvent.Via.WEB)


def _make_account(request: HttpRequest, invitation: Invitation, errors: Errors) -> Any:
    """A local account for the invited address, from the form; None with `errors`."""
    User = get_user_model()
    username = request.POST.get("username", "").strip()
    password = request.POST.get("password", "")
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError:
        errors["username"] = ["Use letters, digits and @ . + - _ only."]
    if not username or len(username) > 150:
        errors["username"] = ["Choose a username of 1 to 150 characters."]
    elif User.objects.filter(username__iexact=username).exists():
        errors["username"] = [f"{username} is taken: choose another."]
    candidate = User(username=username, email=invitation.email)
    try:
        password_validation.validate_password(password, candidate)
    except ValidationError as error:
        errors["password"] = list(error.messages)
    if password != request.POST.get("password2", ""):
        errors["password2"] = ["The two passwords differ."]
    if errors:
        return None
    return User.objects.create_user(username, invitation.email, password)


def _context(request: HttpRequest, invitation: Invitation) -> dict[str, Any]:
    user = request.user
    has_account = get_user_model().objects.filter(email__iexact=invitation.email, is_active=True).exists()
    return {
        "invitation": invitation,
        "next": request.path,
        "matches": user.is_authenticated and actions.same_address(user.email, invitation.email),
        "may_make_account": not oidc.enabled() and not has_account,
        **sso_context(),
    }


@never_cache
def invitation(request: HttpRequest, secret: str) -> HttpResponse:
    found = actions.find(secret)
    try:
        found = actions.check_usable(found)
    except ActionError as error:
        status = int(error.status_code) if found else 404
        return render(request, "web/invitation.html", {"problem": error.message}, status=status)
    errors: Errors = {}
    if request.method == "POST":
        if request.POST.get("action") == "create" and not request.user.is_authenticated:
            if not _context(request, found)["may_make_account"]:
                errors["form"] = ["Sign in to accept: an account has this address already."]
            else:
                user = _make_account(request, found, errors)
                if user is not None:
                    login(request, user, backend="apps.accounts.oidc.PasswordBackend")
        if not errors and request.user.is_authenticated:
            try:
                done = actions.do_accept(secret, request.user, origin=_origin(request))
            except ActionError as error:
                errors["form"] = [error.message]
            else:
                workspace = done.workspace
                if done.instance is not None:
                    how = "read-write" if done.access == "write" else "read-only"
                    messages.success(
                        request, f"Instance {done.instance.name} of {workspace} is shared with you, {how}."
                    )
                    return redirect(reverse("web:instance", kwargs={"ws": workspace.name, "pk": done.instance_id}))
                role = done.get_role_display().lower()
                messages.success(request, f"You are now {'an' if role[0] in 'aeiou' else 'a'} {role} of {workspace}.")
                return redirect(reverse("web:dashboard", kwargs={"ws": workspace.name}))
    context = {**_context(request, found), "errors": errors, "values": request.POST}
    status = 400 if errors else (403 if request.user.is_authenticated and not context["matches"] else 200)
    return render(request, "web/invitation.html", context, status=status)
