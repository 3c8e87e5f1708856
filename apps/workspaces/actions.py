"""State changes of workspaces, memberships, GPU quotas and cohorts."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.audit.actions import SYSTEM, Origin, apply_changes, do_log_event
from apps.audit.events import Event
from apps.errors import ActionError, Conflict
from apps.names import GPU_TYPE_RE
from apps.scheduling.trigger import request_cycle
from apps.workspaces.models import GIB, Cohort, GPUQuota, Membership, Role, Workspace, WorkspaceDisk

if TYPE_CHECKING:
    from workers.backends.diskquota import DiskUsage


def parse_gpu_quota(spec: str) -> dict[str, Decimal]:
    """Parse 'h100=2,a100=0.5' (settings' default quota for private workspaces)."""
    quotas: dict[str, Decimal] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        gpu_type, _, count = item.partition("=")
        try:
            value = Decimal(count)
        except InvalidOperation:
            raise ValueError(f"{item!r}: expected TYPE=COUNT, e.g. h100=2") from None
        if not GPU_TYPE_RE.match(gpu_type) or not value.is_finite() or value < 0:
            raise ValueError(f"{item!r}: expected TYPE=COUNT, e.g. h100=2")
        quotas[gpu_type] = value
    return quotas


def _private_name(username: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", username.lower())[:50].strip("-") or "user"
    name, n = base, 1
    while Workspace.objects.filter(name=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def ensure_private_workspace(user: Any) -> Workspace:
    """Every user's own workspace, created the first time they sign in."""
    existing = Workspace.objects.filter(kind=Workspace.Kind.PRIVATE, assigned_user=user).first()
    if existing:
        return existing
    with transaction.atomic():
        # Two first sign-ins at once (web and CLI) must not make two workspaces: lock the user.
        type(user).objects.select_for_update().filter(pk=user.pk).first()
        existing = Workspace.objects.filter(kind=Workspace.Kind.PRIVATE, assigned_user=user).first()
        if existing:
            return existing
        workspace = Workspace.objects.create(
            name=_private_name(user.get_username()),
            display_name=f"{user.get_username()}'s workspace",
            kind=Workspace.Kind.PRIVATE,
            assignee_kind=Workspace.Assignee.USER,
            assigned_user=user,
            max_instances=settings.PORTAL_PRIVATE_MAX_INSTANCES,
            max_notebooks=settings.PORTAL_PRIVATE_MAX_NOTEBOOKS,
            cpu_cores=settings.PORTAL_PRIVATE_CPU_CORES,
            memory_gb=settings.PORTAL_PRIVATE_MEMORY_GB,
        )
        Membership.objects.create(workspace=workspace, user=user, role=Role.OWNER)
        for gpu_type, gpus in parse_gpu_quota(settings.PORTAL_PRIVATE_GPU_QUOTA).items():
            GPUQuota.objects.create(workspace=workspace, gpu_type=gpu_type, gpus=gpus)
        do_log_event(Event.WORKSPACE_CREATE, workspace, acting_user=user, workspace=workspace, data={"private": True})
    return workspace


def do_create_workspace(*, acting_user: Any, origin: Origin = SYSTEM, **fields: Any) -> Workspace:
    """Create a shared workspace (admins). Policies and limits come from `fields`."""
    allowed_profiles = fields.pop("allowed_profiles", None)
    with transaction.atomic():
        if Workspace.objects.filter(name=fields["name"]).exists():
            raise ActionError(f"A workspace named {fields['name']} already exists.", field="name")
        workspace = Workspace.objects.create(**fields)
        if allowed_profiles is not None:
            workspace.allowed_profiles.set(allowed_profiles)
        do_log_event(Event.WORKSPACE_CREATE, workspace, acting_user=acting_user, origin=origin, workspace=workspace)
    return workspace


def do_update_workspace(workspace: Workspace, *, acting_user: Any, origin: Origin = SYSTEM, **fields: Any) -> Workspace:
    """Change a workspace's description, assignment, limits or policies.

    A smaller disk quota is refused while the workspace's files (as last measured) would not fit;
    the scheduler loop applies a new quota to the disk (apps/workspaces/disks.py)."""
    allowed_profiles = fields.pop("allowed_profiles", None)
    with transaction.atomic():
        workspace = Workspace.objects.select_for_update().get(pk=workspace.pk)
        if "disk_gb" in fields:
            _check_disk_fits(workspace, fields["disk_gb"])
        changed = apply_changes(workspace, fields)
        workspace.full_clean(exclude=["allowed_profiles"])
        workspace.save()
        if allowed_profiles is not None:
            workspace.allowed_profiles.set(allowed_profiles)
            changed["allowed_profiles"] = sorted(p.name for p in allowed_profiles)
        do_log_event(
            Event.WORKSPACE_UPDATE, workspace, acting_user=acting_user, origin=origin, workspace=workspace, data=changed
        )
        request_cycle()
    return workspace


def _check_disk_fits(workspace: Workspace, disk_gb: Any) -> None:
    """``ActionError`` on ``disk_gb`` where a smaller quota would not hold the files measured last."""
    measured = WorkspaceDisk.objects.filter(workspace=workspace).first()
    if measured is None or not isinstance(disk_gb, int) or disk_gb >= workspace.disk_gb:
        return
    needed = -(-measured.used_bytes // GIB)  # whole GB, rounded up
    if disk_gb < needed:
        raise ActionError(
            f"The workspace's files take {needed} GB of its disk: free space there before lowering its "
            "quota below that.",
            field="disk_gb",
        )


def record_disk_usage(workspace: Workspace, usage: DiskUsage, *, note: str = "") -> WorkspaceDisk:
    """Record what the workspace's disk holds, as the scheduler loop measured it (an observation, as
    a job's progress is: no audit event)."""
    disk, _ = WorkspaceDisk.objects.update_or_create(
        workspace=workspace,
        defaults={
            "size_bytes": usage.size_bytes,
            "used_bytes": usage.used_bytes,
            "largest": [{"name": name, "bytes": size} for name, size in usage.largest],
            "complete": usage.complete,
            "note": note[:500],
            "measured_at": timezone.now(),
        },
    )
    return disk


def do_delete_workspace(workspace: Workspace, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    """Delete a workspace that has nothing live in it (its disk, if it has one, goes with the scheduler
    loop's next upkeep: apps/workspaces/disks.py)."""
    from apps.compute.models import Instance
    from apps.jobs.models import Job

    with transaction.atomic():
        workspace = Workspace.objects.select_for_update().get(pk=workspace.pk)
        if (
            workspace.instances.filter(state__in=Instance.LIVE_STATES).exists()
            or workspace.jobs.filter(state__in=Job.ACTIVE_STATES).exists()
        ):
            raise Conflict(f"Workspace {workspace.name} still has live instances or jobs; stop them first.")
        do_log_event(Event.WORKSPACE_DELETE, workspace, acting_user=acting_user, origin=origin)
        workspace.delete()


def do_set_membership(
    workspace: Workspace, user: Any, role: str, *, acting_user: Any, origin: Origin = SYSTEM
) -> Membership:
    """Add a user to a workspace, or change their role."""
    with transaction.atomic():
        membership, created = Membership.objects.select_for_update().get_or_create(
            workspace=workspace, user=user, defaults={"role": role}
        )
        if not created and membership.role != role:
            if membership.role == Role.OWNER and _last_owner(membership):
                raise Conflict(f"{user.get_username()} is the last owner of {workspace.name}.", field="role")
            membership.role = role
            membership.save()
        do_log_event(
            Event.MEMBERSHIP_SET,
            membership,
            acting_user=acting_user,
            origin=origin,
            workspace=workspace,
            data={"user": user.get_username(), "role": role},
        )
    return membership


def _last_owner(membership: Membership) -> bool:
    owners = Membership.objects.filter(workspace=membership.workspace_id, role=Role.OWNER)
    return membership.workspace.kind == Workspace.Kind.PRIVATE or owners.exclude(pk=membership.pk).count() == 0


def do_remove_membership(membership: Membership, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    with transaction.atomic():
        membership = Membership.objects.select_for_update().get(pk=membership.pk)
        if membership.role == Role.OWNER and _last_owner(membership):
            raise Conflict(f"{membership.user.get_username()} is the last owner of {membership.workspace.name}.")
        do_log_event(
            Event.MEMBERSHIP_REMOVE,
            membership,
            acting_user=acting_user,
            origin=origin,
            workspace=membership.workspace,
            data={"user": membership.user.get_username()},
        )
        membership.delete()


def do_set_gpu_quota(
    workspace: Workspace,
    gpu_type: str,
    *,
    gpus: Decimal,
    borrowing_limit: Decimal | None = None,
    lending_limit: Decimal | None = None,
    acting_user: Any,
    origin: Origin = SYSTEM,
) -> GPUQuota:
    """Set how many GPUs of a type a workspace is guaranteed, may borrow and lends."""
    with transaction.atomic():
        quota, _ = GPUQuota.objects.select_for_update().update_or_create(
            workspace=workspace,
            gpu_type=gpu_type,
            defaults={"gpus": gpus, "borrowing_limit": borrowing_limit, "lending_limit": lending_limit},
        )
        do_log_event(
            Event.QUOTA_SET,
            quota,
            acting_user=acting_user,
            origin=origin,
            workspace=workspace,
            data={"gpu_type": gpu_type, "gpus": str(gpus)},
        )
        request_cycle()
    return quota


def do_delete_gpu_quota(quota: GPUQuota, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    with transaction.atomic():
        do_log_event(
            Event.QUOTA_DELETE,
            quota,
            acting_user=acting_user,
            origin=origin,
            workspace=quota.workspace,
            data={"gpu_type": quota.gpu_type},
        )
        quota.delete()
        request_cycle()


def do_save_cohort(cohort: Cohort | None, *, acting_user: Any, origin: Origin = SYSTEM, **fields: Any) -> Cohort:
    """Create a cohort (cohort=None) or change one."""
    with transaction.atomic():
        created = cohort is None
        cohort = cohort or Cohort()
        changed = apply_changes(cohort, fields)
        try:
            with transaction.atomic():
                cohort.save()
        except IntegrityError:
            raise ActionError(f"A cohort named {cohort.name} already exists.", field="name") from None
        do_log_event(
            Event.COHORT_CREATE if created else Event.COHORT_UPDATE,
            cohort,
            acting_user=acting_user,
            origin=origin,
            data=changed,
        )
        request_cycle()
    return cohort


def do_delete_cohort(cohort: Cohort, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    with transaction.atomic():
        do_log_event(Event.COHORT_DELETE, cohort, acting_user=acting_user, origin=origin)
        cohort.delete()
        request_cycle()
