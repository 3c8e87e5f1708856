"""Workload tokens: the API credential every notebook, instance and job finds in its environment
(``GPUPORTAL_TOKEN``, beside ``GPUPORTAL_URL`` and ``GPUPORTAL_WORKSPACE``), so that the SDK and
CLI work inside it at once: ``Client.from_env()``.

A token acts for the user who launched the workload, in the workload's workspace alone, with the
role that user holds there (``WorkloadUser``: never as a platform admin, so neither the user's
other workspaces nor any admin endpoint), and only while the workload lives: a notebook while it
starts or is ready, an instance while it is provisioned or runs, a job while it is admitted or
runs. Deleting the notebook or instance, or the job's end, revokes it at once, whichever way the
end comes (a user, a failure, the reconcile loop), since it is checked against the row each time.

What a token may do is narrower than its launcher's role in two ways:

- It never administers: it cannot change memberships, roles, sharing, invitations, tokens or
  device logins, nor a workspace's settings, quotas or alert rules, whoever launched it
  (apps/api/permissions.py). Code that runs in a workload is not its launcher at a keyboard.
- What runs in a shared workload never holds one person's credential. While an instance has any
  collaborator, its token and its notebooks' tokens act only as a collaborator of that instance
  may: that one instance and its notebooks, read or write as the weakest collaborator holds (and
  never more than the launcher may), with no role in the workspace. This is decided at each
  request, since sharing changes while the workload runs; once the last collaborator goes, the
  token acts for its launcher in the workspace again.

Like Django's password-reset tokens, a token is stateless: an HMAC, keyed with ``SECRET_KEY``, of
the workload's identity (kind, id, workspace, launcher, creation time) and of the launcher's
credential stamp when the token was made (apps/accounts/stamps.py). Nothing that would let anyone
act is stored, in the database or in the workload's row, and a restarted workload is handed the
same token again while its launcher's credentials are unchanged. A password change, a
deactivation or the end of a single sign-on session changes the stamp and so ends every token of
the user's running workloads at once (a workload started again afterwards gets a new one). A new
``SECRET_KEY`` (the old one in ``SECRET_KEY_FALLBACKS`` until the workloads restart) ends every
token of the old one.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.utils.crypto import constant_time_compare, salted_hmac

from apps.accounts.models import WorkloadUser
from apps.accounts.stamps import credential_stamp
from apps.compute.models import Collaborator, Instance
from apps.workloads.kinds import KINDS
from apps.workloads.models import Workload
from apps.workspaces.access import USE, VIEW, restrict

PREFIX = "gpw_"
_SALT = "apps.accounts.tokens.workload"
_TOKEN_RE = re.compile(r"^gpw_([a-z]{1,32})_([1-9][0-9]{0,17})_([0-9a-f]{64})$")

# Collaborator access, weakest first; "" is none at all.
_ACCESS_RANK = {"": 0, Collaborator.Access.READ: 1, Collaborator.Access.WRITE: 2}

# Each kind of workload says the states in which its processes may run, and its token works
# (apps/workloads/kinds.py: ``KindInfo.token_states``).


def _kind(workload: Workload) -> str:
    return workload.kind


def _signature(kind: str, workload: Any, secret: str | None = None) -> str:
    """The HMAC of the workload's identity and of its launcher's credential stamp now, both keyed
    with ``secret`` (``SECRET_KEY`` by default)."""
    created = int(workload.created_at.timestamp() * 1_000_000)
    stamp = credential_stamp(workload.created_by, secret=secret)
    message = f"{kind}:{workload.pk}:{workload.workspace_id}:{workload.created_by_id}:{created}:{stamp}"
    return salted_hmac(_SALT, message, secret=secret, algorithm="sha256").hexdigest()


def workload_token(workload: Workload) -> str | None:
    """The workload's own token; None for one that no user launched (nobody to act for)."""
    if workload.created_by_id is None:
        return None
    kind = _kind(workload)
    return f"{PREFIX}{kind}_{workload.pk}_{_signature(kind, workload)}"


def workload_env(workload: Workload) -> dict[str, str]:
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
    """Whom a workload token acts for, scoped to its workspace (and, while its instance is shared,
    confined to that instance); None unless the token is genuine, its workload still lives, and its
    user is still active with the credentials they had when it was made."""
    found = _workload_of(key)
    if found is None:
        return None
    kind, workload = found
    launcher = workload.created_by
    if workload.state not in KINDS[kind].token_states or not launcher.is_active:
        return None
    user = WorkloadUser.acting_for(
        launcher, workspace_id=workload.workspace_id, workload=f"{kind} {workload.pk}", in_workload=True
    )
    instance_id = _instance_of(kind, workload)
    shared = _weakest_collaborator(instance_id) if instance_id is not None else None
    if instance_id is not None and shared is not None:
        user.confine_to_instance(instance_id, min(shared, _launcher_access(launcher, instance_id), key=_rank))
    return user


def _instance_of(kind: str, workload: Any) -> int | None:
    """The instance whose sharing a workload's token follows: the instance itself, or the one a
    notebook runs on; None for a job (jobs are not shared)."""
    if kind == "instance":
        return int(workload.pk)
    return int(workload.instance_id) if kind == "notebook" else None


def _workload_of(key: str) -> tuple[str, Any] | None:
    """The kind and row of the workload a token names, if its signature is genuine under the
    current secret key or a fallback one (and its launcher's stamp now)."""
    match = _TOKEN_RE.match(key)
    if match is None:
        return None
    kind, pk, signature = match.groups()
    if kind not in KINDS:
        return None
    workload = KINDS[kind].model.objects.select_related("created_by").filter(pk=int(pk)).first()
    if workload is None or workload.created_by is None:
        return None
    secrets = [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
    if not any(constant_time_compare(signature, _signature(kind, workload, secret)) for secret in secrets):
        return None
    return kind, workload


def _rank(access: str) -> int:
    return _ACCESS_RANK.get(access, 0)  # an access this module does not know grants nothing


def _weakest_collaborator(instance_id: int) -> str | None:
    """The weakest access any collaborator of the instance holds; None when it is shared with nobody."""
    held = set(Collaborator.objects.filter(instance_id=instance_id).values_list("access", flat=True))
    return min(held, key=_rank) if held else None


def _launcher_access(launcher: Any, instance_id: int) -> str:
    """What the launcher may do on the instance now, as collaborator access: "write" (a member's
    role, or write access), "read", or "" (nothing)."""
    rows = Instance.objects.filter(pk=instance_id)
    if restrict(rows, launcher, USE).exists():
        return Collaborator.Access.WRITE
    return Collaborator.Access.READ if restrict(rows, launcher, VIEW).exists() else ""


def held_by_workloads(user: Any, limit: int = 50) -> list[tuple[str, Any]]:
    """The user's workloads whose tokens work now, newest first, as (kind, workload): what the
    tokens page lists, for the user to see what acts for them (and end it to revoke it)."""
    held: list[tuple[str, Any]] = []
    for kind, info in KINDS.items():
        rows = info.model.objects.filter(created_by=user, state__in=info.token_states).select_related("workspace")
        held += [(kind, row) for row in rows.order_by("-created_at")[:limit]]
    return sorted(held, key=lambda pair: pair[1].created_at, reverse=True)[:limit]
