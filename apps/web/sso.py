"""Sign-in through the identity provider (apps/accounts/oidc.py) and signing out of both.

Every way a sign-in through the provider can fail (the provider down, a callback with a state this
browser never started, a code already used, a refused ID token, the provider's own error) ends on
the sign-in page with a sentence saying what happened, never on an error page of the server's."""

from __future__ import annotations

import logging
from typing import Any

import requests
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST
from mozilla_django_oidc import views as oidc_views

from apps.accounts import actions, oidc, sso_session
from apps.audit.actions import Origin, do_log_failed_sign_in
from apps.audit.models import AuditEvent

logger = logging.getLogger(__name__)


def failure(request: HttpRequest, message: str, *, status: int, tried: str = "") -> HttpResponse:
    """The sign-in page, saying why the sign-in through the provider did not work."""
    do_log_failed_sign_in(tried or "(single sign-on)", origin=Origin.from_request(request, via=AuditEvent.Via.WEB))
    return render(request, "web/login.html", {"sso_error": message, **sso_context()}, status=status)


def sso_context() -> dict[str, Any]:
    return {"sso": oidc.enabled(), "sso_name": settings.PORTAL_OIDC_PROVIDER_NAME}


class SsoStart(oidc_views.OIDCAuthenticationRequestView):
    """Off to the provider's sign-in, with a fresh state, nonce and PKCE challenge in the session."""

    get_settings = staticmethod(oidc.get_settings)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super(oidc_views.OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not oidc.enabled():
            raise Http404("Single sign-on is not configured.")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = oidc.provider().authorization_endpoint
        except oidc.SsoUnavailable as error:
            logger.warning("single sign-on cannot start: %s", error)
            message = "The identity provider cannot be reached just now. Try again in a minute."
            if isinstance(error, oidc.SsoMisconfigured):
                message = error.explain
            return render(request, "web/login.html", {"sso_error": message, **sso_context()}, status=503)
        self.OIDC_RP_CLIENT_ID = self.get_settings("OIDC_RP_CLIENT_ID")
        return super().get(request)


class SsoCallback(oidc_views.OIDCAuthenticationCallbackView):
    """Back from the provider: the code exchanged and checked, the user signed in. Or the answer to a
    session's check (apps/accounts/sso_session.py): the session goes on, or, where the provider no
    longer signs the user in, it and the user's other access end; if the check itself fails, this
    session ends."""

    get_settings = staticmethod(oidc.get_settings)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not oidc.enabled():
            raise Http404("Single sign-on is not configured.")
        checking = sso_session.answers_check(request)
        if request.GET.get("error"):
            said = (request.GET.get("error_description") or request.GET["error"])[:300]
            states = request.session.get("oidc_states") or {}
            if states.pop(request.GET.get("state", ""), None) is not None:  # never usable again
                request.session["oidc_states"] = states
            if checking:
                return _no_longer_signed_in(request, said)
            return failure(request, f"The identity provider did not sign you in: {said}", status=403)
        answer = self._exchange(request)
        if checking and not (answer.status_code == 302 and request.user.is_authenticated):
            auth.logout(request)  # a check that could not be made: this session ends
        return answer

    def _exchange(self, request: HttpRequest) -> HttpResponse:
        if "code" not in request.GET or "state" not in request.GET:
            return failure(request, "This sign-in link is incomplete. Start again from the sign-in page.", status=400)
        try:
            answer: HttpResponse = super().get(request)
        except oidc.TokenRefused as error:  # what the token says, not this browser's session
            logger.warning("a sign-in through the provider was refused: %s", error)
            return failure(request, error.explain, status=400)
        except oidc.SsoMisconfigured as error:
            logger.warning("a sign-in through the provider failed: %s", error)
            return failure(request, error.explain, status=502)
        except SuspiciousOperation as error:
            logger.warning("a sign-in through the provider was refused: %s", error)
            message = (
                "This sign-in could not be checked: it was started in another browser or tab, used "
                "twice, or took too long. Start again from the sign-in page."
            )
            return failure(request, message, status=400)
        except (requests.RequestException, oidc.SsoUnavailable, ValueError) as error:
            logger.warning("a sign-in through the provider failed: %s", error)
            message = "The identity provider did not complete the sign-in. Start again from the sign-in page."
            return failure(request, message, status=502)
        return answer

    def login_failure(self) -> HttpResponse:
        user = getattr(self, "user", None)
        if user is not None and not user.is_active:
            message = "Your account is deactivated in this portal. Ask an admin."
            return failure(self.request, message, status=403, tried=user.get_username())
        message = "This sign-in could not be checked. Start again from the sign-in page."
        return failure(self.request, message, status=400)


def _no_longer_signed_in(request: HttpRequest, said: str) -> HttpResponse:
    """The provider, asked about a signed-in user, no longer signs them in: their session ends here,
    and every other access of theirs with it."""
    user = get_user_model().objects.get(pk=request.user.pk)
    origin = Origin.from_request(request, via=AuditEvent.Via.WEB)
    auth.logout(request)
    reason = f"{settings.PORTAL_OIDC_PROVIDER_NAME} no longer signs them in"
    actions.do_end_sso_access(user, reason=reason, origin=origin)
    message = (
        f"You were signed out: {settings.PORTAL_OIDC_PROVIDER_NAME} no longer signs you in ({said}). Your API "
        "tokens were revoked. Sign in again to go on."
    )
    return render(request, "web/login.html", {"sso_error": message, **sso_context()}, status=403)


@require_POST
def sign_out(request: HttpRequest) -> HttpResponse:
    """Sign out of the portal and, for a session that came from the provider, of the provider too
    (where it offers RP-initiated logout): its page then sends the browser back to sign-in."""
    after = request.build_absolute_uri(reverse("web:login"))
    at_provider = oidc.logout_url(request, after)
    auth.logout(request)
    return HttpResponseRedirect(at_provider or reverse("web:login"))
