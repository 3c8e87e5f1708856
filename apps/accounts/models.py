"""Accounts are Django's own users and groups. The models here are a user's personal API tokens
(apps/accounts/api_tokens.py) and how a token limited to one workspace, a workload's or a personal
one, presents its user to the API (apps/accounts/tokens.py)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import models


class WorkloadUser(User):
    """A user as a token limited to one workspace presents them: a workload's own token (a
    notebook's, instance's or job's: ``in_workload``, apps/accounts/tokens.py) or a personal token
    limited to a workspace. It acts for them in that workspace alone (``workspace_scope``), with the
    role they hold there, and never as a platform admin (``is_staff`` and ``is_superuser`` are off, so
    no admin endpoint lets it in). A platform admin's token acts as an owner of that one workspace
    (``owner_in_scope``).

    A workload's token never administers anything (apps/api/permissions.py). While the instance it
    belongs to is shared with collaborators, it is confined to that instance (``instance_scope``): it
    acts as a collaborator of it with ``instance_access`` (read, write, or none at all) and holds no
    role in the workspace (apps/workspaces/access.py).

    Built for each request from the user's row, and never saved: its flags are not the user's."""

    workspace_scope: int
    owner_in_scope: bool
    workload: str
    in_workload: bool
    instance_scope: int | None
    instance_access: str

    class Meta:
        proxy = True

    @classmethod
    def acting_for(cls, user: User, *, workspace_id: int, workload: str, in_workload: bool = False) -> WorkloadUser:
        scoped = cls(**{field.attname: getattr(user, field.attname) for field in User._meta.concrete_fields})
        scoped._state.adding = False
        scoped._state.db = user._state.db
        scoped.owner_in_scope = bool(user.is_staff)
        scoped.is_staff = scoped.is_superuser = False
        scoped.workspace_scope = workspace_id
        scoped.workload = workload
        scoped.in_workload = in_workload
        scoped.instance_scope = None
        scoped.instance_access = ""
        return scoped

    def confine_to_instance(self, instance_id: int, access: str) -> None:
        """Act on this one instance (and its notebooks) alone, as a collaborator with `access`
        ("read", "write", or "" for nothing), holding no role in the workspace."""
        self.instance_scope = instance_id
        self.instance_access = access
        self.owner_in_scope = False

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a workload's view of a user is never saved: change the user itself")


class ApiToken(models.Model):
    """A personal API token: what the CLI and SDK sign in with. The secret is shown once, when the
    token is made; only its SHA-256 is kept (a token is 256 random bits: a slow hash would add
    nothing). `key_id` is the public part, shown in lists and used to find the row."""

    class Scope(models.TextChoices):
        READ = "read", "read-only"
        WRITE = "write", "read-write"

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    key_id = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    scope = models.CharField(max_length=5, choices=Scope.choices, default=Scope.WRITE)
    # Limited to one workspace (acting there alone, as a workload's token does); null: all of the user's.
    workspace = models.ForeignKey("workspaces.Workspace", null=True, blank=True, on_delete=models.CASCADE)
    # Made for calling one inference endpoint alone (its workspace's too): it opens nothing else.
    endpoint = models.ForeignKey(
        "inference.Endpoint", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.name} ({self.key_id})"


class SignInFailures(models.Model):
    """Failed sign-ins in the current window, per account and per address (apps/accounts/throttle.py).
    `key` is a hash, so that what was typed as a username is not kept."""

    key = models.CharField(max_length=64, unique=True)
    failures = models.PositiveIntegerField(default=0)
    since = models.DateTimeField()


class ExternalIdentity(models.Model):
    """A user as the identity provider knows them: its issuer and the subject it gives them. Single
    sign-on finds the user by this pair alone, never by email or name, so no one at the provider can
    take over an account that merely shares an address or a username."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="identities")
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    # The provider's groups at the last sign-in, as it sent them (the portal's groups follow them).
    groups = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="one_user_per_identity")]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"


class DeviceLogin(models.Model):
    """A sign-in of the CLI through the browser (apps/accounts/device_login.py): the CLI holds a
    secret device code (only its SHA-256 is kept), the person types or follows the short user code
    on the portal's page while signed in, and the CLI then collects a personal token, once."""

    digest = models.CharField(max_length=64, unique=True)
    user_code = models.CharField(max_length=9, unique=True)
    name = models.CharField(max_length=100)
    address = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    user = models.ForeignKey(User, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    approved = models.BooleanField(default=False)
    collected_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.user_code
