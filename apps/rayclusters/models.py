"""Ray clusters: a head and N workers, run together as one workload (apps/workloads/models.py).

A cluster with an ``entrypoint`` is a fire-and-forget Ray job: it runs the entrypoint once every
node joined, and ends with it (its exit code, its artifacts). Without one it runs until deleted.
Its pod sets are its head (one replica) and its workers (``workers`` replicas, none for a head
alone), each of the size its row says.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.crypto import salted_hmac

from apps.compute.hosts import host_label, notebook_host, notebook_origin
from apps.names import validate_gpu_type
from apps.workloads.models import PodSet, Workload

MAX_WORKERS = 256


def _gpus() -> models.DecimalField:
    return models.DecimalField(
        max_digits=7,
        decimal_places=3,
        default=Decimal("0"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("1024"))],
    )


class RayCluster(Workload):
    class State(models.TextChoices):
        QUEUED = "QUEUED", "Queued"
        ADMITTED = "ADMITTED", "Starting"
        RUNNING = "RUNNING", "Running"
        DEGRADED = "DEGRADED", "Degraded"
        PREEMPTED = "PREEMPTED", "Preempted"
        STOPPING = "STOPPING", "Stopping"
        SUCCEEDED = "SUCCEEDED", "Succeeded"
        FAILED = "FAILED", "Failed"
        STOPPED = "STOPPED", "Stopped"

    KIND = "raycluster"
    INITIAL_STATE = State.QUEUED
    # Its workload row (its id is the workload's); `workload.as_raycluster` is this detail row.
    workload_ptr = models.OneToOneField(
        Workload, on_delete=models.CASCADE, parent_link=True, primary_key=True, related_name="as_raycluster"
    )
    LIVE_STATES = (
        State.QUEUED,
        State.ADMITTED,
        State.RUNNING,
        State.DEGRADED,
        State.PREEMPTED,
        State.STOPPING,
    )
    # While its processes may run (and hold its devices).
    HOLDING_STATES = (State.ADMITTED, State.RUNNING, State.DEGRADED, State.PREEMPTED, State.STOPPING)
    FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.STOPPED)

    description = models.CharField(max_length=2000, blank=True)
    gpu_type = models.CharField(max_length=32, blank=True, validators=[validate_gpu_type])
    head_gpus = _gpus()
    head_cpu_cores = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(4096)])
    head_memory_gb = models.PositiveIntegerField(default=4, validators=[MinValueValidator(1), MaxValueValidator(65536)])
    workers = models.PositiveIntegerField(default=1, validators=[MaxValueValidator(MAX_WORKERS)])
    worker_gpus = _gpus()
    worker_cpu_cores = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(4096)]
    )
    worker_memory_gb = models.PositiveIntegerField(
        default=4, validators=[MinValueValidator(1), MaxValueValidator(65536)]
    )
    entrypoint = models.TextField(blank=True, max_length=100_000)
    image = models.CharField(max_length=300, blank=True)
    env = models.JSONField(default=dict, blank=True)
    artifact_paths = models.JSONField(default=list, blank=True)
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True, validators=[MaxValueValidator(366 * 86400)])
    failure_reason = models.CharField(max_length=2000, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    # How often it was started: once, and again after each preemption.
    attempts = models.PositiveIntegerField(default=0)
    # Each node as its backend last reported it: [{"name", "role", "alive"}], while it runs.
    nodes = models.JSONField(default=list, blank=True)
    # Where the portal's proxy sends its host's requests (its dashboard), once it is ready.
    proxy_target = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.workspace}/{self.name}"

    def pod_sets(self) -> list[PodSet]:
        head = PodSet(
            workload_id=self.pk,
            role="head",
            position=0,
            replicas=1,
            gpu_type=self.gpu_type if self.head_gpus else "",
            gpus=self.head_gpus,
            cpu_cores=self.head_cpu_cores,
            memory_gb=self.head_memory_gb,
        )
        if not self.workers:
            return [head]
        workers = PodSet(
            workload_id=self.pk,
            role="worker",
            position=1,
            replicas=self.workers,
            gpu_type=self.gpu_type if self.worker_gpus else "",
            gpus=self.worker_gpus,
            cpu_cores=self.worker_cpu_cores,
            memory_gb=self.worker_memory_gb,
        )
        return [head, workers]

    @property
    def total_gpus(self) -> Decimal:
        return self.head_gpus + self.worker_gpus * self.workers

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES

    @property
    def auth_token(self) -> str:
        """The cluster's own Ray token (``RAY_AUTH_MODE=token``): derived from the portal's secret
        key and the cluster's identity, so nothing that would let anyone in is stored. Its nodes
        get it in their environment; the portal's proxy adds it to the requests it lets through."""
        return salted_hmac("apps.rayclusters.token", f"{self.pk}:{self.created_at.isoformat()}").hexdigest()

    @property
    def host_label(self) -> str:
        """The DNS label of its dashboard's own host name (beside notebooks': apps/compute/hosts.py)."""
        return host_label(f"ray-{self.name}", self.pk)

    @property
    def host(self) -> str:
        return notebook_host(self.host_label)

    @property
    def dashboard_url(self) -> str:
        """Where its dashboard and Jobs API are reached, through the portal's proxy."""
        return f"{notebook_origin(self.host_label)}/" if self.pk else ""


class RayDashboardCode(models.Model):
    """A one-time code of the sign-in handoff to a Ray cluster's dashboard (as ``NotebookAuthCode``
    for notebooks): issued on the portal's origin to a user who may see the cluster, redeemed once,
    within seconds, on that cluster's own host alone (apps/rayclusters/proxy.py). Only its SHA-256
    is kept."""

    cluster = models.ForeignKey(RayCluster, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    code_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"dashboard code for {self.cluster} ({self.user})"
