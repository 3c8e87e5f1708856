from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from apps.compute.hosts import host_label, notebook_host, notebook_origin
from apps.names import validate_gpu_type
from apps.workloads.models import PodSet, Workload, single_pod_set


class Instance(Workload):
    class State(models.TextChoices):
        QUEUED = "QUEUED", "Queued"
        PROVISIONING = "PROVISIONING", "Provisioning"
        RUNNING = "RUNNING", "Running"
        DELETING = "DELETING", "Deleting"
        DELETED = "DELETED", "Deleted"
        FAILED = "FAILED", "Failed"

    KIND = "instance"
    # Its workload row (its id is the workload's); `workload.as_instance` is this detail row.
    workload_ptr = models.OneToOneField(
        Workload, on_delete=models.CASCADE, parent_link=True, primary_key=True, related_name="as_instance"
    )
    INITIAL_STATE = State.QUEUED
    # States that count against the workspace's max-instances limit.
    LIVE_STATES = (State.QUEUED, State.PROVISIONING, State.RUNNING, State.DELETING)
    # The field holding the id of the instance whose collaborators a row is shared with
    # (apps/workspaces/access.py): its own, for an instance.
    COLLABORATORS = "pk"

    description = models.CharField(max_length=2000, blank=True)
    profile = models.ForeignKey("catalog.ComputeProfile", on_delete=models.PROTECT, related_name="instances")
    # What it holds, from its profile: `replicas` alike shares of the cluster.
    gpu_type = models.CharField(max_length=32, blank=True, validators=[validate_gpu_type])
    gpus_per_replica = models.DecimalField(
        max_digits=7,
        decimal_places=3,
        default=Decimal("0"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("1024"))],
    )
    replicas = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(1024)])
    cpu_cores = models.PositiveIntegerField(default=1, validators=[MaxValueValidator(4096)])
    memory_gb = models.PositiveIntegerField(default=4, validators=[MaxValueValidator(65536)])
    failure_reason = models.CharField(max_length=2000, blank=True)
    # Why the portal, not a person, ended it (idle, or its workspace's maximum runtime), for its page.
    stop_reason = models.CharField(max_length=500, blank=True)
    # When its user was told it would be deleted for being idle; cleared once it is active again.
    idle_warned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.workspace}/{self.name}"

    def save(self, *args: object, **kwargs: object) -> None:
        self.preemptible = False  # interactive work is never stopped for other work
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def pod_sets(self) -> list[PodSet]:
        return [single_pod_set(self)]

    @property
    def total_gpus(self) -> Decimal:
        return self.gpus_per_replica * self.replicas

    @property
    def launched_at(self) -> datetime:
        return self.created_at

    @property
    def running_for(self) -> timedelta | None:
        if self.started_at is None:
            return None
        return (self.finished_at or timezone.now()) - self.started_at


class Collaborator(models.Model):
    """Someone given one instance (its page, its notebooks, its kubeconfig) and nothing else of its
    workspace: to look at (read) or to work in (write: open and start its notebooks, its kubeconfig)."""

    class Access(models.TextChoices):
        READ = "read", "Read-only"
        WRITE = "write", "Read-write"

    # Who else an instance is shared with is seen by those it is shared with.
    COLLABORATORS = "instance_id"

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="collaborators")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="collaborations")
    access = models.CharField(max_length=8, choices=Access.choices, default=Access.WRITE)
    added_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["instance", "user"], name="collaborator_once_per_instance")]

    def __str__(self) -> str:
        return f"{self.user} on {self.instance} ({self.access})"


def _new_access_token() -> str:
    return secrets.token_urlsafe(32)


class Notebook(Workload):
    class State(models.TextChoices):
        PENDING = "PENDING", "Waiting for its instance"
        STARTING = "STARTING", "Starting"
        READY = "READY", "Ready"
        STOPPING = "STOPPING", "Stopping"
        STOPPED = "STOPPED", "Stopped"
        FAILED = "FAILED", "Failed"

    KIND = "notebook"
    # Its workload row (its id is the workload's); `workload.as_notebook` is this detail row.
    workload_ptr = models.OneToOneField(
        Workload, on_delete=models.CASCADE, parent_link=True, primary_key=True, related_name="as_notebook"
    )
    INITIAL_STATE = State.PENDING
    LIVE_STATES = (State.PENDING, State.STARTING, State.READY, State.STOPPING)
    COLLABORATORS = "instance_id"  # a notebook is shared with its instance

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="notebooks")
    description = models.CharField(max_length=2000, blank=True)
    profile = models.ForeignKey("catalog.NotebookProfile", on_delete=models.PROTECT, related_name="notebooks")
    failure_reason = models.CharField(max_length=2000, blank=True)
    access_token = models.CharField(max_length=100, default=_new_access_token)
    # Why the portal, not a person, stopped it ("culled: idle for 2 h 10 min"); cleared when started again.
    stop_reason = models.CharField(max_length=500, blank=True)
    # When its user was told it would be stopped for being idle; cleared once it is active again.
    idle_warned_at = models.DateTimeField(null=True, blank=True)
    # Where the notebook proxy sends its host's requests (the server's URL), once ready.
    proxy_target = models.CharField(max_length=500, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def save(self, *args: object, **kwargs: object) -> None:
        self.preemptible = False  # it runs on its instance's GPUs, which are never preempted
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{self.workspace}/{self.name}"

    @property
    def host_label(self) -> str:
        """The DNS label of the notebook's own host name (see apps/compute/hosts.py)."""
        return host_label(self.name, self.pk)

    @property
    def host(self) -> str:
        """The notebook's own host name, which the proxy routes to its server."""
        return notebook_host(self.host_label)

    @property
    def url(self) -> str:
        """Where a browser opens the notebook: the root of its own origin."""
        return f"{notebook_origin(self.host_label)}/" if self.pk else ""


class NotebookAuthCode(models.Model):
    """A one-time code of the sign-in handoff to a notebook's server (JupyterHub's OAuth code):
    issued to a user who may use the notebook, redeemed once, within seconds, by that notebook's
    server alone. Only its SHA-256 is kept."""

    notebook = models.ForeignKey(Notebook, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    code_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"code for {self.notebook} ({self.user})"
