"""Each workspace's own Unix account, which its workloads run as when the portal runs as root.

Workspace ``N`` gets the account ``gpw<N>`` with uid and gid ``PORTAL_WORKSPACE_UID_MIN + N``:
the mapping is fixed, so every machine that runs the workspace's work (this one, Slurm's nodes
sharing its accounts) agrees on it, and a portal restored from a backup finds the same accounts.
The account is created on the first workload the workspace starts, and recorded on the row.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from typing import Any

from django.conf import settings
from django.db import transaction

from apps.audit.actions import do_log_event
from apps.audit.events import Event
from apps.workspaces.models import Workspace
from workers.backends.base import BackendError, RunAs

USERADD_TIMEOUT_S = 30.0
SBIN_PATH = "/usr/sbin:/sbin:/usr/bin:/bin"


def account_name(workspace: Workspace) -> str:
    return f"gpw{workspace.pk}"


def account_uid(workspace: Workspace) -> int:
    uid = int(settings.PORTAL_WORKSPACE_UID_MIN) + int(workspace.pk)
    if uid > int(settings.PORTAL_WORKSPACE_UID_MAX):
        raise BackendError(
            f"workspace {workspace.name} has no Unix account: uid {uid} is past PORTAL_WORKSPACE_UID_MAX "
            f"({settings.PORTAL_WORKSPACE_UID_MAX}); widen the range",
            permanent=True,
        )
    return uid


def workspace_run_as(workspace: Workspace, *, sandboxed: bool = True) -> RunAs | None:
    """The account the workspace's workloads run as, created if missing; ``None`` where the portal
    is not root (it cannot switch users: a sandbox's user namespace is the boundary then) or where
    the caller runs workloads unsandboxed on this machine (``PORTAL_SANDBOX=off``)."""
    if os.geteuid() != 0 or not sandboxed:
        return None
    run_as = ensure_account(workspace)
    if workspace.unix_uid != run_as.uid:
        do_record_unix_account(workspace, run_as)
    return run_as


def ensure_account(workspace: Workspace) -> RunAs:
    """Create the workspace's account (and its group) if it does not exist yet; check it if it does.

    ``BackendError(permanent=True)`` when the uid or the name is taken by another account: the
    configured range overlaps accounts that are not this portal's."""
    name, uid = account_name(workspace), account_uid(workspace)
    existing = _lookup(name, uid)
    if existing is None:
        _useradd(name, uid, f"GPU Portal workspace {workspace.name}")
        existing = _lookup(name, uid)
    if existing is None:
        raise BackendError(f"the Unix account {name} could not be created", permanent=False)
    return existing


def _lookup(name: str, uid: int) -> RunAs | None:
    by_name = _getpwnam(name)
    by_uid = _getpwuid(uid)
    if by_name is None and by_uid is None:
        return None
    if by_name is None or by_uid is None or by_name.pw_uid != uid:
        taken = by_uid.pw_name if by_uid is not None else name
        raise BackendError(
            f"uid {uid} or the name {name} already belongs to another account ({taken}); "
            "reserve PORTAL_WORKSPACE_UID_MIN..MAX for the portal's workspaces",
            permanent=True,
        )
    return RunAs(user=name, uid=by_name.pw_uid, gid=by_name.pw_gid)


def _getpwnam(name: str) -> Any:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _getpwuid(uid: int) -> Any:
    try:
        return pwd.getpwuid(uid)
    except KeyError:
        return None


def _useradd(name: str, uid: int, comment: str) -> None:
    """``groupadd`` + ``useradd`` with the same id, no home directory and no login shell. Another
    worker creating the same account at the same moment is fine: the loser finds it made."""
    commands = [
        ["groupadd", "--gid", str(uid), name],
        ["useradd", "--uid", str(uid), "--gid", str(uid), "--no-create-home", "--home-dir", "/nonexistent",
         "--shell", "/usr/sbin/nologin", "--comment", comment, name],
    ]  # fmt: skip
    for argv in commands:
        argv = [shutil.which(argv[0], path=SBIN_PATH) or argv[0], *argv[1:]]  # a worker's PATH may lack sbin
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=USERADD_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"could not run {argv[0]}: {exc}", permanent=False) from exc
        # 9: the name is already in use (another worker was first); checked by the caller's lookup.
        if done.returncode not in (0, 4, 9):
            raise BackendError(f"{argv[0]} {name} failed: {done.stderr.strip()[-500:]}", permanent=False)


def do_record_unix_account(workspace: Workspace, run_as: RunAs) -> None:
    """Record the workspace's account on its row, with an audit event."""
    with transaction.atomic():
        updated = Workspace.objects.filter(pk=workspace.pk).exclude(unix_uid=run_as.uid).update(unix_uid=run_as.uid)
        if updated:
            do_log_event(
                Event.WORKSPACE_UNIX_ACCOUNT,
                workspace,
                workspace=workspace,
                data={"user": run_as.user, "uid": run_as.uid},
            )
    workspace.unix_uid = run_as.uid


def run_as_for(workspace: Workspace, cluster: Any) -> RunAs | None:
    """The account a workload of ``workspace`` runs as on ``cluster``: the workspace's own on this
    machine (when sandboxed) and on Slurm; Kubernetes isolates by namespace and pod security."""
    kind = getattr(cluster, "kind", "")
    if kind == "local":
        return workspace_run_as(workspace, sandboxed=settings.PORTAL_SANDBOX == "bwrap")
    if kind == "slurm":
        return workspace_run_as(workspace)
    return None
