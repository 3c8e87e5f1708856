"""How the API authenticates a token: a user's personal one (apps/accounts/api_tokens.py, made in
the web pages, the API or by ``gpuportal login``), or a workload's (apps/accounts/tokens.py)."""

from __future__ import annotations

import re
from typing import Any

from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request

from apps.accounts import api_tokens, tokens
from apps.accounts.models import ApiToken
from apps.api.permissions import check_workload_request

_OLD_KEY = re.compile(r"^[0-9a-f]{40}$")  # the single, never-expiring key per user of earlier versions


class PortalTokenAuthentication(TokenAuthentication):
    """``Authorization: Token <token>``: a personal token acts for its user (in one workspace, if it
    is limited to one; reading only, if it is read-only), a workload's for its launcher in its
    workspace alone, never to administer (apps/api/permissions.py). Anything else, the keys of
    earlier versions included, is refused."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        answer = super().authenticate(request)
        if answer is not None:
            token = answer[1]
            if isinstance(token, ApiToken) and token.endpoint_id is not None:
                raise AuthenticationFailed(
                    "This token is made for calling one inference endpoint, at its own URL: it opens nothing else."
                )
            if (
                isinstance(token, ApiToken)
                and token.scope == ApiToken.Scope.READ
                and request.method not in SAFE_METHODS
            ):
                raise PermissionDenied("This token is read-only: it can read but not change anything.")
            check_workload_request(request, answer[0])  # a workload's token never administers
        return answer

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        if key.startswith(api_tokens.PREFIX):
            return api_tokens.authenticate_token(key)
        if key.startswith(tokens.PREFIX):
            user = tokens.user_for_token(key)
            if user is None:
                raise AuthenticationFailed("Invalid token.")
            return user, None
        if _OLD_KEY.match(key):
            raise AuthenticationFailed(
                "Tokens of this kind are no longer accepted: sign in again with `gpuportal login`, or create a "
                "personal token on your API tokens page."
            )
        raise AuthenticationFailed("Invalid token.")
