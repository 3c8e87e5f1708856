"""Your personal API tokens: the list, a form to make one, a Revoke button on each live one. The form
is read by the API's own serializer and the token made and revoked by the same actions as the API.

A new token's text is shown once: it is kept in the session for the one page that shows it and
taken out as it is shown, never put in a URL or a message.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.cache import never_cache

from apps.accounts.api import ApiTokenSerializer
from apps.accounts.api_tokens import default_days_for, do_create_token, do_revoke_token, max_days_for
from apps.accounts.models import ApiToken
from apps.accounts.tokens import held_by_workloads
from apps.errors import ActionError
from apps.web.common import Errors, action_kwargs, page, serializer_context, signed_in, validated

SESSION_NEW_TOKEN = "web.new_token"
FIELDS = ("name", "expires_in_days", "scope", "workspace")
PER_PAGE = 50
REVOKED_REASON = "revoked by its user"  # as the API says it (DELETE /api/v1/tokens/<id>/)
TONES = {"active": "ok", "expired": "off", "revoked": "bad"}


def _create(request: HttpRequest, values: dict[str, str], errors: Errors) -> str | None:
    """Make a token from the form; the message to show once done, or None with `errors`."""
    data: dict[str, Any] = {name: values[name] for name in ("name", "expires_in_days", "scope")}
    if values["workspace"]:  # none chosen: all of the user's workspaces
        data["workspace"] = values["workspace"]
    checked = validated(ApiTokenSerializer(data=data, context=serializer_context(request)), errors)
    if checked is None:
        return None
    try:
        token, text = _make(request, checked)
    except ActionError as error:  # too many made this hour
        errors["form"] = [error.message]
        return None
    request.session[SESSION_NEW_TOKEN] = {"name": token.name, "text": text}
    return f"Token {token.name} ({token.key_id}) was created."


def _make(request: HttpRequest, checked: dict[str, Any]) -> tuple[ApiToken, str]:
    return do_create_token(
        request.user,
        name=checked["name"],
        expires_in_days=checked.get("expires_in_days", default_days_for(request.user)),
        scope=checked.get("scope", ApiToken.Scope.WRITE),
        workspace=checked.get("workspace"),
        limited=True,
        **action_kwargs(request),
    )


def _revoke(request: HttpRequest) -> str:
    """Revoke one of the user's own tokens (another user's, or none: 404); the message to show."""
    pk = request.POST.get("token", "")
    if not (pk.isascii() and pk.isdigit()):
        raise Http404("No such token.")
    token = get_object_or_404(ApiToken, pk=int(pk), user=request.user)
    if token.revoked_at is not None:
        return f"Token {token.name} ({token.key_id}) was already revoked."
    do_revoke_token(token, reason=REVOKED_REASON, **action_kwargs(request))
    return f"Token {token.name} ({token.key_id}) was revoked: it is refused from now on."


def _rows(request: HttpRequest) -> Any:
    tokens = ApiToken.objects.filter(user=request.user).select_related("workspace", "endpoint__workspace")
    tokens = tokens.order_by("-created_at", "-pk")
    page_obj = Paginator(tokens, PER_PAGE).get_page(request.GET.get("page"))
    serializer = ApiTokenSerializer()
    for token in page_obj:
        token.state = serializer.get_state(token)  # type: ignore[attr-defined]
        token.expires_at = serializer.expires_at_of(token)  # when it stops working, for the page alone
        token.tone = TONES[token.state]  # type: ignore[attr-defined]
    return page_obj


@never_cache  # the page that shows a new token's text is never kept by a browser or a proxy
@signed_in
def tokens(request: HttpRequest) -> HttpResponse:
    errors: Errors = {}
    days = str(default_days_for(request.user))
    values = {"name": "", "expires_in_days": days, "scope": ApiToken.Scope.WRITE, "workspace": ""}
    new_token = None
    if request.method == "POST":
        if request.POST.get("action") == "revoke":
            messages.success(request, _revoke(request))
            return redirect("web:tokens")
        values = {name: request.POST.get(name, "") for name in FIELDS}
        done = _create(request, values, errors)
        if done is not None:
            messages.success(request, done)
            return redirect("web:tokens")
    else:
        new_token = request.session.pop(SESSION_NEW_TOKEN, None)
    context = {
        "page_obj": _rows(request),
        "new_token": new_token,
        "errors": errors,
        "values": values,
        "scopes": ApiToken.Scope.choices,
        "expiry_help": f"{max_days_for(request.user)} days at most.",
        "portal_url": settings.PORTAL_PUBLIC_URL,
        "live_workspaces": [],  # no workspace's work is shown here
        "workloads": held_by_workloads(request.user),
    }
    return page(request, "web/tokens.html", context, status=400 if errors else 200)
