from __future__ import annotations

from django.conf import settings
from django.db import models


class AuditEvent(models.Model):
    """One row per state change: who did what to which object, when, and from where."""

    class Via(models.TextChoices):
        API = "api", "API"
        WEB = "web", "Web"
        CLI = "cli", "Command line"
        SYSTEM = "system", "System"

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_name = models.CharField(max_length=150, blank=True, help_text="Kept when the user is deleted.")
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    target_repr = models.CharField(max_length=300)
    workspace = models.ForeignKey(
        "workspaces.Workspace", null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_events"
    )
    data = models.JSONField(default=dict, blank=True)
    via = models.CharField(max_length=16, choices=Via.choices, default=Via.SYSTEM)
    ip_address = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_name or 'system'} {self.action} {self.target_repr}"
