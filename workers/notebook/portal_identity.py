"""Who may use a notebook server: loaded by the Jupyter server the portal starts.

The server runs in the notebook's own environment, so this module needs nothing but the Jupyter
server itself. A request gets in with the server's own token (the portal shows it to the
notebook's workspace members), or when the portal says the request's own credentials (its
session cookie or its ``Authorization: Token`` header, passed on as they came) belong to someone
allowed to use this notebook. Answers are cached for a few seconds, so a page load with many
requests asks the portal once.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from jupyter_server.auth.identity import IdentityProvider, User
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from traitlets import Float, Unicode


class PortalIdentityProvider(IdentityProvider):  # type: ignore[misc]
    portal_auth_url = Unicode("", config=True, help="The portal's access check for this notebook.")
    cache_seconds = Float(10.0, config=True, help="How long an answer of the portal is reused.")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._answers: dict[str, tuple[float, User | None]] = {}

    async def get_user(self, handler: Any) -> User | None:
        user: User | None = await self._get_user(handler)  # the server's token, or its login cookie
        if user is not None or not self.portal_auth_url:
            return user
        headers = {}
        for name in ("Cookie", "Authorization"):
            value = handler.request.headers.get(name)
            if value:
                headers[name] = value
        if not headers:
            return None
        key = hashlib.sha256(json.dumps(headers, sort_keys=True).encode()).hexdigest()
        now = time.monotonic()
        cached = self._answers.get(key)
        if cached is not None and cached[0] > now:
            user = cached[1]
        else:
            user = await self._ask_portal(headers)
            if len(self._answers) > 1000:
                self._answers.clear()
            self._answers[key] = (now + self.cache_seconds, user)
        if user is not None and "Authorization" in headers:
            # An API client, not a browser: no XSRF cookie to check (as with the server's own token).
            handler._token_authenticated = True
        return user

    async def _ask_portal(self, headers: dict[str, str]) -> User | None:
        request = HTTPRequest(self.portal_auth_url, headers=headers, request_timeout=10, follow_redirects=False)
        response = await AsyncHTTPClient().fetch(request, raise_error=False)
        if response.code != 200:
            if response.code >= 500 or response.code == 599:
                self.log.warning("The portal's access check answered %s", response.code)
            return None
        try:
            name = str(json.loads(response.body)["username"])
        except (ValueError, KeyError, TypeError):
            return None
        return User(username=name, name=name, display_name=name)
