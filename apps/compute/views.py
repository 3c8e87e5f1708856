"""The portal's side of signing in to a notebook's server (docs/notebooks.md, "Who gets in").

A browser without a session on a notebook's host is sent to ``authorize``, on the portal's own
origin, where the portal's session lives. For a signed-in user who may use the notebook, it
issues a one-time code and sends the browser to the notebook host's callback; the server there
redeems the code over the portal's internal URL (``redeem_code``), authenticating with its own
secret, and sets a cookie of its own, which holds the user's credential stamp (apps/accounts/
stamps.py). On every later request, and every second for each open WebSocket, it asks
``check_user`` whether the user may still use it with that stamp: no longer once their access
ends, their password changes or their account is deactivated. The portal's cookies never leave
its own host.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from apps.accounts.stamps import credential_stamp
from apps.audit.actions import Origin
from apps.audit.models import AuditEvent
from apps.compute import actions, hosts, proxy
from apps.compute.models import Notebook
from apps.web.common import page
from apps.workspaces.access import VIEW, restrict

NO_SUCH_NOTEBOOK = "No such notebook."


@never_cache
@require_GET
def authorize(request: HttpRequest, label: str) -> HttpResponse:
    """Sign the browser in to the notebook of ``label``: 404 alike for a notebook that does not
    exist and one the user cannot see, 403 for a viewer, a waiting page while it starts, and
    while its server does not answer (it died, and is about to be started again): no code is
    issued for a server that is not there."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), "web:login")
    pk = hosts.pk_of_label(label)
    notebook = restrict(Notebook.objects.select_related("workspace"), request.user, VIEW).filter(pk=pk).first()
    if notebook is None or notebook.host_label != label:
        raise Http404(NO_SUCH_NOTEBOOK)
    if not actions.may_use_notebook(notebook, request.user):
        raise PermissionDenied(
            f"Viewers of {notebook.workspace.name} cannot open its notebooks; ask an owner for member access."
        )
    if notebook.state != Notebook.State.READY or not proxy.target_answers(notebook.proxy_target):
        status = 503 if notebook.state in Notebook.LIVE_STATES else 404
        restarting = notebook.state == Notebook.State.READY
        context = {"notebook": notebook, "restarting": restarting}
        response = page(request, "web/notebooks/not_ready.html", context, status=status)
        if status == 503:
            response["Retry-After"] = "3"
        return response
    code = actions.do_issue_notebook_code(
        notebook, acting_user=request.user, origin=Origin.from_request(request, AuditEvent.Via.WEB)
    )
    return HttpResponseRedirect(hosts.callback_url(label, code, request.GET.get("next", "/")))


def _server_notebook(request: HttpRequest, pk: int) -> Notebook:
    """The live notebook whose server sent the request (its secret as a bearer token), or 403:
    the same for a wrong secret and a notebook that does not exist."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    notebook = Notebook.objects.filter(pk=pk, state__in=Notebook.LIVE_STATES).first()
    if scheme.lower() != "bearer" or not actions.check_notebook_secret(notebook, secret.strip()):
        raise PermissionDenied("This is for the notebook's own server, with its secret.")
    assert notebook is not None
    return notebook


def _refused(message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=403)


@never_cache
@require_GET
def server_config(request: HttpRequest, pk: int) -> JsonResponse:
    """What the notebook's server needs to know of the portal: where to send a browser to sign in."""
    try:
        notebook = _server_notebook(request, pk)
    except PermissionDenied as exc:
        return _refused(str(exc))
    return JsonResponse({"authorize_url": hosts.authorize_url(notebook.host_label), "label": notebook.host_label})


@csrf_exempt  # server to server, with a bearer secret and no cookie
@never_cache
@require_POST
def redeem_code(request: HttpRequest, pk: int) -> JsonResponse:
    """The user a one-time code was issued to, for the notebook's server that presents it, and
    their credential stamp, which the server keeps in its session and sends with each check."""
    try:
        notebook = _server_notebook(request, pk)
    except PermissionDenied as exc:
        return _refused(str(exc))
    code = _posted_code(request)
    user = actions.do_redeem_notebook_code(notebook, code) if code else None
    if user is None:
        return _refused("The code is unknown, spent, expired or another notebook's.")
    return JsonResponse({"username": user.get_username(), "stamp": credential_stamp(user)})


def _posted_code(request: HttpRequest) -> str:
    try:
        body: Any = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return ""
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, str) and 0 < len(code) <= 200 else ""


@never_cache
@require_GET
def check_user(request: HttpRequest, pk: int, username: str) -> JsonResponse:
    """200 if ``username`` may still use the notebook with the credential stamp ``?stamp=`` (the
    one the server was handed with the user's code), 403 if not (or no longer)."""
    try:
        notebook = _server_notebook(request, pk)
    except PermissionDenied as exc:
        return _refused(str(exc))
    stamp = request.GET.get("stamp", "")
    user = actions.notebook_user(notebook, username, stamp) if 0 < len(stamp) <= 100 else None
    if user is None:
        return _refused(f"{username} may not use this notebook.")
    return JsonResponse({"username": user.get_username()})
