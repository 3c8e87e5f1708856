"""Alert rules and their alerts (apps/alerts/evaluate.py evaluates them, delivery.py sends them).

A rule states a condition over the portal's own figures (the queue, quotas, nodes, failures) and
who to tell: email addresses, a webhook. An alert is one (rule, key) the condition held for: the
key names what it is about (a workspace and GPU type, a node...). It is pending while the
condition has held for less than the rule's `for_s`, firing after, resolved once it stops holding;
a later episode of the same key reuses the row.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class AlertRule(models.Model):
    class Kind(models.TextChoices):
        QUEUE_WAIT = "queue_wait", "Queue wait"
        QUOTA_USED = "quota_used", "Quota used"
        NODE_UNHEALTHY = "node_unhealthy", "Node unhealthy"
        BACKEND_FAILING = "backend_failing", "Workloads failing"
        GPU_IDLE = "gpu_idle", "GPUs held idle"
        RESERVATION_IDLE = "reservation_idle", "Reservation idle"

    # Kinds only platform admins may define: about the platform, not one workspace.
    ADMIN_KINDS = (Kind.NODE_UNHEALTHY, Kind.BACKEND_FAILING)
    # What the threshold counts, by kind.
    UNITS = {
        Kind.QUEUE_WAIT: "seconds",
        Kind.QUOTA_USED: "% of quota",
        Kind.NODE_UNHEALTHY: "(unused)",
        Kind.BACKEND_FAILING: "failures",
        Kind.GPU_IDLE: "% measured utilisation",
        Kind.RESERVATION_IDLE: "seconds idle",
    }

    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    # The workspace the rule is about; null: every workspace (a platform admin's rule).
    workspace = models.ForeignKey(
        "workspaces.Workspace", null=True, blank=True, on_delete=models.CASCADE, related_name="alert_rules"
    )
    gpu_type = models.CharField(max_length=32, blank=True)  # blank: every GPU type
    threshold = models.DecimalField(max_digits=12, decimal_places=2, default=0)
    window_s = models.PositiveIntegerField(default=900)  # backend_failing: the failures of this long
    for_s = models.PositiveIntegerField(default=0)  # how long the condition holds before it fires
    enabled = models.BooleanField(default=True)
    emails = models.JSONField(default=list, blank=True)
    webhook_url = models.CharField(max_length=500, blank=True)
    webhook_secret = models.CharField(max_length=200, blank=True)  # never shown once saved
    # Whether the webhook may reach private and loopback addresses: set by a platform admin's
    # saving of the URL (apps/alerts/actions.py).
    webhook_private_ok = models.BooleanField(default=False)
    silenced_until = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return self.name

    @property
    def unit(self) -> str:
        """What its threshold and its alerts' values are in, short, for the pages: "s", "%", ..."""
        units = {self.Kind.QUEUE_WAIT: " s", self.Kind.QUOTA_USED: " %", self.Kind.GPU_IDLE: " %",
                 self.Kind.BACKEND_FAILING: " failures", self.Kind.RESERVATION_IDLE: " s"}  # fmt: skip
        return units.get(self.kind, "")

    @property
    def channels(self) -> list[str]:
        return [name for name, on in (("email", bool(self.emails)), ("webhook", bool(self.webhook_url))) if on]


class Alert(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        FIRING = "firing", "Firing"
        RESOLVED = "resolved", "Resolved"

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    key = models.CharField(max_length=300)
    # The workspace the condition is about, where it is about one.
    workspace = models.ForeignKey(
        "workspaces.Workspace", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    labels = models.JSONField(default=dict)
    value = models.DecimalField(max_digits=16, decimal_places=2, null=True, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING, db_index=True)
    pending_since = models.DateTimeField()
    firing_since = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField()
    silenced_until = models.DateTimeField(null=True, blank=True)
    # Per channel ("email", "webhook"): the status last delivered in this episode ("firing" or
    # "resolved"), and the last attempt: {"at", "ok", "error", "status"}.
    delivered = models.JSONField(default=dict, blank=True)
    last_delivery = models.JSONField(default=dict, blank=True)
    notified_at = models.DateTimeField(null=True, blank=True)  # the last notification of every channel

    class Meta:
        ordering = ["-pending_since", "-id"]
        constraints = [models.UniqueConstraint(fields=["rule", "key"], name="alert_rule_key")]

    def __str__(self) -> str:
        return f"{self.rule.name}: {self.key}"

    @property
    def delivery_error(self) -> str:
        """The last failed attempt's errors, by channel, or "" if none failed."""
        return "; ".join(
            f"{channel}: {attempt.get('error')}"
            for channel, attempt in sorted(self.last_delivery.items())
            if not attempt.get("ok")
        )
