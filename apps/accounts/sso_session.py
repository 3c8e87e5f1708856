"""A session that came through the identity provider is checked with it again, every
``PORTAL_OIDC_SESSION_CHECK_S`` seconds (mozilla-django-oidc's ``SessionRefresh``).

Once a session's check is due, the next page the browser opens goes to the provider with
``prompt=none``: a user the provider still signs in comes straight back to that page (their groups
and admin role updated, as at every sign-in); a user it no longer signs in (removed, disabled,
signed out there, their session there over) comes back with an error, and the portal then ends this
session and every other access of theirs (`apps.accounts.actions.do_end_sso_access`). Until the
check is done, whatever is not a page opened (a form sent, an htmx or script request, the API with
the session's cookie) is not served: a form is sent back to its page, which runs the check; htmx
reloads the page; a script gets HTTP 403 saying why.

Sessions of the password sign-in (the break-glass admin), requests with a token, and the embedded
default (no provider) are never checked.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.module_loading import import_string
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.middleware import SessionRefresh

from apps.accounts import oidc

# The state of the check under way in this session, told apart from a sign-in's by the callback.
CHECK_STATE = "portal_sso_check_state"
EXPIRY = "oidc_id_token_expiration"  # where the library keeps when the session is next checked
MESSAGE = "Your sign-in must be checked again with the identity provider: open a page of the portal."


def from_provider(request: HttpRequest) -> bool:
    """Whether the request's session is a signed-in user's that began at the provider."""
    if not oidc.enabled() or not hasattr(request, "session"):
        return False
    backend = request.session.get(BACKEND_SESSION_KEY)
    if not backend:
        return False
    try:
        through_provider = issubclass(import_string(backend), OIDCAuthenticationBackend)
    except ImportError:
        return False
    return through_provider and request.user.is_authenticated


def check_due(session: Any) -> bool:
    """Whether the session must be checked with the provider before it is used further."""
    return float(session.get(EXPIRY) or 0) <= time.time()


def answers_check(request: HttpRequest) -> bool:
    """Whether this callback is the provider's answer to this session's check (not a new sign-in)."""
    state = request.GET.get("state")
    pending = request.session.get("oidc_states") or {}
    return bool(state) and state == request.session.get(CHECK_STATE) and state in pending and from_provider(request)


class SsoSessionCheck(SessionRefresh):
    """The library's middleware, reading the provider's endpoints only when a check is due (a
    password sign-in never waits on the provider), and holding back every request of a session
    whose check is due, not only the pages it sends to the provider."""

    get_settings = staticmethod(oidc.get_settings)
    OIDC_STATE_SIZE = 32
    OIDC_NONCE_SIZE = 32
    OIDC_USE_NONCE = True
    OIDC_AUTHENTICATION_CALLBACK_URL = "web:sso-callback"

    def __init__(self, get_response: Any) -> None:  # the library reads the endpoints here
        super(SessionRefresh, self).__init__(get_response)

    OIDC_OP_AUTHORIZATION_ENDPOINT = property(lambda self: oidc.provider().authorization_endpoint)
    OIDC_RP_CLIENT_ID = property(lambda self: settings.PORTAL_OIDC_CLIENT_ID)
    OIDC_RP_SCOPES = property(lambda self: settings.PORTAL_OIDC_SCOPES)

    def is_refreshable_url(self, request: HttpRequest) -> bool:
        """Every request but the sign-in's and sign-out's own pages and the static files."""
        exempt = [reverse(name) for name in ("web:login", "web:logout", "web:sso-start", "web:sso-callback")]
        return request.path not in exempt and not request.path.startswith(settings.STATIC_URL)

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        if not from_provider(request) or not check_due(request.session) or not self.is_refreshable_url(request):
            return None
        if request.method != "GET" or _in_the_background(request):
            return _held_back(request)
        try:
            answer: HttpResponse = super().process_request(request)  # off to the provider, prompt=none
        except oidc.SsoUnavailable:
            message = "The identity provider cannot be reached just now to check your sign-in. Try again in a minute."
            context = {"sso_error": message, "sso": True, "sso_name": settings.PORTAL_OIDC_PROVIDER_NAME}
            return render(request, "web/login.html", context, status=503)
        request.session[CHECK_STATE] = parse_qs(urlsplit(answer["Location"]).query)["state"][0]
        return answer


def _in_the_background(request: HttpRequest) -> bool:
    """A request a page makes by itself (htmx, a script, the API): it cannot follow the provider."""
    if request.headers.get("HX-Request") or request.headers.get("X-Requested-With"):
        return True
    if request.path.startswith("/api/") or "application/json" in request.headers.get("Accept", ""):
        return True
    mode = request.headers.get("Sec-Fetch-Mode")
    return bool(mode) and mode != "navigate"


def _held_back(request: HttpRequest) -> HttpResponse:
    """The answer to a request that waits for the session's check."""
    if request.headers.get("HX-Request"):
        answer = HttpResponse(MESSAGE, status=403, content_type="text/plain")
        answer["HX-Refresh"] = "true"  # htmx reloads the page, which runs the check
        return answer
    if _in_the_background(request):
        error = {"status": 403, "code": "sign_in_check_due", "message": MESSAGE}
        return JsonResponse({"error": error}, status=403)
    back = request.headers.get("Referer", "")
    safe = url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure())
    return HttpResponseRedirect(back if back and safe else reverse("web:landing"), status=303)
