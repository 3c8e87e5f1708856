"""The CLI's sign-in through the browser, for portals that sign in through an identity provider (and
any other): the device authorization grant's shape (RFC 8628), with the portal as the server.

1. `gpuportal login` asks for a login (`start`): it gets a secret device code and a short user code.
2. The person opens the portal's page (`/cli-login/?code=...`), signs in there however the portal
   signs people in, checks the code matches the one their terminal shows, and allows it (`decide`).
3. The CLI, asking every few seconds (`collect`), gets a personal token of that person's, once.

A login lives `TTL_S` seconds; it can be allowed or refused once, and its token collected once. The
user code carries about 40 bits: guessing one in its ten minutes would take ~10^11 tries.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.accounts import api_tokens
from apps.accounts.models import DeviceLogin
from apps.audit.actions import Origin
from apps.errors import ActionError

TTL_S = 600
INTERVAL_S = 2
ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"  # no vowels (no words), no look-alikes


class LoginError(ActionError):
    """What `collect` answers while there is no token to give (HTTP 400): RFC 8628's error codes, as
    the error's code, about the device code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, field="device_code")
        self.code = code


def _digest(device_code: str) -> str:
    return hashlib.sha256(device_code.encode()).hexdigest()


def normalize(user_code: str) -> str:
    letters = "".join(c for c in user_code.upper() if c.isalnum())
    return f"{letters[:4]}-{letters[4:8]}" if len(letters) == 8 else letters


def start(name: str, *, address: str | None) -> tuple[str, DeviceLogin]:
    """A new login: its device code (the CLI's secret, shown only here) and its row."""
    DeviceLogin.objects.filter(expires_at__lt=timezone.now() - timedelta(days=1)).delete()
    device_code = secrets.token_urlsafe(32)
    while True:
        user_code = normalize("".join(secrets.choice(ALPHABET) for _ in range(8)))
        if not DeviceLogin.objects.filter(user_code=user_code).exists():
            break
    row = DeviceLogin.objects.create(
        digest=_digest(device_code),
        user_code=user_code,
        name=name,
        address=address,
        expires_at=timezone.now() + timedelta(seconds=TTL_S),
    )
    return device_code, row


def pending(user_code: str) -> DeviceLogin | None:
    """The login with this code, if it is still waiting for a decision."""
    return DeviceLogin.objects.filter(
        user_code=normalize(user_code), expires_at__gt=timezone.now(), decided_at__isnull=True
    ).first()


def decide(row: DeviceLogin, user: Any, *, allow: bool) -> bool:
    """Allow (or refuse) the login, for `user`; False if it was decided or expired meanwhile."""
    decided = DeviceLogin.objects.filter(pk=row.pk, expires_at__gt=timezone.now(), decided_at__isnull=True).update(
        user=user, decided_at=timezone.now(), approved=allow
    )
    return decided == 1


def collect(device_code: str, *, origin: Origin) -> str:
    """The personal token of the person who allowed the login; LoginError while there is none."""
    with transaction.atomic():
        row = DeviceLogin.objects.select_for_update().filter(digest=_digest(device_code)).first()
        if row is None:
            raise LoginError("invalid_grant", "No such login: start again with `gpuportal login`.")
        if row.collected_at is not None:
            raise LoginError("invalid_grant", "This login's token was already collected.")
        if row.decided_at is None:
            if row.expires_at <= timezone.now():
                raise LoginError("expired_token", "The code expired before anyone allowed it: start again.")
            raise LoginError("authorization_pending", "Waiting for the code to be allowed in the browser.")
        if not row.approved or row.user is None or not row.user.is_active:
            raise LoginError("access_denied", "The login was refused in the browser.")
        row.collected_at = timezone.now()
        row.save(update_fields=["collected_at"])
        _, text = api_tokens.do_create_token(
            row.user,
            name=row.name,
            expires_in_days=settings.PORTAL_LOGIN_TOKEN_DAYS,
            acting_user=row.user,
            origin=origin,
        )
    return text
