"""A user's credential stamp: a short value that changes whenever what lets the user in changes.

It is an HMAC, keyed with ``SECRET_KEY``, of the user's password hash and active flag. So it
changes on a password change, on deactivation, and when single sign-on ends a user's access
(``set_unusable_password()`` gives a new random hash each time). Whatever a user's sign-in was
turned into and handed on (a notebook server's session cookie, a workload's token) carries the
stamp of that moment and stops working once the stamp it carries is no longer the user's.
"""

from __future__ import annotations

from typing import Any

from django.utils.crypto import constant_time_compare, salted_hmac

_SALT = "apps.accounts.stamps.credentials"


def credential_stamp(user: Any, secret: str | None = None) -> str:
    """The user's stamp now (32 hex digits)."""
    message = f"{user.pk}:{user.password}:{int(bool(user.is_active))}"
    return salted_hmac(_SALT, message, secret=secret, algorithm="sha256").hexdigest()[:32]


def stamp_matches(user: Any, stamp: str) -> bool:
    """Whether ``stamp`` is the user's stamp now."""
    return bool(stamp) and constant_time_compare(stamp, credential_stamp(user))
