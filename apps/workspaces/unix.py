"""Each workspace's own Unix account, which its workloads run as when the portal runs as root.

The installation (its data directory) holds a block of uids on this machine, claimed in the
machine's registry (workers/backends/uidblocks.py), so that two portals on one machine never share
an account. Workspace ``N`` gets uid ``<block's first uid> + N``, named ``gpw<uid>``, with a comment
naming the workspace and the installation. The mapping is fixed for the installation, so a portal
restored from a backup of its data directory finds the same accounts, and machines that share
accounts (Slurm's nodes) agree on it where the block is set (``PORTAL_WORKSPACE_UID_BLOCK``).
The account is created on the first workload the workspace starts, and recorded on the row.

Earlier releases named the account ``gpw<N>`` with uid ``PORTAL_WORKSPACE_UID_MIN + N``, for every
portal on the machine alike. Such accounts are adopted (same uid and name, so files keep working)
by the installation whose workspaces recorded them, which then holds the first block; where another
installation holds it, they are left alone and this one's workspaces get accounts of their own.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from apps.audit.actions import do_log_event
from apps.audit.events import Event
from apps.workspaces.models import Workspace
from workers.backends import uidblocks
from workers.backends.base import BackendError, RunAs
from workers.backends.uidblocks import Block

# The block each configuration (data directory, registry, range) holds, claimed once per process.
_BLOCKS: dict[tuple[object, ...], Block] = {}


def installation_block() -> Block:
    """This installation's block of uids, claimed in the registry on first use (and the accounts
    of earlier releases it recorded adopted). ``UidBlockError`` (permanent) where another live
    installation holds it: the message names that installation's data directory."""
    key = (
        str(settings.DATA_DIR), str(settings.PORTAL_UID_REGISTRY_DIR), settings.PORTAL_WORKSPACE_UID_MIN,
        settings.PORTAL_WORKSPACE_UID_MAX, settings.PORTAL_WORKSPACE_UID_BLOCK_SIZE,
        settings.PORTAL_WORKSPACE_UID_BLOCK,
    )  # fmt: skip
    block = _BLOCKS.get(key)
    if block is None:
        record = uidblocks.read_installation(Path(settings.DATA_DIR)) or {}
        legacy = {} if "first_uid" in record else legacy_accounts()  # adopted on the first claim only
        block = uidblocks.claim(
            Path(settings.PORTAL_UID_REGISTRY_DIR),
            Path(settings.DATA_DIR),
            uid_min=int(settings.PORTAL_WORKSPACE_UID_MIN),
            uid_max=int(settings.PORTAL_WORKSPACE_UID_MAX),
            block_size=int(settings.PORTAL_WORKSPACE_UID_BLOCK_SIZE),
            pinned=settings.PORTAL_WORKSPACE_UID_BLOCK,
            adoptable=legacy,
        )
        for account in legacy.values():
            if block.holds(account.pw_uid):
                _adopt(account, block)
        _BLOCKS[key] = block
    return block


def legacy_accounts() -> dict[int, Any]:
    """Accounts an earlier release made for this installation's workspaces, by uid: ``gpw<N>`` with
    uid ``PORTAL_WORKSPACE_UID_MIN + N`` that workspace N recorded, and a comment naming a workspace
    but no installation (another installation's would name it)."""
    uid_min = int(settings.PORTAL_WORKSPACE_UID_MIN)
    recorded = dict(Workspace.objects.filter(unix_uid__isnull=False).values_list("unix_uid", "pk"))
    return {
        entry.pw_uid: entry
        for entry in pwd.getpwall()
        if recorded.get(entry.pw_uid) is not None
        and entry.pw_uid == uid_min + recorded[entry.pw_uid]
        and entry.pw_name == f"gpw{recorded[entry.pw_uid]}"
        and uidblocks.is_legacy_comment(entry.pw_gecos)
    }


def _adopt(account: Any, block: Block) -> None:
    """Name the installation in an adopted account's comment: it is then this installation's to
    use, and to delete with its block."""
    comment = f"{account.pw_gecos} (installation {block.installation_id})"
    uidblocks.run_sbin(["usermod", "--comment", comment, account.pw_name])


def account_uid(workspace: Workspace) -> int:
    block = installation_block()
    uid = block.first_uid + int(workspace.pk)
    if not block.holds(uid):
        raise BackendError(
            f"workspace {workspace.name} has no Unix account: its uid would be {uid}, past this "
            f"installation's block ({block.first_uid}-{block.last_uid}); raise PORTAL_WORKSPACE_UID_BLOCK_SIZE",
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

    ``BackendError(permanent=True)`` when the uid or the name is taken by an account that is not
    this installation's: the configured range overlaps accounts that are not the portal's."""
    block = installation_block()
    uid = account_uid(workspace)
    existing = _lookup(uid, block)
    if existing is None:
        name = uidblocks.account_name(uid)
        _useradd(name, uid, uidblocks.account_comment(workspace.name, block.installation_id))
        existing = _lookup(uid, block)
    if existing is None:
        raise BackendError(f"the Unix account of uid {uid} could not be created", permanent=False)
    return existing


def _lookup(uid: int, block: Block) -> RunAs | None:
    """The account of ``uid`` where it is this installation's: its comment names the installation,
    or it is named ``gpw<uid>`` with no installation named (a directory service made it)."""
    name = uidblocks.account_name(uid)
    by_uid = _getpwuid(uid)
    by_name = _getpwnam(name)
    if by_uid is None and by_name is None:
        return None
    if by_uid is not None:
        owner = uidblocks.comment_installation(by_uid.pw_gecos)
        if owner == block.installation_id or (owner is None and by_uid.pw_name == name):
            return RunAs(user=by_uid.pw_name, uid=by_uid.pw_uid, gid=by_uid.pw_gid)
    taken = by_uid.pw_name if by_uid is not None else name
    raise BackendError(
        f"uid {uid} or the name {name} already belongs to an account that is not this installation's "
        f"({taken}); reserve PORTAL_WORKSPACE_UID_MIN..MAX for the portal's workspaces",
        permanent=True,
    )


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
    uidblocks.run_sbin(["groupadd", "--gid", str(uid), name], ok=(0, 4, 9))
    uidblocks.run_sbin(
        ["useradd", "--uid", str(uid), "--gid", str(uid), "--no-create-home", "--home-dir", "/nonexistent",
         "--shell", "/usr/sbin/nologin", "--comment", comment, name],
        ok=(0, 4, 9),  # 4: the uid, 9: the name is already in use (another worker was first); the lookup checks it
    )  # fmt: skip


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
