"""Invitations by email to a workspace, with a role (apps/invitations/actions.py).

The link's secret is never stored: only its SHA-256. An invitation is for one address, is good once,
and until it expires or is withdrawn. Sent again, it gets a new link; the SHA-256 of each link it
had before is kept (`ReplacedLink`), so that an old link is told apart from a made-up one."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from apps.workspaces.models import Role


class Invitation(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        ACCEPTED = "accepted", "Accepted"
        WITHDRAWN = "withdrawn", "Withdrawn"
        EXPIRED = "expired", "Expired"

    workspace = models.ForeignKey("workspaces.Workspace", on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()  # as typed, compared without case
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    # An invitation to one instance of the workspace, as its collaborator with `access`, instead
    # of to the whole workspace with `role`.
    instance = models.ForeignKey(
        "compute.Instance", null=True, blank=True, on_delete=models.CASCADE, related_name="invitations"
    )
    access = models.CharField(max_length=8, blank=True, choices=[("read", "Read-only"), ("write", "Read-write")])
    digest = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)  # the last time its mail went out
    times_sent = models.PositiveIntegerField(default=0)
    send_error = models.CharField(max_length=500, blank=True)  # why the last sending failed, if it did
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    withdrawn_at = models.DateTimeField(null=True, blank=True)

    # Not a column: set by apps/invitations/actions.find() when it found the invitation by one of
    # its replaced links rather than by its current one.
    by_replaced_link = False

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["workspace", "email"])]

    def __str__(self) -> str:
        return f"{self.email} to {self.instance or self.workspace}"

    @property
    def what(self) -> str:
        """What it gives, in words: "team-a as member", "instance box of team-a, read-write"."""
        if self.instance_id is not None:
            return f"instance {self.instance.name} of {self.workspace}, {self.get_access_display().lower()}"
        return f"{self.workspace} as {self.role}"

    @property
    def state(self) -> str:
        if self.accepted_at is not None:
            return self.State.ACCEPTED
        if self.withdrawn_at is not None:
            return self.State.WITHDRAWN
        if self.expires_at <= timezone.now():
            return self.State.EXPIRED
        return self.State.PENDING


class ReplacedLink(models.Model):
    """A link an invitation had before it was sent again: its secret's SHA-256. It never works; it
    is kept to say that a newer link replaced it."""

    invitation = models.ForeignKey(Invitation, on_delete=models.CASCADE, related_name="replaced_links")
    digest = models.CharField(max_length=64, unique=True)
    replaced_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"a replaced link of {self.invitation}"
