"""Who may use a notebook server: loaded by the Jupyter server the portal starts.

The server is served at the root of a host name of its own (``<label>.<PORTAL_NOTEBOOK_DOMAIN>``),
an origin the portal's cookies never reach. A request gets in, on any path:

- with the server's own token (``JUPYTER_TOKEN``, which the portal shows the workspace's members,
  for IDEs and scripts) in an ``Authorization: token <t>`` header or ``?token=<t>``; or
- with this server's own session cookie, set by the sign-in handoff below, while the portal
  still says its user may use the notebook with the credentials they signed in with (asked again
  at most every second, so that removing someone's access, or a change of their password, ends it
  at their next request).

A WebSocket (a kernel's, a terminal's) is let in the same way, and stays open only while that
holds: the portal is asked again every second about each user with one open, and the sockets of a
user it refuses are closed (1008, policy violation), what they send from then on going nowhere.

Anything else, landing page, static files and API included, is redirected to the portal's
authorize page (a WebSocket is refused, 403), exactly as the portal answers for a host with no
notebook behind it (apps/compute/middleware.py). There a signed-in user who may use the notebook gets a one-time
code and comes back to ``/portal-auth/callback``, where this server redeems the code with the
portal, server to server, authenticating with its token, and sets its own cookie: host-only,
HttpOnly, SameSite=Lax, signed with a secret this server process alone holds. The cookie carries
the user's credential stamp, which the portal hands over with the username and which stops
matching when their password changes or their account is deactivated (apps/accounts/stamps.py).
The portal's credentials never reach the server, and the server never passes any on.

The process is made non-dumpable when this module is imported (before the server starts, see
workers/backends/processes.py): kernels and terminals run as the same account, in the same
sandbox, but cannot read its memory or its environment through /proc, nor trace it.

The server runs in the notebook's own environment, so this module needs nothing but the Jupyter
server itself.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import hmac
import json
import secrets
import sys
import time
import urllib.parse
import weakref
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.auth.identity import IdentityProvider, User
from jupyter_server.base.handlers import JupyterHandler
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.ioloop import PeriodicCallback
from tornado.websocket import WebSocketHandler
from traitlets import Float, Unicode

CALLBACK_PATH = "/portal-auth/callback"
# The same bytes and headers as the portal's answers for a host with no notebook behind it.
CALLBACK_REFUSED = "This sign-in link is invalid or has expired. Open the notebook again from the portal.\n"
ANSWER_HEADERS = {"Cache-Control": "no-store", "Server": "gpuportal", "X-Content-Type-Options": "nosniff"}
SESSION_DAYS = 7.0
# How often the portal is asked again about the users of open WebSockets.
SOCKET_RECHECK_S = 1.0
POLICY_VIOLATION = 1008  # the WebSocket close code of a socket whose user lost access
_PR_SET_DUMPABLE = 4


def _make_undumpable() -> None:
    """No process of the same account may trace this one or read its /proc files (memory,
    environment): they become root's. Without it the server does not run."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


_make_undumpable()


def serve() -> None:
    """Run the Jupyter server with the command line's options (the portal's launcher calls it)."""
    from jupyter_server.serverapp import main

    sys.argv[0] = "jupyter-server"
    sys.exit(main())


def _notebook_token_user() -> User:
    """Who comes with the server's token: not a portal user (Jupyter's anonymous user, named)."""
    return User(username="notebook-token", name="Notebook token", display_name="Notebook token")


class PortalUnavailable(Exception):
    """The portal could not be asked (down, or an unexpected answer): 503, the session kept."""


class PortalIdentityProvider(IdentityProvider):  # type: ignore[misc]
    portal_url = Unicode(
        "", config=True, help="The portal's URL for this notebook: <PORTAL_INTERNAL_URL>/internal/notebooks/<id>/"
    )
    access_cache_seconds = Float(1.0, config=True, help="How long the portal's yes or no is reused (at most 1 s).")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._process_secret = secrets.token_bytes(32)
        self._config: dict[str, Any] | None = None
        self._answers: dict[tuple[str, str], tuple[float, bool]] = {}
        # Each open WebSocket of a signed-in user, with whom it was let in for (username, stamp).
        self._sockets: weakref.WeakKeyDictionary[Any, tuple[str, str]] = weakref.WeakKeyDictionary()
        self._recheck: PeriodicCallback | None = None

    # -- Jupyter's hooks ------------------------------------------------------------------------

    def cookie_secret_hook(self, h: Any) -> Any:
        """Sessions are signed with a secret of this process alone: a restart ends them (the
        browser signs in again through the portal, unnoticed), and no file holds it."""
        h.update(self._process_secret)
        return h

    def get_handlers(self) -> list[tuple[str, object]]:
        """The callback, and the routes Jupyter serves without asking who is there, asking."""
        return [
            (CALLBACK_PATH, PortalCallbackHandler),
            (r"/?", RootHandler),
            (r".*/", TrailingSlashHandler),
            (r"/(?:robots\.txt|favicon\.ico)", NotFoundHandler),
        ]

    async def get_user(self, handler: Any) -> User | None:
        try:
            if isinstance(handler, PortalCallbackHandler) or await self._is_readiness_probe(handler):
                return None  # the callback signs the browser in; a probe learns the server is up
            user = await self._token_user(handler) or await self._session_user(handler)
            if user is None:
                await self._send_to_portal(handler)
        except PortalUnavailable:
            self.log.warning("The portal cannot be reached: %s refused for now", handler.request.path, exc_info=True)
            _bare_answer(handler, 503, "The portal cannot be reached to check who may use this notebook. Try again.\n")
            raise web.Finish() from None
        return user

    async def _is_readiness_probe(self, handler: Any) -> bool:
        """``GET /api`` (the server's version, all it tells) by the backend's readiness check, which
        connects by the node's address. Through the proxy a request always names the notebook's
        own host, so it never is one."""
        if handler.request.path != "/api" or handler.request.method not in ("GET", "HEAD"):
            return False
        host = handler.request.host.lower()
        return not host.startswith((await self._portal_config())["label"] + ".")

    # -- the token, and the session cookie --------------------------------------------------------

    async def _token_user(self, handler: Any) -> User | None:
        presented = self.get_token(handler) or ""
        if not self.token or not hmac.compare_digest(presented.encode(), self.token.encode()):
            return None
        handler._token_authenticated = True  # a script or an IDE: no XSRF cookie to check, as in Jupyter
        if handler.get_argument("token", ""):  # a browser: keep it signed in, as Jupyter does
            await self._portal_config()  # the cookie's name and flags follow the portal's scheme
            self._set_session(handler, {"k": "token", "t": self._token_fingerprint()})
        return _notebook_token_user()

    def _token_fingerprint(self) -> str:
        return hashlib.sha256(self.token.encode()).hexdigest()[:32]

    def _cookie_name(self) -> str:
        return "__Host-gpuportal-notebook" if self._secure() else "gpuportal-notebook"

    def _secure(self) -> bool:
        return bool(self._config and self._config["authorize_url"].startswith("https:"))

    def _set_session(self, handler: Any, payload: dict[str, str]) -> None:
        handler.set_signed_cookie(
            self._cookie_name(),
            json.dumps(payload),
            expires_days=None,
            path="/",
            httponly=True,
            secure=self._secure(),
            samesite="Lax",
        )

    async def _session_user(self, handler: Any) -> User | None:
        await self._portal_config()  # the cookie's name depends on the portal's scheme
        raw = handler.get_signed_cookie(self._cookie_name(), max_age_days=SESSION_DAYS)
        if not raw:
            return None
        try:
            payload = json.loads(raw)
        except ValueError:
            return None
        if payload.get("k") == "token" and hmac.compare_digest(str(payload.get("t")), self._token_fingerprint()):
            return _notebook_token_user()
        user = payload.get("u"), payload.get("s")
        if payload.get("k") != "user" or not all(isinstance(part, str) and part for part in user):
            return None  # a session from before stamps were kept: signed in again through the portal
        username, stamp = str(user[0]), str(user[1])
        if not await self._may_use(username, stamp):
            handler.clear_cookie(self._cookie_name(), path="/")
            return None
        if isinstance(handler, WebSocketHandler):
            self._watch_socket(handler, username, stamp)
        return User(username=username, name=username, display_name=username)

    async def _may_use(self, username: str, stamp: str, *, fresh: bool = False) -> bool:
        """Whether the portal lets ``username`` in with ``stamp``; its answer is reused for at most
        a second, unless ``fresh``."""
        now = time.monotonic()
        cached = self._answers.get((username, stamp))
        if not fresh and cached is not None and cached[0] > now:
            return cached[1]
        path = f"users/{urllib.parse.quote(username, safe='')}/?" + urllib.parse.urlencode({"stamp": stamp})
        code, _ = await self._ask_portal("GET", path)
        if code not in (200, 403):
            raise PortalUnavailable(f"the portal answered {code}")
        if len(self._answers) > 1000:
            self._answers.clear()
        self._answers[(username, stamp)] = (now + min(self.access_cache_seconds, 1.0), code == 200)
        return code == 200

    # -- open WebSockets ---------------------------------------------------------------------------

    def _watch_socket(self, handler: Any, username: str, stamp: str) -> None:
        self._sockets[handler] = (username, stamp)
        if self._recheck is None:
            self._recheck = PeriodicCallback(self._recheck_sockets, SOCKET_RECHECK_S * 1000)
            self._recheck.start()

    async def _recheck_sockets(self) -> None:
        """Ask the portal again about each user with an open WebSocket, and close the sockets of
        those it no longer lets in. While it cannot be asked, sockets stay open (as sessions do)."""
        open_sockets = {h: who for h, who in list(self._sockets.items()) if h.ws_connection is not None}
        users = sorted(set(open_sockets.values()))
        answers = await asyncio.gather(*(self._may_use(*who, fresh=True) for who in users), return_exceptions=True)
        refused = set()
        for who, answer in zip(users, answers, strict=True):
            if isinstance(answer, PortalUnavailable):
                self.log.warning("The portal cannot be reached to check %s's open sockets: %s", who[0], answer)
            elif isinstance(answer, BaseException):
                self.log.error("Checking %s's open sockets failed", who[0], exc_info=answer)
            elif not answer:
                refused.add(who)
        for handler, who in open_sockets.items():
            if who in refused:
                self.log.info("Closing a WebSocket of %s, who may no longer use this notebook", who[0])
                self._sockets.pop(handler, None)
                _end_socket(handler)

    # -- the handoff ------------------------------------------------------------------------------

    async def _send_to_portal(self, handler: Any) -> None:
        """Redirect to the portal's authorize page and stop there: no handler runs."""
        config = await self._portal_config()
        request = handler.request
        if request.headers.get("Upgrade", "").lower() == "websocket":  # cannot follow a redirect
            _bare_answer(handler, 403)
            raise web.Finish()
        target = urllib.parse.unquote(request.path) + ("?" + request.query if request.query else "")
        location = config["authorize_url"] + "?" + urllib.parse.urlencode({"next": target})
        _bare_answer(handler, 302, location=location)
        raise web.Finish()

    async def redeem(self, code: str) -> tuple[str, str] | None:
        """The username the portal issued ``code`` to, for this notebook, and their credential
        stamp; None if it refuses."""
        status, body = await self._ask_portal("POST", "code/", {"code": code})
        username, stamp = body.get("username"), body.get("stamp")
        if status == 200 and isinstance(username, str) and isinstance(stamp, str) and username and stamp:
            self._answers.pop((username, stamp), None)
            return username, stamp
        if status != 403:
            self.log.warning("The portal answered %s to a sign-in code", status)
        return None

    def sign_in(self, handler: Any, username: str, stamp: str) -> None:
        self._set_session(handler, {"k": "user", "u": username, "s": stamp})

    async def _portal_config(self) -> dict[str, Any]:
        if self._config is None:
            status, body = await self._ask_portal("GET", "")
            if status != 200 or not str(body.get("authorize_url", "")).startswith(("http://", "https://")):
                raise PortalUnavailable(f"the portal answered {status} for this notebook")
            self._config = body
        return self._config

    async def _ask_portal(self, method: str, path: str, payload: Any = None) -> tuple[int, dict[str, Any]]:
        if not self.portal_url:
            raise PortalUnavailable("PortalIdentityProvider.portal_url is not set")
        request = HTTPRequest(
            self.portal_url + path,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            body=json.dumps(payload) if payload is not None else None,
            request_timeout=10,
            follow_redirects=False,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as exc:  # refused, unreachable, timed out
            raise PortalUnavailable(f"{method} {request.url}: {exc}") from exc
        if response.code >= 500:
            self.log.warning("The portal answered %s to %s %s", response.code, method, path or "/")
        try:
            body = json.loads(response.body or b"{}")
        except ValueError:
            body = {}
        return response.code, body if isinstance(body, dict) else {}


def _bare_answer(handler: Any, status: int, body: str = "", *, location: str = "") -> None:
    """Send an answer with the portal's headers for notebook hosts and none of Jupyter's: the
    same bytes as the portal's for a host with no notebook behind it."""
    handler.clear()
    for name in ("Content-Security-Policy", *handler.settings.get("headers", {})):
        handler.clear_header(name)
    handler.set_status(status)
    handler.set_header("Content-Type", "text/plain; charset=utf-8")
    for name, value in ANSWER_HEADERS.items():
        handler.set_header(name, value)
    if location:
        handler.set_header("Location", location)
    web.RequestHandler.finish(handler, body)  # not Jupyter's API finish, which makes it JSON


def _end_socket(handler: Any) -> None:
    """Close a WebSocket whose user lost access. The client may take seconds to answer the close
    (Tornado waits up to 5 s); what it sends meanwhile is dropped, never handed to the kernel or
    the terminal."""
    handler.on_message = _drop_message
    handler.close(POLICY_VIOLATION, "Access to this notebook has ended.")


def _drop_message(message: str | bytes) -> None:
    return None


def _safe_next(value: str) -> str:
    """A path on this host, else ``/``: never an open redirect (as apps/compute/hosts.py)."""
    if (
        not value.startswith("/")
        or value.startswith("//")
        or "\\" in value
        or any(ord(c) < 0x21 or ord(c) == 0x7F for c in value)
    ):
        return "/"
    return value


class PortalCallbackHandler(JupyterHandler):  # type: ignore[misc]
    """Where the portal sends the browser with a one-time code: redeem it, set the session, go on."""

    @allow_unauthenticated
    async def get(self) -> None:
        provider = self.identity_provider
        code = self.get_argument("code", "")
        try:
            redeemed = await provider.redeem(code) if 0 < len(code) <= 200 else None
        except PortalUnavailable:
            self.log.warning("The portal cannot be reached to redeem a sign-in code", exc_info=True)
            _bare_answer(self, 503, "The portal cannot be reached to sign you in. Try again.\n")
            return
        if redeemed is None:
            _bare_answer(self, 403, CALLBACK_REFUSED)
            return
        provider.sign_in(self, *redeemed)
        self.redirect(_safe_next(self.get_argument("next", "/")))


class RootHandler(JupyterHandler):  # type: ignore[misc]
    """``/``: Jupyter's own (a redirect to the default URL, or its main page), for users only."""

    def get(self) -> None:
        default = self.settings.get("default_url", "/")
        if default.rstrip("/") != self.base_url.rstrip("/"):
            self.redirect(default + ("?" + self.request.query if self.request.query else ""))
        else:
            self.write(self.render_template("main.html"))


class TrailingSlashHandler(JupyterHandler):  # type: ignore[misc]
    """Jupyter's trailing-slash redirect, for users only."""

    def get(self) -> None:
        path, *rest = self.request.uri.partition("?")
        self.redirect("".join(["/" + path.strip("/"), *rest]))

    post = put = get


class NotFoundHandler(JupyterHandler):  # type: ignore[misc]
    """What Jupyter serves without asking (robots.txt, favicon.ico): nothing, and only to users."""

    def get(self) -> None:
        raise web.HTTPError(404)
