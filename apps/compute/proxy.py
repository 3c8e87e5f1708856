"""The notebook proxy's routing table, through configurable-http-proxy's REST API.

The proxy stands in front of the portal and routes by host (``--host-routing``): its default
target is the portal, and each ready notebook adds a route for its own host name
(``<label>.<PORTAL_NOTEBOOK_DOMAIN>``, see apps/compute/hosts.py) to its server. The proxy keys
such a route ``/<host>`` and matches it whatever the port in the request's Host header. Routes
carry the notebook's id, so the reconcile loop can tell ours from stale ones after a crash.

A route's target is where its server listens: on the local backend a Unix socket
(``http+unix://<percent-encoded path>``) in a directory only the notebook's account and the
portal's (which the proxy runs as) can enter, so that no other process can listen there, even
after the server died; on Slurm, whose nodes are other machines, the node's address and port.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from django.conf import settings

from workers.backends.processes import http_get

TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 2.0


class ProxyError(Exception):
    """The proxy could not be reached or refused the change (transient: retried by reconcile)."""


def configured() -> bool:
    return bool(settings.PORTAL_PROXY_API_URL)


def _call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    url = settings.PORTAL_PROXY_API_URL.rstrip("/") + "/api/routes" + urllib.parse.quote(path)
    request = urllib.request.Request(
        url,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"token {settings.PORTAL_PROXY_AUTH_TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            payload = response.read()
    except urllib.error.HTTPError as exc:
        if method == "DELETE" and exc.code == 404:
            return None
        raise ProxyError(f"the notebook proxy answered {exc.code} to {method} {path}") from exc
    except OSError as exc:
        raise ProxyError(f"the notebook proxy at {settings.PORTAL_PROXY_API_URL} is unreachable: {exc}") from exc
    return json.loads(payload) if payload else None


def host_route(host: str) -> str:
    """The proxy's key for every request to ``host`` (any port, any path)."""
    return "/" + host.lower()


def add_route(host: str, target: str, notebook_id: int) -> None:
    """Send every request for ``host`` to ``target``; replaces an existing route."""
    _call("POST", host_route(host), {"target": target, "portal_notebook": notebook_id})


def remove_route(route: str) -> None:
    """Remove a route by its key (``host_route``); a route that is not there is fine."""
    _call("DELETE", route.rstrip("/"))


def routes() -> dict[str, dict[str, Any]]:
    """The proxy's table: key -> {"target": ..., "portal_notebook": id, ...}."""
    table = _call("GET", "")
    return dict(table or {})


def target_answers(target: str) -> bool:
    """Whether a notebook server answers at ``target`` (a route's target): its ``/api``, which
    needs no sign-in and tells nothing but the server's version. A server that exited answers
    nothing (its socket refuses, or is gone), so no sign-in code is issued for it. One that is slow
    to answer (a busy machine) is alive: it is given the benefit of the doubt, not a 503."""
    if not target:
        return False
    try:
        status, _ = http_get(target.rstrip("/") + "/api", timeout=ANSWER_TIMEOUT_S)
    except TimeoutError:
        return True
    except OSError:
        return False
    return status == 200
