"""Who a request to a Ray cluster's own host acts for (the portal's proxy: apps/rayclusters/proxy.py).

Two ways in, both checked again at every request:

- a token in ``Authorization: Bearer <token>`` (or ``Token <token>``): a user's personal API token,
  or a workload's own ``GPUPORTAL_TOKEN``, with exactly the rules they have on the portal's API
  (apps/accounts/authentication.py): a read-only token only reads, a workload's token never
  administers (submitting Ray jobs is like creating jobs: allowed). This is what Ray's own
  ``JobSubmissionClient(address=dashboard_url, headers={"Authorization": "Bearer ..."})`` sends.
- in a browser, the sign-in handoff of notebooks: the portal's authorize page (on its own origin,
  apps/rayclusters/views_auth.py) issues a one-time code to a signed-in user who may see the
  cluster; the cluster's host redeems it at ``/portal-auth/callback`` and sets a cookie of its own:
  host-only, HttpOnly, SameSite=Lax, Secure (and ``__Host-``) when the portal is on https, signed
  with the portal's secret key, bound to the cluster, the user and the user's credential stamp
  (apps/accounts/stamps.py). A password change, a deactivation or the end of a single sign-on
  session ends it. The cookie only reads (GET, HEAD, OPTIONS): a page cannot submit anything with it.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from rest_framework.exceptions import APIException
from rest_framework.request import Request

from apps.accounts.authentication import PortalTokenAuthentication
from apps.accounts.stamps import credential_stamp, stamp_matches
from apps.audit.actions import SYSTEM, Origin, do_log_event
from apps.audit.events import Event
from apps.rayclusters.models import RayCluster, RayDashboardCode
from apps.workspaces.access import VIEW, may

CODE_TTL = timedelta(seconds=30)
# How long a browser stays signed in to a cluster's dashboard (checked against the user's access,
# active flag and credential stamp at every request all along).
COOKIE_MAX_AGE_S = 12 * 3600
_COOKIE_SALT = "apps.rayclusters.signin.cookie"
TOKEN_SCHEMES = ("bearer", "token")


class TokenRefused(Exception):
    """A token was presented and is not accepted: ``status`` (401 or 403) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Dashboard:
    """What the token rules (apps/api/permissions.py) read of the view a request goes to: Ray's
    dashboard and Jobs API are workloads' business, like the jobs endpoints."""

    workload_tokens_may_change = True


def token_user(request: HttpRequest) -> Any | None:
    """The user the request's ``Authorization`` token acts for; None without that header.
    ``TokenRefused`` for a header that is not a genuine, live token of the portal's, or a request
    the token may not make."""
    header = request.headers.get("Authorization", "")
    if not header:
        return None
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() not in TOKEN_SCHEMES or not key.strip() or " " in key.strip():
        raise TokenRefused(401, "Send a portal token: Authorization: Bearer <token>.")
    authentication = PortalTokenAuthentication()
    authentication.keyword = scheme  # DRF's class matches the scheme's word case-insensitively
    try:
        answer = authentication.authenticate(Request(request, parser_context={"view": _Dashboard()}))
    except APIException as exc:
        status = exc.status_code if exc.status_code in (401, 403) else 401
        raise TokenRefused(status, str(exc.detail)) from exc
    return None if answer is None else answer[0]


# -- the one-time codes -------------------------------------------------------------------------


def _code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


@transaction.atomic(durable=True)
def do_issue_dashboard_code(cluster: RayCluster, *, acting_user: Any, origin: Origin = SYSTEM) -> str:
    """A code that signs ``acting_user`` in to the cluster's dashboard host: single-use, valid for
    ``CODE_TTL``, bound to this cluster and user. The caller has checked that the user may see the
    cluster; only the code's hash is stored."""
    now = timezone.now()
    RayDashboardCode.objects.filter(expires_at__lt=now - CODE_TTL).delete()  # long dead: keep the table small
    code = secrets.token_urlsafe(32)
    RayDashboardCode.objects.create(
        cluster=cluster, user=acting_user, code_hash=_code_hash(code), expires_at=now + CODE_TTL
    )
    do_log_event(Event.RAY_OPEN, cluster, acting_user=acting_user, origin=origin, workspace=cluster.workspace)
    return code


@transaction.atomic(durable=True)
def do_redeem_dashboard_code(cluster: RayCluster, code: str) -> Any | None:
    """The user a code was issued to, if it is this cluster's, unused and unexpired, and the user
    is active and may still see the cluster; the code is spent either way. None otherwise (a code
    of another cluster is refused here, and stays unspent for its own)."""
    now = timezone.now()
    digest = _code_hash(code)
    spent = RayDashboardCode.objects.filter(
        code_hash=digest, cluster=cluster, used_at__isnull=True, expires_at__gt=now
    ).update(used_at=now)
    if spent != 1:
        return None
    user = RayDashboardCode.objects.select_related("user").get(code_hash=digest).user
    return user if user.is_active and may(user, cluster, VIEW) else None


# -- the cookie ---------------------------------------------------------------------------------


def secure() -> bool:
    """Whether the cluster hosts are served over https (the portal's public scheme)."""
    return str(settings.PORTAL_PUBLIC_URL).startswith("https:")


def cookie_name() -> str:
    """``__Host-`` on https: a browser then takes it only from this very host (Secure, Path=/, no
    Domain), so no sibling host under the notebook domain can plant one."""
    return "__Host-gpuportal-ray" if secure() else "gpuportal-ray"


def set_session(response: HttpResponse, cluster: RayCluster, user: Any) -> None:
    value = signing.dumps({"c": cluster.pk, "u": user.pk, "s": credential_stamp(user)}, salt=_COOKIE_SALT)
    response.set_cookie(
        cookie_name(), value, path="/", secure=secure(), httponly=True, samesite="Lax"
    )  # no max_age: it ends with the browser, and its signature's age is checked


def session_user(request: HttpRequest, cluster: RayCluster) -> Any | None:
    """The user the request's cookie signs in on this cluster's host, if it is genuine, of this
    cluster, younger than ``COOKIE_MAX_AGE_S``, and its user is active with the same credentials."""
    raw = request.COOKIES.get(cookie_name(), "")
    if not raw or len(raw) > 1000:
        return None
    try:
        payload = signing.loads(raw, salt=_COOKIE_SALT, max_age=COOKIE_MAX_AGE_S)
    except signing.BadSignature:
        return None
    if not isinstance(payload, dict) or payload.get("c") != cluster.pk or not isinstance(payload.get("u"), int):
        return None
    user = get_user_model().objects.filter(pk=payload["u"], is_active=True).first()
    stamp = payload.get("s")
    if user is None or not isinstance(stamp, str) or not stamp_matches(user, stamp):
        return None
    return user
