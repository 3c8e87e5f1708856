from __future__ import annotations

from django.core.validators import MaxValueValidator
from django.db import models

from apps.names import validate_dns_label
from apps.scheduling.models import Workload


class Job(Workload):
    class State(models.TextChoices):
        QUEUED = "QUEUED", "Queued"
        ADMITTED = "ADMITTED", "Admitted"
        RUNNING = "RUNNING", "Running"
        SUCCEEDED = "SUCCEEDED", "Succeeded"
        FAILED = "FAILED", "Failed"
        CANCELLED = "CANCELLED", "Cancelled"
        PREEMPTED = "PREEMPTED", "Preempted"

    ACTIVE_STATES = (State.QUEUED, State.ADMITTED, State.RUNNING, State.PREEMPTED)
    FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED)

    workspace = models.ForeignKey("workspaces.Workspace", on_delete=models.CASCADE, related_name="jobs")
    name = models.CharField(max_length=63, validators=[validate_dns_label])
    description = models.CharField(max_length=2000, blank=True)
    command = models.TextField(blank=True, max_length=100_000)
    image = models.CharField(max_length=300, blank=True)
    env = models.JSONField(default=dict, blank=True)
    artifact_paths = models.JSONField(default=list, blank=True)
    preemptible = models.BooleanField(default=True)
    checkpointable = models.BooleanField(default=False, help_text="Gets a grace signal before preemption.")
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True, validators=[MaxValueValidator(366 * 86400)])
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED, db_index=True)
    failure_reason = models.CharField(max_length=2000, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    progress = models.FloatField(null=True, blank=True)
    # The grace its preemption gives it (a checkpointable job's signal before the kill).
    stop_grace_s = models.FloatField(null=True, blank=True)
    # How often it was requeued for not running in time (its backoff doubles each time).
    unready_requeues = models.PositiveIntegerField(default=0)
    # Since when its artifacts wait to be recorded, once its processes ended (apps/jobs/artifacts.py):
    # a job that exited is recorded as ended only after them. Null: none wait.
    artifacts_pending_since = models.DateTimeField(null=True, blank=True)
    # What of its output was not recorded, and why ("artifacts not collected: ..."), shown with it.
    artifacts_note = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["workspace", "state"])]

    def __str__(self) -> str:
        return f"{self.workspace}/{self.name}#{self.pk}"

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES

    @property
    def awaits_end(self) -> bool:
        """Its processes exited and its end is recorded once its artifacts are (it may have been
        preempted meanwhile: its processes ended all the same)."""
        return self.state in (self.State.RUNNING, self.State.PREEMPTED) and self.backend_stopped


class JobAttempt(models.Model):
    """One run of a job: the first, and one more after each preemption or retry."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempt_set")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True)
    reason = models.CharField(max_length=2000, blank=True)

    class Meta:
        ordering = ["job_id", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="job_attempt_unique")]


class Artifact(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="artifacts")
    path = models.CharField(max_length=1000)
    size_bytes = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job_id", "path"]
        constraints = [models.UniqueConstraint(fields=["job", "path"], name="artifact_unique")]

    def __str__(self) -> str:
        return self.path
