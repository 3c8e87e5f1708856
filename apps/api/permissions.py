"""What a workload's own token may never do, on any endpoint of the API.

A workload's token (``GPUPORTAL_TOKEN`` of a notebook, instance or job: apps/accounts/tokens.py)
is in reach of any code that runs there, and of anyone who can use the workload: a notebook's
collaborators, a job's dependencies. So it never administers, whatever its launcher's role: it
cannot change memberships, roles, sharing, invitations, tokens or device logins, nor a workspace's
settings, quotas, alert rules or anything else an owner or admin decides. Those take a person
signed in to the portal (or a personal token of theirs).

The rule is an allow-list, so that a new endpoint is covered without a line of its own: a
workload's token may read wherever its role lets it, and change something only where the view
says workloads may (``workload_tokens_may_change = True``: the workloads themselves, that is
jobs, instances and notebooks). Everything else is refused with a 403 that says why.

It is applied where such a token is authenticated (apps/accounts/authentication.py), so it holds
on every view that accepts the token, whatever that view's own permission classes.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request

WORKLOAD_TOKEN_REFUSED = (
    "A workload's own token (GPUPORTAL_TOKEN) cannot do this: it may launch, change and end jobs, "
    "instances and notebooks, but never change memberships, roles, sharing, invitations, tokens or a "
    "workspace's settings, quotas and alert rules. Sign in to the portal to do this."
)


def from_workload(user: Any) -> bool:
    """Whether `user` is a workload's own token acting (not a person, nor a personal token)."""
    return bool(getattr(user, "in_workload", False))


def workload_may(request: Request, user: Any) -> bool:
    """Whether this request is one a workload's token may make (any request of another credential is)."""
    if not from_workload(user) or request.method in SAFE_METHODS:
        return True
    view = (getattr(request, "parser_context", None) or {}).get("view")
    return bool(getattr(view, "workload_tokens_may_change", False))


def check_workload_request(request: Request, user: Any) -> None:
    """Refuse (403, saying why) a request that a workload's token may never make."""
    if not workload_may(request, user):
        raise PermissionDenied(WORKLOAD_TOKEN_REFUSED)
