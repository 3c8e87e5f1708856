"""How the API authenticates a token: a user's own (``gpuportal login``), or a workload's."""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from apps.accounts.tokens import PREFIX, user_for_token


class PortalTokenAuthentication(TokenAuthentication):
    """DRF's token authentication (``Authorization: Token <key>``), which also takes the token a
    notebook, instance or job has in its environment (apps/accounts/tokens.py): that one acts for
    its launcher in its workspace alone. Both are refused with the same answer."""

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        if not key.startswith(PREFIX):
            return super().authenticate_credentials(key)
        user = user_for_token(key)
        if user is None:
            raise AuthenticationFailed("Invalid token.")
        return user, None
