"""Sign-in attempts are rate-limited: after `PER_ACCOUNT` failures for one account, or `PER_ADDRESS`
from one client address, within `WINDOW`, every attempt (the right password too, else guessing would
go on at full speed) is refused with HTTP 429 and `Retry-After` until the window that began with the
first failure ends. It applies to the web sign-in page and to the token endpoint (`gpuportal login`).

The account is the username as authentication resolves it (`sign_in_name()`: the sign-in form's
stripping and NFKC, then without case), so " victor ", "victor\\t" and a full-width "ｖｉｃｔｏｒ" all
count against, and are all stopped by, victor's one count.

The address is the client's, read through the trusted proxies (apps/accounts/addresses.py). The
address limit counts distinct clients only: a trusted proxy's own address (requests made on the
proxy's machine: the embedded portal's local browser, workloads) and an address that cannot be told
stand for many people and are never counted, so no number of failures from them, or from any one
client, stops anyone else. The account limit alone then holds. So failures from one client throttle
that client, and stop an account only once that account itself has failed `PER_ACCOUNT` times.

Counts are kept in the database, so they hold across the portal's processes, in the embedded
default and in production alike; a success clears its account's count.
"""

from __future__ import annotations

import hashlib
import math
from datetime import timedelta
from typing import Any

from django.contrib.auth.forms import UsernameField
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.db import IntegrityError, transaction
from django.db.models import F
from django.dispatch import receiver
from django.http import HttpRequest
from django.utils import timezone

from apps.accounts.addresses import distinct_client_address
from apps.accounts.models import SignInFailures

WINDOW = timedelta(minutes=5)
PER_ACCOUNT = 10
PER_ADDRESS = 50


_USERNAME = UsernameField()  # the sign-in form's field (AuthenticationForm.username)


def sign_in_name(typed: str) -> str:
    """A typed username as the sign-in form hands it to authentication: Django's own username field
    (surrounding whitespace stripped, then NFKC, as `AbstractBaseUser.normalize_username`)."""
    return str(_USERNAME.to_python(typed))


def _account_key(username: str) -> str:
    return _hash(f"account:{sign_in_name(username).casefold()}")


def _keys(username: str, request: HttpRequest | None) -> dict[str, int]:
    """The counts an attempt adds to, each with its limit."""
    keys = {_account_key(username): PER_ACCOUNT}
    address = distinct_client_address(request)
    if address:
        keys[_hash(f"address:{address}")] = PER_ADDRESS
    return keys


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def retry_after(username: str, request: HttpRequest | None) -> int:
    """Seconds until sign-in may be tried again for this username from this request's address; 0 if
    it may be tried now."""
    now = timezone.now()
    keys = _keys(username, request)
    wait = 0.0
    for row in SignInFailures.objects.filter(key__in=keys, since__gt=now - WINDOW):
        if row.failures >= keys[row.key]:
            wait = max(wait, (row.since + WINDOW - now).total_seconds())
    return math.ceil(wait)


def message(seconds: int) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    return (
        "Too many failed sign-ins for this account or from this address; "
        f"try again in {minutes} minute{'s' if minutes != 1 else ''}."
    )


@receiver(user_login_failed)
def count_failure(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any) -> None:
    """Django sends this for every failed `authenticate()`: the sign-in page's and the token endpoint's."""
    now = timezone.now()
    for key in _keys(str(credentials.get("username") or ""), request):
        with transaction.atomic():
            row = SignInFailures.objects.select_for_update().filter(key=key).first()
            if row is None:
                try:
                    with transaction.atomic():
                        SignInFailures.objects.create(key=key, failures=1, since=now)
                except IntegrityError:  # another process counted a first failure at the same moment
                    SignInFailures.objects.filter(key=key).update(failures=F("failures") + 1)
            elif row.since <= now - WINDOW:  # a new window
                SignInFailures.objects.filter(pk=row.pk).update(failures=1, since=now)
            else:
                SignInFailures.objects.filter(pk=row.pk).update(failures=F("failures") + 1)
    SignInFailures.objects.filter(since__lte=now - 2 * WINDOW).delete()  # long over: forget them


def clear_account(username: str) -> None:
    """A successful sign-in: its account's failures are forgotten (its address's are not)."""
    SignInFailures.objects.filter(key=_account_key(username)).delete()


@receiver(user_logged_in)
def signed_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    clear_account(user.get_username())
