from __future__ import annotations

from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.names import validate_gpu_type
from apps.workloads.models import PodSet, Workload, single_pod_set


class Job(Workload):
    class State(models.TextChoices):
        QUEUED = "QUEUED", "Queued"
        ADMITTED = "ADMITTED", "Admitted"
        RUNNING = "RUNNING", "Running"
        SUCCEEDED = "SUCCEEDED", "Succeeded"
        FAILED = "FAILED", "Failed"
        CANCELLED = "CANCELLED", "Cancelled"
        PREEMPTED = "PREEMPTED", "Preempted"

    KIND = "job"
    # Its workload row (its id is the workload's); `workload.as_job` is this detail row.
    workload_ptr = models.OneToOneField(
        Workload, on_delete=models.CASCADE, parent_link=True, primary_key=True, related_name="as_job"
    )
    INITIAL_STATE = State.QUEUED
    ACTIVE_STATES = (State.QUEUED, State.ADMITTED, State.RUNNING, State.PREEMPTED)
    FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED)

    description = models.CharField(max_length=2000, blank=True)
    command = models.TextField(blank=True, max_length=100_000)
    image = models.CharField(max_length=300, blank=True)
    env = models.JSONField(default=dict, blank=True)
    artifact_paths = models.JSONField(default=list, blank=True)
    # What it asks for, per replica; a gang of `replicas` is admitted all at once or not at all.
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
    checkpointable = models.BooleanField(default=False, help_text="Gets a grace signal before preemption.")
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True, validators=[MaxValueValidator(366 * 86400)])
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

    def __str__(self) -> str:
        return f"{self.workspace}/{self.name}#{self.pk}"

    def pod_sets(self) -> list[PodSet]:
        return [single_pod_set(self)]

    @property
    def total_gpus(self) -> Decimal:
        return self.gpus_per_replica * self.replicas

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
    """A file a workload left under its artifact paths: a job's, or a Ray cluster's (the column
    keeps its name; it holds a workload)."""

    job = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="artifacts")
    path = models.CharField(max_length=1000)
    size_bytes = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job_id", "path"]
        constraints = [models.UniqueConstraint(fields=["job", "path"], name="artifact_unique")]

    def __str__(self) -> str:
        return self.path
