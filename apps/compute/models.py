from __future__ import annotations

import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from apps.compute.hosts import host_label, notebook_host, notebook_origin
from apps.names import validate_dns_label
from apps.scheduling.models import Workload
from apps.workloads.models import Hosted


class Instance(Workload):
    class State(models.TextChoices):
        QUEUED = "QUEUED", "Queued"
        PROVISIONING = "PROVISIONING", "Provisioning"
        RUNNING = "RUNNING", "Running"
        DELETING = "DELETING", "Deleting"
        DELETED = "DELETED", "Deleted"
        FAILED = "FAILED", "Failed"

    # States that count against the workspace's max-instances limit.
    LIVE_STATES = (State.QUEUED, State.PROVISIONING, State.RUNNING, State.DELETING)
    # The field holding the id of the instance whose collaborators a row is shared with
    # (apps/workspaces/access.py): its own, for an instance.
    COLLABORATORS = "pk"

    workspace = models.ForeignKey("workspaces.Workspace", on_delete=models.CASCADE, related_name="instances")
    name = models.CharField(max_length=63, validators=[validate_dns_label])
    description = models.CharField(max_length=2000, blank=True)
    profile = models.ForeignKey("catalog.ComputeProfile", on_delete=models.PROTECT, related_name="instances")
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED, db_index=True)
    failure_reason = models.CharField(max_length=2000, blank=True)
    # Why the portal, not a person, ended it (idle, or its workspace's maximum runtime), for its page.
    stop_reason = models.CharField(max_length=500, blank=True)
    # When its user was told it would be deleted for being idle; cleared once it is active again.
    idle_warned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name"],
                condition=Q(state__in=["QUEUED", "PROVISIONING", "RUNNING", "DELETING"]),
                name="instance_live_name_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.workspace}/{self.name}"

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


class Notebook(Hosted):
    class State(models.TextChoices):
        PENDING = "PENDING", "Waiting for its instance"
        STARTING = "STARTING", "Starting"
        READY = "READY", "Ready"
        STOPPING = "STOPPING", "Stopping"
        STOPPED = "STOPPED", "Stopped"
        FAILED = "FAILED", "Failed"

    LIVE_STATES = (State.PENDING, State.STARTING, State.READY, State.STOPPING)
    COLLABORATORS = "instance_id"  # a notebook is shared with its instance

    workspace = models.ForeignKey("workspaces.Workspace", on_delete=models.CASCADE, related_name="notebooks")
    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="notebooks")
    name = models.CharField(max_length=63, validators=[validate_dns_label])
    description = models.CharField(max_length=2000, blank=True)
    profile = models.ForeignKey("catalog.NotebookProfile", on_delete=models.PROTECT, related_name="notebooks")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING, db_index=True)
    failure_reason = models.CharField(max_length=2000, blank=True)
    access_token = models.CharField(max_length=100, default=_new_access_token)
    # Why the portal, not a person, stopped it ("culled: idle for 2 h 10 min"); cleared when started again.
    stop_reason = models.CharField(max_length=500, blank=True)
    # When its user was told it would be stopped for being idle; cleared once it is active again.
    idle_warned_at = models.DateTimeField(null=True, blank=True)
    # Where the notebook proxy sends its host's requests (the server's URL), once ready.
    proxy_target = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name"],
                condition=Q(state__in=["PENDING", "STARTING", "READY", "STOPPING"]),
                name="notebook_live_name_unique",
            )
        ]

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
