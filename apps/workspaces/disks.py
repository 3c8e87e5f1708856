"""The workspaces' disks on this machine: each workspace's directory on the local backend is a
filesystem of its disk quota's size (workers/backends/diskquota.py does the mounting).

A workload's spec carries its workspace's :class:`DiskQuota` (:func:`disk_for`), and the backend
mounts the disk before the workload starts. The scheduler loop, which runs on the machine the local
backend runs on, keeps the disks up in a thread of its own (:func:`keep_up`): it applies a changed
quota (grown online; made smaller once no workload of the workspace runs), mounts a disk again after a
reboot, removes a deleted workspace's disk, and measures each disk for the workspace's page, which
never walks files itself.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections
from django.db.models import Q
from django.template.defaultfilters import filesizeformat
from django.utils import timezone

from apps.workspaces.actions import record_disk_usage
from apps.workspaces.models import GIB, Workspace, WorkspaceDisk
from workers.backends import diskquota
from workers.backends.base import BackendError, DiskQuota

logger = logging.getLogger(__name__)

# How often the loop's thread looks at the disks: a grown quota takes effect within this.
UPKEEP_EVERY_S = 5.0
_IMAGE_PREFIX, _IMAGE_SUFFIX = "workspace-", ".img"


def enforced() -> bool:
    """Whether workspaces get their disk quota on this machine (``PORTAL_DISK_QUOTA=on``)."""
    return bool(settings.PORTAL_DISK_QUOTA == "on")


def image_path(workspace_id: int) -> Path:
    """The workspace's disk image, in the portal's private directory, named after its id."""
    return Path(settings.PORTAL_DISK_IMAGE_DIR) / f"{_IMAGE_PREFIX}{workspace_id}{_IMAGE_SUFFIX}"


def disk_of(workspace: Workspace) -> DiskQuota:
    return DiskQuota(
        image=str(image_path(workspace.pk)),
        directory=str(Path(settings.PORTAL_WORK_DIR) / workspace.name),
        size_bytes=int(workspace.disk_gb) * GIB,
    )


def disk_for(workspace: Workspace, cluster: Any) -> DiskQuota | None:
    """The disk quota a workload of ``workspace`` gets on ``cluster``: on this machine (local)
    unless the operator opted out; none elsewhere (Slurm's storage has the cluster's own quotas)."""
    if getattr(cluster, "kind", "") != "local" or not enforced():
        return None
    return disk_of(workspace)


def keep_up(stop: threading.Event) -> None:
    """The scheduler loop's thread for the disks: an upkeep every ``UPKEEP_EVERY_S`` until ``stop``
    (none where the portal does not enforce disk quotas, or cannot: not root)."""
    if not enforced() or os.geteuid() != 0:
        return
    while not stop.is_set():
        close_old_connections()
        try:
            upkeep()
        except Exception:  # the next pass tries again
            logger.exception("workspace disk upkeep failed")
        stop.wait(UPKEEP_EVERY_S)


def upkeep() -> dict[str, int]:
    """One pass over the disks on this machine: a deleted workspace's removed; every other one
    brought to its quota (mounted again where it is not) and measured when due."""
    if not enforced() or os.geteuid() != 0:
        return {}
    ids = _image_ids()
    existing = Workspace.objects.filter(pk__in=ids).select_related("disk")
    counts = {"released": _release(ids - {w.pk for w in existing}), "measured": 0, "failed": 0}
    busy = _busy_ids()
    for workspace in existing:
        try:
            measured = _keep(workspace, idle=workspace.pk not in busy)
        except (BackendError, OSError):
            logger.warning("could not keep up the disk of workspace %s", workspace.name, exc_info=True)
            counts["failed"] += 1
        else:
            counts["measured"] += measured
    return counts


def _keep(workspace: Workspace, *, idle: bool) -> bool:
    """Bring one workspace's disk to its quota, and measure it if due; whether it was measured."""
    disk = disk_of(workspace)
    note = diskquota.apply_quota(disk, idle=idle)
    last: WorkspaceDisk | None = getattr(workspace, "disk", None)
    due = (
        last is None
        or last.note != note
        or last.measured_at < workspace.updated_at  # its quota may have changed
        or timezone.now() - last.measured_at >= timedelta(seconds=settings.PORTAL_DISK_MEASURE_EVERY_S)
    )
    if due and diskquota.is_mounted(disk):
        record_disk_usage(workspace, diskquota.measure(disk.directory), note=note)
        return True
    return False


def _image_ids() -> set[int]:
    """The ids of the workspaces whose disk image lies in the image directory."""
    ids = set()
    directory = Path(settings.PORTAL_DISK_IMAGE_DIR)
    for path in directory.glob(f"{_IMAGE_PREFIX}*{_IMAGE_SUFFIX}") if directory.is_dir() else []:
        number = path.name.removeprefix(_IMAGE_PREFIX).removesuffix(_IMAGE_SUFFIX)
        if number.isdigit():
            ids.add(int(number))
    return ids


def _release(deleted: set[int]) -> int:
    """Unmount and remove the disks of deleted workspaces; how many went."""
    released = 0
    for workspace_id in sorted(deleted):
        try:
            diskquota.release(str(image_path(workspace_id)))
        except BackendError:
            logger.warning("could not remove the disk of deleted workspace %s", workspace_id, exc_info=True)
        else:
            released += 1
    return released


def _busy_ids() -> set[int]:
    """Workspaces with a workload that runs (or may, being started or stopped) on a local cluster."""
    from apps.compute.models import Instance
    from apps.jobs.models import Job

    jobs = Job.objects.filter(cluster__kind="local").filter(
        Q(state__in=[Job.State.ADMITTED, Job.State.RUNNING]) | Q(backend_state__isnull=False, backend_stopped=False)
    )
    instances = Instance.objects.filter(cluster__kind="local", state__in=Instance.LIVE_STATES)
    return set(jobs.values_list("workspace_id", flat=True)) | set(instances.values_list("workspace_id", flat=True))


def disk_summary(disk: WorkspaceDisk | None) -> str:
    """One sentence on a workspace's disk for people: what its files take, and a pending change."""
    if not enforced():
        return "Not enforced on this portal (PORTAL_DISK_QUOTA=off): its workloads write without a limit."
    if disk is None:
        return "Its directory on this machine is a disk of this size, made when its first workload starts."
    text = f"Its files take {filesizeformat(disk.used_bytes)} of {filesizeformat(disk.size_bytes)}."
    return f"{text} Its disk {disk.note}." if disk.note else text
