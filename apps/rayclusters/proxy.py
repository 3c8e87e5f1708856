"""A Ray cluster's dashboard and Jobs API, served on the cluster's own host through the portal.

Ray's dashboard runs whatever code reaches it (a job is a command line), so it is never exposed:
no reverse-proxy route is made for a cluster's host, whose requests reach the portal itself
(apps/compute/middleware.py hands them here). Each request is authenticated (apps/rayclusters/
signin.py: a portal token, or in a browser the cookie of the sign-in handoff) and checked:

- the user must see the cluster (the access layer, VIEW), else 404, as for a cluster that does
  not exist; GET, HEAD and OPTIONS need no more, any other method needs USE (a viewer looks, 403
  for anything else), and a token (a browser's cookie reads only);
- a browser's cookie counts only for what the cluster's own pages fetch and for pages the user
  opens, not for what a page of another host under the same domain makes the browser fetch here;
- the cluster must run (RUNNING or DEGRADED), else 503.

Then it goes to the cluster's ``proxy_target`` (its dashboard: ``http+unix://<socket>`` on this
machine, ``http://host:port`` on Slurm and Kubernetes) with the client's ``Authorization``,
``X-Ray-Authorization``, ``Cookie`` and hop-by-hop headers taken out and the cluster's own Ray token
(``Authorization: Bearer``) put in: no credential of the client's reaches Ray, and the cluster's
token never reaches the client. Ray's answer comes back streamed (an asynchronous iterator under
ASGI, a synchronous one under WSGI), without its hop-by-hop headers, its ``Set-Cookie`` and any
``Access-Control-Allow-Credentials``. A body is limited to ``MAX_BODY_BYTES`` (Ray's package
uploads; 413 past it), and the request gives its database connection back before it waits on Ray.
WebSockets (Ray's live log tailing) are not proxied: an HTTP request asking for one gets 501 here
(under the portal's ASGI server Channels refuses the handshake first, 403); a job's logs are read
over HTTP instead.
"""

from __future__ import annotations

import http.client
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.urls import reverse

from apps.compute import hosts
from apps.rayclusters import signin
from apps.rayclusters.models import RayCluster
from apps.workloads.forwarding import (
    HOP_BY_HOP,
    connection_named,
    connection_to,
    release_database,
    streamed,
)
from apps.workspaces.access import USE, VIEW, restrict

MAX_BODY_BYTES = 512 * 1024 * 1024
# One read or write to the dashboard: a job's submission waits for Ray to unpack and start it.
IO_TIMEOUT_S = 300.0
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
RUNNING = (RayCluster.State.RUNNING, RayCluster.State.DEGRADED)
# Never passed on to Ray: the client's credentials of any kind (Ray reads a token from each).
CREDENTIALS = frozenset({"authorization", "x-ray-authorization", "cookie"})
# Never passed back from Ray: its cookies (its own token's, for one), and a grant to other
# origins to read what a signed-in browser is answered.
NOT_ANSWERED = frozenset({"set-cookie", "access-control-allow-credentials"})
ANSWER_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}

NO_SUCH_CLUSTER = "No such Ray cluster.\n"
WEBSOCKET_REFUSED = (
    "WebSocket connections (Ray's live log tailing) are not proxied by the portal. Read a job's logs "
    "over HTTP instead: JobSubmissionClient.get_job_logs(), or GET /api/jobs/<id>/logs.\n"
)


def cluster_of_label(label: str) -> RayCluster | None:
    """The Ray cluster whose dashboard host has this DNS label (its id, and its name, must match)."""
    pk = hosts.pk_of_label(label)
    cluster = RayCluster.objects.select_related("workspace").filter(pk=pk).first() if pk else None
    return cluster if cluster is not None and cluster.host_label == label else None


def authorize_url(cluster: RayCluster) -> str:
    """The portal's page (on its own origin) that signs a browser in to the cluster's host."""
    return str(settings.PORTAL_PUBLIC_URL) + reverse("rayclusters:authorize", kwargs={"label": cluster.host_label})


def _answer(status: int, text: str = "", **headers: str) -> HttpResponse:
    response = HttpResponse(text.encode(), status=status, content_type="text/plain; charset=utf-8")
    for name, value in {**ANSWER_HEADERS, **headers}.items():
        response[name] = value
    return response


def serve(request: HttpRequest, cluster: RayCluster) -> HttpResponseBase:
    """Answer one request to the cluster's host: the sign-in callback, or the dashboard for who
    may reach it."""
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return _answer(501, WEBSOCKET_REFUSED)
    if request.path == hosts.CALLBACK_PATH:
        return _callback(request, cluster)
    try:
        user, by_token = _who(request, cluster)
    except signin.TokenRefused as refused:
        return _answer(refused.status, refused.message + "\n", **_challenge(refused.status))
    if user is None:
        return _sign_in(request, cluster)
    visible = restrict(RayCluster.objects.filter(pk=cluster.pk), user, VIEW).exists()
    if not visible:
        return _answer(404, NO_SUCH_CLUSTER)
    if request.method not in SAFE_METHODS:
        if not by_token:
            return _answer(403, "In a browser, the dashboard is read-only. Submit jobs with a portal token.\n")
        if not restrict(RayCluster.objects.filter(pk=cluster.pk), user, USE).exists():
            return _answer(403, f"Viewers of {cluster.workspace.name} can look at its Ray clusters, not use them.\n")
    if cluster.state not in RUNNING or not cluster.proxy_target:
        state = cluster.get_state_display().lower()
        return _answer(503, f"The Ray cluster {cluster.name} is not running ({state}).\n", **{"Retry-After": "5"})
    return forward(request, cluster)


def _who(request: HttpRequest, cluster: RayCluster) -> tuple[Any | None, bool]:
    """The user the request acts for (None: nobody), and whether a token says so."""
    user = signin.token_user(request)
    if user is not None:
        return user, True
    return (signin.session_user(request, cluster) if _cookie_may_count(request) else None), False


def _cookie_may_count(request: HttpRequest) -> bool:
    """Whether the browser sent the request from the cluster's own pages, or the user opened a
    page there (a link followed, an address typed). Every host under the notebook domain is the
    same site, so a Lax cookie also comes along with what another tenant's notebook page makes
    the browser fetch from here (an image, a script, a frame): such requests are not signed in."""
    site = request.headers.get("Sec-Fetch-Site", "")
    if site in ("", "same-origin", "none"):  # "": a browser that does not say
        return True
    opened = request.headers.get("Sec-Fetch-Mode", "") == "navigate"
    return opened and request.headers.get("Sec-Fetch-Dest", "document") == "document" and request.method == "GET"


def _challenge(status: int) -> dict[str, str]:
    return {"WWW-Authenticate": 'Bearer realm="gpuportal"'} if status == 401 else {}


def _sign_in(request: HttpRequest, cluster: RayCluster) -> HttpResponse:
    """A browser's page load goes to the portal to sign in (and comes back to the same path); any
    other request without credentials is told to bring a token."""
    accept = request.headers.get("Accept", "")
    navigating = request.headers.get("Sec-Fetch-Mode", "") == "navigate" or "text/html" in accept
    if request.method in ("GET", "HEAD") and navigating:
        location = hosts.unauthenticated_redirect(
            authorize_url(cluster), request.path, request.META.get("QUERY_STRING", "")
        )
        return _answer(302, "", Location=location)
    message = "Sign in: send a portal API token (or a workload's GPUPORTAL_TOKEN) as Authorization: Bearer <token>.\n"
    return _answer(401, message, **_challenge(401))


def _callback(request: HttpRequest, cluster: RayCluster) -> HttpResponse:
    """Redeem the handoff's one-time code, set this host's cookie, and go on to ``next``."""
    code = request.GET.get("code", "")
    user = signin.do_redeem_dashboard_code(cluster, code) if 0 < len(code) <= 200 else None
    if request.method != "GET" or user is None:
        return _answer(403, "This sign-in link is invalid or has expired. Open the dashboard again from the portal.\n")
    response = _answer(302, "", Location=hosts.safe_next(request.GET.get("next", "/")))
    signin.set_session(response, cluster, user)
    return response


# -- forwarding ---------------------------------------------------------------------------------


def request_headers(request: HttpRequest, token: str) -> dict[str, str]:
    """What goes to Ray: the client's headers less its credentials, the hop-by-hop ones and its
    Host (the connection's own is sent), and the cluster's token."""
    named = connection_named([request.headers.get("Connection", "")])
    dropped = HOP_BY_HOP | CREDENTIALS | named | {"host", "content-length"}
    headers = {name: value for name, value in request.headers.items() if name.lower() not in dropped}
    headers["Authorization"] = f"Bearer {token}"
    return headers


def forward(request: HttpRequest, cluster: RayCluster) -> HttpResponseBase:
    """Send the request on to the cluster's dashboard and stream its answer back."""
    declared = request.META.get("CONTENT_LENGTH") or ""
    if not declared and request.headers.get("Transfer-Encoding"):
        return _answer(411, "Send the body with a Content-Length.\n")
    try:
        length = int(declared or 0)
    except ValueError:
        return _answer(400, "Bad Content-Length.\n")
    if length < 0 or length > MAX_BODY_BYTES:
        return _answer(413, f"A request body may be {MAX_BODY_BYTES // 2**20} MiB at most.\n")
    headers = request_headers(request, cluster.auth_token)
    if length or request.method not in SAFE_METHODS:
        headers["Content-Length"] = str(length)
    release_database()
    try:
        connection, prefix = connection_to(cluster.proxy_target)
    except OSError:
        return _answer(502, "The Ray cluster's dashboard cannot be reached.\n")
    try:
        connection.connect()
        assert connection.sock is not None
        connection.sock.settimeout(IO_TIMEOUT_S)
        connection.request(
            request.method or "GET", prefix + request.get_full_path(), body=request if length else None, headers=headers
        )
        upstream = connection.getresponse()
    except TimeoutError:
        connection.close()
        return _answer(504, "The Ray cluster's dashboard did not answer in time.\n")
    except (OSError, http.client.HTTPException):
        connection.close()
        return _answer(502, "The Ray cluster's dashboard does not answer; it may be starting or restarting.\n")
    return streamed(request, upstream, connection, not_answered=NOT_ANSWERED)
