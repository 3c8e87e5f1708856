"""Single sign-on through OpenID Connect (mozilla-django-oidc), and the password backend beside it.

Configured by environment variables alone (portal/settings.py, docs/identity.md). The provider's
endpoints come from its discovery document, read when first needed and kept for an hour (a provider
that cannot be reached is asked again at the next sign-in), unless set one by one.

What this adds to the library's authorization-code flow (with PKCE and a nonce):
- the ID token's issuer, audience, expiry and issue time are checked, not only its signature;
- a user is found by (issuer, subject) alone (`ExternalIdentity`), never by email;
- at every sign-in the user's portal groups become the provider's groups that exist in the portal
  (a workspace assigned to a group has its members), and platform admin follows membership of a
  `PORTAL_OIDC_ADMIN_GROUPS` group: a group removed at the provider is gone at the next sign-in;
- the first sign-in creates the user and their private workspace.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, User
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import HttpRequest
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings

from apps.accounts.models import ExternalIdentity
from apps.audit.actions import SYSTEM, do_log_event
from apps.audit.events import Event
from apps.workspaces.actions import ensure_private_workspace

logger = logging.getLogger(__name__)

DISCOVERY_TTL_S = 3600.0
LEEWAY_S = 60  # clock difference allowed between the provider and the portal


class SsoUnavailable(Exception):
    """The provider's configuration could not be read: sign-in through it cannot start."""


class SsoMisconfigured(SsoUnavailable):
    """The provider's configuration was read, and does not match the portal's settings: trying again
    does not help until an administrator changes one or the other. `explain` says so to the person
    signing in."""

    def __init__(self, detail: str, *, explain: str) -> None:
        super().__init__(detail)
        self.explain = explain


class TokenRefused(SuspiciousOperation):
    """An ID token refused for what it says, not for the browser's session: `explain` tells the person
    signing in what is wrong and whom to tell."""

    def __init__(self, detail: str, *, explain: str) -> None:
        super().__init__(detail)
        self.explain = explain


TELL_ADMIN = "Tell the portal's administrator: signing in again will not help until they fix it."


def _clocks_disagree(detail: str) -> TokenRefused:
    return TokenRefused(
        f"the ID token was refused: {detail}",
        explain=(
            "The identity provider's answer was out of date when it reached the portal: the clocks of "
            "the portal and of the identity provider disagree, or the sign-in took too long. Start again "
            "from the sign-in page; if this happens again, tell the portal's administrator that the "
            "clocks disagree."
        ),
    )


def _settings_disagree(detail: str, what: str) -> TokenRefused:
    return TokenRefused(
        f"the ID token was refused: {detail}",
        explain=(
            f"The identity provider's answer does not match the portal's settings for it ({what}): the "
            f"provider's settings and the portal's disagree. {TELL_ADMIN}"
        ),
    )


def _refusal(error: jwt.PyJWTError) -> TokenRefused:
    """What a refused ID token means for the person signing in, by why PyJWT refused it."""
    if isinstance(error, (jwt.ExpiredSignatureError, jwt.ImmatureSignatureError)):
        return _clocks_disagree(str(error))
    if isinstance(error, jwt.InvalidIssuerError):
        return _settings_disagree(str(error), f"it comes from another issuer than {settings.PORTAL_OIDC_ISSUER}")
    if isinstance(error, jwt.InvalidAudienceError):
        return _settings_disagree(str(error), f"it is for another client than {settings.PORTAL_OIDC_CLIENT_ID}")
    if isinstance(error, jwt.InvalidSignatureError):
        return _settings_disagree(str(error), "its signature does not match the provider's published keys")
    if isinstance(error, jwt.MissingRequiredClaimError):
        return _settings_disagree(str(error), f"it has no {error.claim!r} claim")
    return _settings_disagree(str(error), "it is not an ID token the portal can read")


def enabled() -> bool:
    return bool(settings.PORTAL_OIDC_ISSUER)


def passwords_allowed_for(username: str) -> bool:
    """With SSO on, only the break-glass admin signs in with a password."""
    return not enabled() or (bool(settings.PORTAL_BREAK_GLASS_ADMIN) and username == settings.PORTAL_BREAK_GLASS_ADMIN)


@dataclass(frozen=True)
class Provider:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str
    jwks_uri: str
    end_session_endpoint: str


_discovered: dict[str, tuple[float, dict[str, Any]]] = {}


def _discovery(issuer: str) -> dict[str, Any]:
    cached = _discovered.get(issuer)
    if cached and time.monotonic() - cached[0] < DISCOVERY_TTL_S:
        return cached[1]
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        answer = requests.get(url, timeout=settings.OIDC_TIMEOUT)
        answer.raise_for_status()
        document = answer.json()
    except (requests.RequestException, ValueError) as error:
        raise SsoUnavailable(f"the identity provider's configuration at {url} could not be read: {error}") from error
    if not isinstance(document, dict):
        raise SsoUnavailable(f"{url} is not a discovery document")
    if str(document.get("issuer", "")).rstrip("/") != issuer:
        named = str(document.get("issuer"))[:200]
        raise SsoMisconfigured(
            f"{url} describes another issuer: {named!r}",
            explain=(
                f"Single sign-on is set up wrongly: the identity provider calls itself {named}, and the "
                f"portal's settings name it {issuer}. {TELL_ADMIN}"
            ),
        )
    _discovered[issuer] = (time.monotonic(), document)
    return document


def provider() -> Provider:
    """The provider's endpoints: each from its own setting where set, else from discovery."""
    issuer = settings.PORTAL_OIDC_ISSUER
    explicit = {
        "authorization_endpoint": settings.PORTAL_OIDC_AUTHORIZATION_ENDPOINT,
        "token_endpoint": settings.PORTAL_OIDC_TOKEN_ENDPOINT,
        "userinfo_endpoint": settings.PORTAL_OIDC_USERINFO_ENDPOINT,
        "jwks_uri": settings.PORTAL_OIDC_JWKS_URI,
        "end_session_endpoint": settings.PORTAL_OIDC_END_SESSION_ENDPOINT,
    }
    required = [name for name, value in explicit.items() if not value and name != "end_session_endpoint"]
    found = _discovery(issuer) if required or not explicit["end_session_endpoint"] else {}
    values = {name: value or str(found.get(name) or "") for name, value in explicit.items()}
    missing = [name for name in required if not values[name]]
    if missing:
        detail = f"the identity provider names no {', '.join(missing)}"
        raise SsoMisconfigured(detail, explain=f"Single sign-on is set up wrongly: {detail}. {TELL_ADMIN}")
    return Provider(issuer=issuer, **values)


_ENDPOINT_SETTINGS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}


_PORTAL_SETTINGS = {
    "OIDC_RP_CLIENT_ID": "PORTAL_OIDC_CLIENT_ID",
    "OIDC_RP_CLIENT_SECRET": "PORTAL_OIDC_CLIENT_SECRET",
    "OIDC_RP_SCOPES": "PORTAL_OIDC_SCOPES",
    # When the callback next has the session checked with the provider (apps/accounts/sso_session.py).
    "OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS": "PORTAL_OIDC_SESSION_CHECK_S",
}


def get_settings(attr: str, *args: Any) -> Any:
    """mozilla-django-oidc's settings: the client's from the PORTAL_OIDC_* settings, the provider's
    endpoints from `provider()`, the rest from Django's settings."""
    if attr in _ENDPOINT_SETTINGS:
        return getattr(provider(), _ENDPOINT_SETTINGS[attr])
    if attr in _PORTAL_SETTINGS:
        return getattr(settings, _PORTAL_SETTINGS[attr])
    return import_from_settings(attr, *args)


class PasswordBackend(ModelBackend):
    """Django's password check; with SSO on, for the break-glass admin alone."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> Any:
        if username is None or not passwords_allowed_for(username):
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


class SsoBackend(OIDCAuthenticationBackend):
    """The authorization-code flow's end: the code exchanged, the ID token checked, the user found
    or made, their groups and admin role set from the provider's groups."""

    get_settings = staticmethod(get_settings)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The library reads every endpoint here; this backend reads them when a sign-in needs them,
        # so that password sign-ins never wait on the provider.
        self.UserModel = get_user_model()

    OIDC_RP_SIGN_ALGO = property(lambda self: settings.OIDC_RP_SIGN_ALGO)
    OIDC_RP_CLIENT_ID = property(lambda self: settings.PORTAL_OIDC_CLIENT_ID)
    OIDC_RP_CLIENT_SECRET = property(lambda self: settings.PORTAL_OIDC_CLIENT_SECRET)
    OIDC_RP_IDP_SIGN_KEY = None
    OIDC_OP_TOKEN_ENDPOINT = property(lambda self: provider().token_endpoint)
    OIDC_OP_USER_ENDPOINT = property(lambda self: provider().userinfo_endpoint)
    OIDC_OP_JWKS_ENDPOINT = property(lambda self: provider().jwks_uri)

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        # Only the callback view's call, which always carries the nonce and PKCE verifier it kept in
        # the session, is a sign-in through the provider: never a password form's.
        if not enabled() or not kwargs.get("nonce") or not kwargs.get("code_verifier"):
            return None
        return super().authenticate(request, **kwargs)

    def _verify_jws(self, payload: str, key: Any) -> dict[str, Any]:
        header = jwt.get_unverified_header(payload)
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            alg = header.get("alg")
            detail = f"the ID token is signed with {alg!r}, not {self.OIDC_RP_SIGN_ALGO}"
            raise _settings_disagree(detail, f"it is signed with {alg!r}, not {self.OIDC_RP_SIGN_ALGO}")
        try:
            claims: dict[str, Any] = jwt.decode(
                payload,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=settings.PORTAL_OIDC_ISSUER,
                leeway=LEEWAY_S,
                options={"require": ["iss", "sub", "aud", "exp", "iat"]},
            )
        except jwt.PyJWTError as error:
            raise _refusal(error) from error
        if claims["iat"] > time.time() + LEEWAY_S:
            raise _clocks_disagree("it was issued in the future")
        return claims

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The provider's claims about the user: the ID token's, with the userinfo endpoint's, which
        must be about the same subject."""
        info = super().get_userinfo(access_token, id_token, payload)
        if str(info.get("sub")) != str(payload["sub"]):
            raise SuspiciousOperation("the userinfo endpoint answered about another subject")
        return {**payload, **info, "iss": payload["iss"], "sub": payload["sub"]}

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return bool(claims.get("sub"))

    def filter_users_by_claims(self, claims: dict[str, Any]) -> Any:
        return User.objects.filter(identities__issuer=claims["iss"], identities__subject=str(claims["sub"]))

    def create_user(self, claims: dict[str, Any]) -> User:
        with transaction.atomic():
            user = User(username=_free_username(claims))
            user.set_unusable_password()
            _copy_profile(user, claims)
            user.save()
            ExternalIdentity.objects.create(user=user, issuer=claims["iss"], subject=str(claims["sub"]))
            do_log_event(Event.USER_CREATE, user, acting_user=user, data={"sso": claims["iss"]})
        ensure_private_workspace(user)
        return self.update_user(user, claims)

    def update_user(self, user: User, claims: dict[str, Any]) -> User:
        _copy_profile(user, claims)
        user.save(update_fields=["email", "first_name", "last_name"])
        sync_roles(user, claims)
        return user


def _free_username(claims: dict[str, Any]) -> str:
    wanted = str(claims.get(settings.PORTAL_OIDC_USERNAME_CLAIM) or claims.get("email") or claims["sub"])
    base = re.sub(r"[^\w.@+-]+", "-", wanted)[:140].strip("-") or "user"
    name, n = base, 1
    while User.objects.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def _copy_profile(user: User, claims: dict[str, Any]) -> None:
    if claims.get("email") and claims.get("email_verified", True) is not False:
        user.email = str(claims["email"])[:254]
    user.first_name = str(claims.get("given_name") or claims.get("name") or "")[:150]
    user.last_name = str(claims.get("family_name") or "")[:150]


def groups_of(claims: dict[str, Any]) -> list[str]:
    """The provider's groups for the user: a list of names, a single name, or nothing."""
    value = claims.get(settings.PORTAL_OIDC_GROUPS_CLAIM)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return sorted({str(item) for item in value if isinstance(item, (str, int))})


def sync_roles(user: User, claims: dict[str, Any]) -> None:
    """The user's portal groups and admin role, from the provider's groups (every sign-in)."""
    names = groups_of(claims)
    groups = list(Group.objects.filter(name__in=names))
    admin = bool(set(names) & set(settings.PORTAL_OIDC_ADMIN_GROUPS))
    before = set(user.groups.values_list("name", flat=True))
    after = {group.name for group in groups}
    changed: dict[str, Any] = {}
    if before != after:
        user.groups.set(groups)
        changed["groups"] = sorted(after)
    if user.is_staff != admin or user.is_superuser != admin:
        user.is_staff = user.is_superuser = admin
        user.save(update_fields=["is_staff", "is_superuser"])
        changed["admin"] = admin
    ExternalIdentity.objects.filter(user=user, issuer=claims["iss"], subject=str(claims["sub"])).update(groups=names)
    if changed:
        do_log_event(Event.USER_UPDATE, user, acting_user=None, origin=SYSTEM, data={**changed, "from": "sso"})


def logout_url(request: HttpRequest, after: str) -> str | None:
    """Where to send the browser to end the provider's session too (RP-initiated logout), then come
    back to `after`; None where the provider offers no such endpoint or the session is not from it."""
    id_token = request.session.get("oidc_id_token")
    if not enabled() or not id_token:
        return None
    try:
        endpoint = provider().end_session_endpoint
    except SsoUnavailable:
        logger.warning("could not end the provider's session", exc_info=True)
        return None
    if not endpoint:
        return None
    query = urlencode(
        {"id_token_hint": id_token, "post_logout_redirect_uri": after, "client_id": settings.PORTAL_OIDC_CLIENT_ID}
    )
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"
