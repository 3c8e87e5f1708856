"""Personal API tokens: made and revoked by their user in the web pages and the API, several per
user, each with a name, an expiry and a scope (read-only or read-write, all of the user's
workspaces or one). ``gpuportal login`` makes one too.

A token reads ``gpp_<key id>_<secret>``. Only the secret's SHA-256 is stored, so the token is shown
once. A revoked or expired token is refused with a 401 that says which; changing a password or
deactivating a user revokes all of that user's tokens (and Django ends their sessions).

A user who signs in through the identity provider (one with an `ExternalIdentity`) keeps a token
`PORTAL_SSO_TOKEN_MAX_DAYS` days at most (`max_days_for`): the portal cannot ask the provider about
a script's requests, so this bounds how long a person the provider no longer signs in keeps access
through a token made before. A token made longer (before the cap was set or lowered) stops working
once that old (`expires_at_of`).
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from rest_framework.exceptions import AuthenticationFailed

from apps.accounts.models import ApiToken, ExternalIdentity, WorkloadUser
from apps.audit.actions import SYSTEM, Origin, do_log_event
from apps.audit.events import Event
from apps.errors import TooMany

PREFIX = "gpp_"
_TOKEN_RE = re.compile(r"^gpp_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
# How often the last-used time is written: not on every request of a busy script.
LAST_USED_EVERY = timedelta(minutes=1)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def signs_in_through_provider(user: Any) -> bool:
    """Whether the user is one the identity provider signs in (their tokens' life is capped)."""
    return ExternalIdentity.objects.filter(user_id=user.pk).exists()


def max_days_for(user: Any) -> int:
    """The longest life the user's new token may have."""
    limit = int(settings.PORTAL_API_TOKEN_MAX_DAYS)
    return min(limit, int(settings.PORTAL_SSO_TOKEN_MAX_DAYS)) if signs_in_through_provider(user) else limit


def default_days_for(user: Any) -> int:
    """A new token's life when its maker does not say: 90 days, or the most they may have."""
    return min(90, max_days_for(user))


def expires_at_of(token: ApiToken, *, through_provider: bool) -> datetime:
    """When the token stops working: its expiry, or for a user the provider signs in, the end of
    the longest life such a user's token may have now, if that comes first."""
    expires_at: datetime = token.expires_at
    if not through_provider:
        return expires_at
    capped_at: datetime = token.created_at + timedelta(days=int(settings.PORTAL_SSO_TOKEN_MAX_DAYS))
    return min(expires_at, capped_at)


def do_create_token(
    user: Any,
    *,
    name: str,
    expires_in_days: int,
    scope: str = ApiToken.Scope.WRITE,
    workspace: Any = None,
    endpoint: Any = None,
    acting_user: Any,
    origin: Origin = SYSTEM,
    limited: bool = False,
) -> tuple[ApiToken, str]:
    """A new token for `user`, and its text (shown once, never stored). It lives `expires_in_days`,
    or `max_days_for(user)` if that is shorter (the forms and the API refuse more with a message
    first; `gpuportal login`'s token simply gets the shorter life). `limited`: made on the
    tokens page or through the API, where a user may make `PORTAL_TOKENS_PER_USER_HOUR` an hour
    (counting every token of theirs made in that hour); past it, `TooMany`. `endpoint`: a token
    for calling that inference endpoint alone (limited to its workspace too)."""
    if endpoint is not None:
        workspace = endpoint.workspace
    secret = secrets.token_urlsafe(32)
    expires_in_days = min(expires_in_days, max_days_for(user))
    with transaction.atomic():
        if limited:
            User.objects.select_for_update().filter(pk=user.pk).first()  # one maker at a time
            _check_rate(user)
        token = ApiToken.objects.create(
            user=user,
            name=name,
            key_id=secrets.token_hex(6),
            digest=_digest(secret),
            scope=scope,
            workspace=workspace,
            endpoint=endpoint,
            expires_at=timezone.now() + timedelta(days=expires_in_days),
        )
        data = {"name": name, "scope": scope, "expires_at": token.expires_at.isoformat(), "key_id": token.key_id}
        if workspace is not None:
            data["workspace"] = workspace.name
        if endpoint is not None:
            data["endpoint"] = endpoint.name
        do_log_event(Event.TOKEN_CREATE, token, acting_user=acting_user, origin=origin, data=data)
    return token, f"{PREFIX}{token.key_id}_{secret}"


def _check_rate(user: Any) -> None:
    limit = settings.PORTAL_TOKENS_PER_USER_HOUR
    made = ApiToken.objects.filter(user=user, created_at__gt=timezone.now() - timedelta(hours=1))
    times = list(made.order_by("-created_at").values_list("created_at", flat=True)[:limit])
    if len(times) >= limit:
        wait = max(1, math.ceil((times[-1] + timedelta(hours=1) - timezone.now()).total_seconds()))
        minutes = max(1, math.ceil(wait / 60))
        raise TooMany(
            f"{limit} new tokens an hour is the most one user may make; try again in {minutes} minute"
            f"{'s' if minutes != 1 else ''}, or revoke and reuse the ones you have.",
            retry_after=wait,
        )


def do_revoke_token(token: ApiToken, *, reason: str, acting_user: Any, origin: Origin = SYSTEM) -> None:
    """Revoke a token at once (the next request with it is refused); a revoked one stays revoked."""
    with transaction.atomic():
        updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_reason=reason[:200]
        )
        if updated:
            token.refresh_from_db()
            do_log_event(Event.TOKEN_REVOKE, token, acting_user=acting_user, origin=origin, data={"reason": reason})


def revoke_all(user: Any, *, reason: str, acting_user: Any = None, origin: Origin = SYSTEM) -> int:
    """Revoke every live token of `user` (a password changed, the user deactivated); how many."""
    count = 0
    for token in ApiToken.objects.filter(user=user, revoked_at__isnull=True):
        do_revoke_token(token, reason=reason, acting_user=acting_user, origin=origin)
        count += 1
    return count


def authenticate_token(key: str) -> tuple[Any, ApiToken]:
    """The user a personal token acts for (limited to its workspace if it has one), and the token;
    AuthenticationFailed, saying why, if it is not genuine, revoked, expired or its user inactive."""
    match = _TOKEN_RE.match(key)
    through_provider = Exists(ExternalIdentity.objects.filter(user_id=OuterRef("user_id")))
    tokens = ApiToken.objects.select_related("user").annotate(through_provider=through_provider)
    token = tokens.filter(key_id=match.group(1)).first() if match else None
    if match is None or token is None or not constant_time_compare(token.digest, _digest(match.group(2))):
        raise AuthenticationFailed("Invalid token.")
    now = timezone.now()
    if token.revoked_at is not None:
        why = f": {token.revoked_reason}" if token.revoked_reason else ""
        raise AuthenticationFailed(f"This token was revoked on {token.revoked_at:%Y-%m-%d %H:%M} UTC{why}.")
    expires_at = expires_at_of(token, through_provider=token.through_provider)  # type: ignore[attr-defined]
    if expires_at <= now:
        raise AuthenticationFailed(f"This token expired on {expires_at:%Y-%m-%d %H:%M} UTC; create a new one.")
    if not token.user.is_active:
        raise AuthenticationFailed("User inactive or deleted.")
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    user: Any = token.user
    if token.workspace_id is not None:
        user = WorkloadUser.acting_for(token.user, workspace_id=token.workspace_id, workload=f"token {token.key_id}")
    return user, token
