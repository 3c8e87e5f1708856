"""Workload tokens: the API credential every notebook, instance and job finds in its environment
(``GPUPORTAL_TOKEN``, beside ``GPUPORTAL_URL`` and ``GPUPORTAL_WORKSPACE``), so that the SDK and
CLI work inside it at once: ``Client.from_env()``.

A token acts for the user who launched the workload, in the workload's workspace alone, with the
role that user holds there (``WorkloadUser``: never as a platform admin, so neither the user's
other workspaces nor any admin endpoint), and only while the workload lives: a notebook while it
starts or is ready, an instance while it is provisioned or runs, a job while it is admitted or
runs. Deleting the notebook or instance, or the job's end, revokes it at once, whichever way the
end comes (a user, a failure, the reconcile loop), since it is checked against the row each time.

Like Django's password-reset tokens, a token is stateless: an HMAC, keyed with ``SECRET_KEY``, of
the workload's identity (kind, id, workspace, launcher, creation time). Nothing that would let
anyone act is stored, in the database or in the workload's row, and a restarted workload is
handed the same token again. A new ``SECRET_KEY`` (the old one in ``SECRET_KEY_FALLBACKS`` until
the workloads restart) ends every token of the old one.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.utils.crypto import constant_time_compare, salted_hmac

from apps.accounts.models import WorkloadUser
from apps.compute.models import Instance, Notebook
from apps.jobs.models import Job

PREFIX = "gpw_"
_SALT = "apps.accounts.tokens.workload"
_TOKEN_RE = re.compile(r"^gpw_(job|instance|notebook)_([1-9][0-9]{0,17})_([0-9a-f]{64})$")

# Each kind of workload, and the states in which its processes may run (and its token works).
_KINDS: dict[str, tuple[type[Any], tuple[str, ...]]] = {
    "job": (Job, (Job.State.ADMITTED, Job.State.RUNNING)),
    "instance": (Instance, (Instance.State.PROVISIONING, Instance.State.RUNNING)),
    "notebook": (Notebook, (Notebook.State.STARTING, Notebook.State.READY)),
}


def _kind(workload: Job | Instance | Notebook) -> str:
    return {Job: "job", Instance: "instance", Notebook: "notebook"}[type(workload)]


def _signature(kind: str, workload: Any, secret: str | None = None) -> str:
    created = int(workload.created_at.timestamp() * 1_000_000)
    message = f"{kind}:{workload.pk}:{workload.workspace_id}:{workload.created_by_id}:{created}"
    return salted_hmac(_SALT, message, secret=secret, algorithm="sha256").hexdigest()


def workload_token(workload: Job | Instance | Notebook) -> str | None:
    """The workload's own token; None for one that no user launched (nobody to act for)."""
    if workload.created_by_id is None:
        return None
    kind = _kind(workload)
    return f"{PREFIX}{kind}_{workload.pk}_{_signature(kind, workload)}"


def workload_env(workload: Job | Instance | Notebook) -> dict[str, str]:
    """The variables a workload gets to use the SDK and CLI: the portal's address as workloads
    reach it (``PORTAL_INTERNAL_URL``, as notebook servers do), its workspace, and its token.
    The token is a secret: backends pass it through the workload's environment only."""
    env = {
        "GPUPORTAL_URL": settings.PORTAL_INTERNAL_URL.rstrip("/"),
        "GPUPORTAL_WORKSPACE": workload.workspace.name,
    }
    token = workload_token(workload)
    if token is not None:
        env["GPUPORTAL_TOKEN"] = token
    return env


def user_for_token(key: str) -> WorkloadUser | None:
    """Whom a workload token acts for, scoped to its workspace; None unless the token is genuine,
    its workload still lives and its user is still active."""
    match = _TOKEN_RE.match(key)
    if match is None:
        return None
    kind, pk, signature = match.groups()
    model, live = _KINDS[kind]
    workload = model.objects.select_related("created_by").filter(pk=int(pk)).first()
    if workload is None or workload.created_by is None:
        return None
    secrets = [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
    if not any(constant_time_compare(signature, _signature(kind, workload, secret)) for secret in secrets):
        return None
    if workload.state not in live or not workload.created_by.is_active:
        return None
    return WorkloadUser.acting_for(workload.created_by, workspace_id=workload.workspace_id, workload=f"{kind} {pk}")


def held_by_workloads(user: Any, limit: int = 50) -> list[tuple[str, Any]]:
    """The user's workloads whose tokens work now, newest first, as (kind, workload): what the
    tokens page lists, for the user to see what acts for them (and end it to revoke it)."""
    held: list[tuple[str, Any]] = []
    for kind, (model, live) in _KINDS.items():
        rows = model.objects.filter(created_by=user, state__in=live).select_related("workspace")
        held += [(kind, row) for row in rows.order_by("-created_at")[:limit]]
    return sorted(held, key=lambda pair: pair[1].created_at, reverse=True)[:limit]
