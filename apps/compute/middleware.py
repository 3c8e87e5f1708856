"""The portal never serves itself on a notebook's host; a Ray cluster's host gets its dashboard.

The notebook proxy sends every host it has no route for to the portal, so a request for a
notebook host with no server behind it (a notebook that never existed, or is stopped) reaches
the portal. It gets exactly what a notebook's server answers a request without a session: the
redirect to the portal's authorize page (``/portal-auth/callback``: the refused-code page; a
WebSocket: 403), and nothing of the portal's pages or API. (The portal's WebSockets do not pass
here: Channels refuses them for any host outside ALLOWED_HOSTS, with a 403 too.)

First in MIDDLEWARE: it reads the raw Host header, which the notebook domain (never in
ALLOWED_HOSTS) would fail in Django's host check.

A Ray cluster's dashboard host (``ray-<name>-<id>`` under the same domain) has no route in the
notebook proxy by design: Ray's ports run whatever code reaches them, so every request for it
comes here and goes to the portal's own authenticating proxy (apps/rayclusters/proxy.py). A label
whose id is no Ray cluster's, or whose name is not that cluster's, is answered as above. An
inference endpoint's host (``ep-<name>-<id>``) likewise comes here, to apps/inference/proxy.py.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from apps.compute import hosts
from apps.inference import proxy as endpoint_proxy
from apps.rayclusters import proxy as ray_proxy

# What a notebook's server answers to a refused callback, and the portal for a host with no
# server: the same bytes (workers/notebook/portal_identity.py holds the same text).
CALLBACK_REFUSED = "This sign-in link is invalid or has expired. Open the notebook again from the portal.\n"
# The headers of those answers, on both sides: nothing that tells a server from the portal.
ANSWER_HEADERS = {"Cache-Control": "no-store", "Server": "gpuportal", "X-Content-Type-Options": "nosniff"}


def notebook_host_answer(label: str, path: str, query: str, *, websocket: bool = False) -> HttpResponse:
    if websocket:  # a WebSocket cannot follow a redirect; the portal's ASGI server refuses it so
        response = HttpResponse(b"", status=403, content_type="text/plain; charset=utf-8")
    elif path == hosts.CALLBACK_PATH:
        response = HttpResponse(CALLBACK_REFUSED, status=403, content_type="text/plain; charset=utf-8")
    else:
        response = HttpResponse(b"", status=302, content_type="text/plain; charset=utf-8")
        response["Location"] = hosts.unauthenticated_redirect(hosts.authorize_url(label), path, query)
    for name, value in ANSWER_HEADERS.items():
        response[name] = value
    response["Content-Length"] = str(len(response.content))
    return response


class NotebookHostMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        host = hosts.split_host(request.META.get("HTTP_HOST", ""))
        label = hosts.label_of_host(host)
        if label is not None:
            endpoint = endpoint_proxy.endpoint_of_label(label)
            if endpoint is not None:
                return endpoint_proxy.serve(request, endpoint)
            cluster = ray_proxy.cluster_of_label(label)
            if cluster is not None:
                return ray_proxy.serve(request, cluster)
            websocket = request.META.get("HTTP_UPGRADE", "").lower() == "websocket"
            return notebook_host_answer(label, request.path, request.META.get("QUERY_STRING", ""), websocket=websocket)
        return self.get_response(request)
