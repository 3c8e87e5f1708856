from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from apps.names import validate_dns_label, validate_gpu_type

MAX_GPUS = Decimal("100000")
# A workspace's disk is a sparse file on the machine's own filesystem: ext4 (4 KiB blocks) takes
# files of up to 16 TiB.
MAX_DISK_GB = 16_000
GIB = 1 << 30  # a GB of disk quota, as of memory: 2**30 bytes


def default_disk_gb() -> int:
    """A new workspace's disk quota (``PORTAL_WORKSPACE_DISK_GB``)."""
    return int(settings.PORTAL_WORKSPACE_DISK_GB)


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


# Higher rank may do everything a lower rank may.
ROLE_RANK = {Role.VIEWER: 1, Role.MEMBER: 2, Role.OWNER: 3}


class Cohort(models.Model):
    """Workspaces in one cohort lend each other their idle GPU quota."""

    name = models.CharField(max_length=63, unique=True, validators=[validate_dns_label])
    description = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Workspace(models.Model):
    class Kind(models.TextChoices):
        PRIVATE = "private", "Private"
        SHARED = "shared", "Shared"

    class Assignee(models.TextChoices):
        NONE = "", "Nobody in particular"
        TEAM = "team", "Team"
        DEPARTMENT = "department", "Department"
        USER = "user", "User"

    name = models.CharField(max_length=63, unique=True, validators=[validate_dns_label])
    display_name = models.CharField(max_length=200, blank=True)
    description = models.CharField(max_length=2000, blank=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.SHARED)
    # Who the workspace is for. Members of an assigned group are members of the workspace;
    # an assigned user owns it.
    assignee_kind = models.CharField(max_length=16, choices=Assignee.choices, blank=True, default="")
    assigned_group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    assigned_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    # Hard limits, checked with a row lock when a request is made.
    max_instances = models.PositiveIntegerField(default=4, validators=[MaxValueValidator(10000)])
    max_notebooks = models.PositiveIntegerField(default=4, validators=[MaxValueValidator(10000)])
    cpu_cores = models.PositiveIntegerField(default=64, validators=[MaxValueValidator(1_000_000)])
    memory_gb = models.PositiveIntegerField(default=256, validators=[MaxValueValidator(100_000_000)])
    disk_gb = models.PositiveIntegerField(
        default=default_disk_gb,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_DISK_GB)],
        help_text="Disk quota: the size of its directory's own filesystem on the local backend, in GB (2**30 bytes).",
    )

    # Policies.
    allowed_profiles = models.ManyToManyField(
        "catalog.ComputeProfile", blank=True, related_name="+", help_text="Empty: every profile the user can see."
    )
    allowed_gpu_types = models.JSONField(default=list, blank=True, help_text="Empty: every GPU type.")
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True, validators=[MaxValueValidator(366 * 86400)])
    max_idle_s = models.PositiveIntegerField(null=True, blank=True, validators=[MaxValueValidator(366 * 86400)])
    can_borrow = models.BooleanField(default=False, help_text="May use its cohort's idle GPUs, and be preempted.")
    fair_share_weight = models.DecimalField(
        max_digits=6,
        decimal_places=2,
        default=Decimal("1"),
        validators=[MinValueValidator(Decimal("0.01")), MaxValueValidator(Decimal("1000"))],
    )
    cohort = models.ForeignKey(Cohort, null=True, blank=True, on_delete=models.SET_NULL, related_name="workspaces")
    # The uid of the workspace's own Unix account (apps/workspaces/unix.py), once created.
    unix_uid = models.PositiveIntegerField(null=True, blank=True, editable=False)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(assignee_kind="")
                | Q(assignee_kind="user", assigned_user__isnull=False)
                | Q(assignee_kind__in=["team", "department"], assigned_group__isnull=False),
                name="workspace_assignee_consistent",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def workloads_of(self, kind: str) -> Any:
        """Its workloads of one kind, as that kind's rows (apps/workloads/kinds.py)."""
        from apps.workloads.kinds import KINDS

        return KINDS[kind].model.objects.filter(workspace=self)

    @property
    def jobs(self) -> Any:
        return self.workloads_of("job")

    @property
    def instances(self) -> Any:
        return self.workloads_of("instance")

    @property
    def notebooks(self) -> Any:
        return self.workloads_of("notebook")

    def allows_gpu_type(self, gpu_type: str) -> bool:
        return not self.allowed_gpu_types or gpu_type in self.allowed_gpu_types


class WorkspaceDisk(models.Model):
    """What a workspace's disk holds, as last measured on the machine that mounts it (the scheduler
    loop's upkeep, apps/workspaces/disks.py): the page shows this, never a walk of the files."""

    workspace = models.OneToOneField(Workspace, on_delete=models.CASCADE, primary_key=True, related_name="disk")
    size_bytes = models.BigIntegerField()
    used_bytes = models.BigIntegerField()
    # The largest top-level entries: [{"name": "job-12", "bytes": 1234}, ...], largest first.
    largest = models.JSONField(default=list)
    # False where walking them ran out of time: their sizes are at least what is shown.
    complete = models.BooleanField(default=True)
    # Why the size is not yet the quota's (a smaller quota waits for no workload to run), if it is not.
    note = models.CharField(max_length=500, blank=True)
    measured_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.workspace_id}: {self.used_bytes} of {self.size_bytes} bytes"

    @property
    def percent(self) -> int:
        return min(100, round(100 * self.used_bytes / self.size_bytes)) if self.size_bytes > 0 else 0

    @property
    def age(self) -> timedelta:
        """How long ago it was measured."""
        return timezone.now() - self.measured_at


class Membership(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["workspace__name", "user__username"]
        constraints = [models.UniqueConstraint(fields=["workspace", "user"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace} ({self.role})"


class GPUQuota(models.Model):
    """GPUs of one type a workspace is guaranteed (nominal), may borrow, and lends at most."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="gpu_quotas")
    gpu_type = models.CharField(max_length=32, validators=[validate_gpu_type])
    gpus = models.DecimalField(
        max_digits=9, decimal_places=2, validators=[MinValueValidator(Decimal("0")), MaxValueValidator(MAX_GPUS)]
    )
    borrowing_limit = models.DecimalField(
        max_digits=9,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(MAX_GPUS)],
        help_text="Most GPUs borrowed from the cohort on top of the nominal quota; empty: no limit.",
    )
    lending_limit = models.DecimalField(
        max_digits=9,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(MAX_GPUS)],
        help_text="Most idle GPUs lent to the cohort; empty: all idle GPUs.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["workspace__name", "gpu_type"]
        constraints = [models.UniqueConstraint(fields=["workspace", "gpu_type"], name="gpu_quota_unique")]

    def __str__(self) -> str:
        return f"{self.workspace}: {self.gpus} x {self.gpu_type}"
