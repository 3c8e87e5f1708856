"""One table for every kind of workload, and the pod sets each asks for (as Kueue models them).

A ``Workload`` row is what the scheduler, the workload host, allocations, telemetry, workload
tokens, metrics and live events read: its kind, workspace, name, state, where it runs, when it was
submitted, admitted, started and finished, and the host's bookkeeping. Its ``PodSet`` rows say what
it asks for: one row per role (a job's or an instance's replicas; a Ray cluster's head and its
workers), each with its replicas and what one replica holds. Each kind keeps what is its own in a
detail table, one-to-one with its workload (Django's multi-table inheritance: ``Job(Workload)``);
apps/workloads/kinds.py says the rest of what is each kind's own.

The backend's own record of a workload, its reattach state, is ``backend_state``: written only
from ``Backend.get_state()``, read only by a backend built from it. The portal's bookkeeping of
the lifecycle lives in typed columns beside it, never inside it.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, ClassVar

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from apps.names import validate_dns_label, validate_gpu_type

#: The kinds whose live workloads have names of their own in a workspace, and their live states
#: (a job's name may repeat: it names a series of runs).
LIVE_NAMED = {
    "instance": ("QUEUED", "PROVISIONING", "RUNNING", "DELETING"),
    "notebook": ("PENDING", "STARTING", "READY", "STOPPING"),
    "raycluster": ("QUEUED", "ADMITTED", "STARTING", "RUNNING", "DEGRADED", "PREEMPTED", "STOPPING"),
    "endpoint": ("DEPLOYING", "READY", "IDLE", "DELETING"),
}


#: Every kind's states, for the one `state` column (each kind's own are its `State`; a request
#: for a workload of one kind in another's state finds none).
STATES = sorted(
    {"QUEUED", "ADMITTED", "PROVISIONING", "RUNNING", "DEGRADED", "PREEMPTED", "STOPPING", "DELETING", "DELETED"}
    | {"PENDING", "STARTING", "READY", "STOPPED", "SUCCEEDED", "FAILED", "CANCELLED"}
    | {"DEPLOYING", "IDLE"}
)


#: The `state` column's choices (the API's schema names them WorkloadStateEnum).
STATE_CHOICES = [(state, state.title()) for state in STATES]


class PriorityClass(models.TextChoices):
    """What a workload is, for the order of queueing and preemption (docs/scheduler.md, "Priority
    classes"): inference (an endpoint's minimum replicas) before interactive work (instances) before
    unattended work (jobs, Ray clusters, an endpoint's replicas above its minimum). A class outranks
    every priority within the class below it; within a class, the workload's own ``priority``."""

    INFERENCE = "inference", "Inference"
    INTERACTIVE = "interactive", "Interactive"
    UNATTENDED = "unattended", "Unattended"


#: Each kind's class unless its profile says otherwise.
DEFAULT_CLASS = {
    "instance": PriorityClass.INTERACTIVE,
    "notebook": PriorityClass.INTERACTIVE,
    "replica": PriorityClass.INFERENCE,
    "endpoint": PriorityClass.INFERENCE,
}
#: How far apart the classes are: more than a workload's own priority can span (-1000 to 1000).
CLASS_STEP = 10_000
CLASS_RANK = {PriorityClass.UNATTENDED: 0, PriorityClass.INTERACTIVE: 1, PriorityClass.INFERENCE: 2}


def _live_named() -> Q:
    condition = Q(pk__in=[])
    for kind, states in LIVE_NAMED.items():
        condition |= Q(kind=kind, state__in=states)
    return condition


class Workload(models.Model):
    """Every kind's shared columns. A kind subclasses it and sets ``KIND``, ``State`` and
    ``INITIAL_STATE``; a row's pod sets come from its kind's ``pod_sets()`` when it is created."""

    KIND: ClassVar[str] = ""
    INITIAL_STATE: ClassVar[str] = ""

    kind = models.CharField(max_length=32, editable=False)
    workspace = models.ForeignKey("workspaces.Workspace", on_delete=models.CASCADE, related_name="workloads")
    name = models.CharField(max_length=63, validators=[validate_dns_label])
    state = models.CharField(max_length=16, db_index=True, choices=STATE_CHOICES)
    # Where it runs once admitted (None while it waits); set by the scheduler.
    cluster = models.ForeignKey("inventory.Cluster", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    # Where its submitter asked it to run (None: any cluster). Kept across preemption and requeues.
    requested_cluster = models.ForeignKey(
        "inventory.Cluster", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    priority = models.IntegerField(default=0, validators=[MinValueValidator(-1000), MaxValueValidator(1000)])
    # Its class: ranks above its own priority in queueing and preemption (PriorityClass).
    priority_class = models.CharField(max_length=16, choices=PriorityClass.choices, blank=True)
    # Whether the scheduler may stop it for other work (where its kind may be preempted at all).
    preemptible = models.BooleanField(default=True)
    # The provisioning request whose reserved devices it runs on (uncounted against the quota).
    reservation = models.ForeignKey(
        "provisioning.ProvisioningRequest", null=True, blank=True, on_delete=models.SET_NULL, related_name="workloads"
    )

    # Why it waits, where it stands, when it should start: written by the scheduler.
    wait_reason = models.CharField(max_length=500, blank=True)
    workspace_queue_position = models.PositiveIntegerField(null=True, blank=True)
    cluster_queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start_at = models.DateTimeField(null=True, blank=True)
    # Requeued with backoff (a gang that did not become ready in time): not admitted before this.
    eligible_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # The backend's reattach state (Backend.get_state()); None until a start of it is recorded,
    # and again once its backend stopped it and forgot it.
    backend_state = models.JSONField(null=True, blank=True, default=None)
    # A start under way (apps/workloads/claims.py): its token, when, and which process made it.
    start_claim = models.JSONField(null=True, blank=True, default=None)
    # How many times its processes died and were started again in place (PORTAL_RESTART_LIMIT).
    restarts = models.PositiveIntegerField(default=0)
    # Its backend stopped it and what it left was recorded; its state is kept to read logs from.
    backend_stopped = models.BooleanField(default=False)
    # What its last start did, step by step, as it happened (apps/workloads/progress.py): a list of
    # {step, detail, started_at, ended_at, expected_s}, written by the code that does each step.
    start_progress = models.JSONField(default=list, db_default=[], blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["workspace", "kind", "state"], name="workload_workspace_kind_state")]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "kind", "name"], condition=_live_named(), name="workload_live_name_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.pk}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        adding = self._state.adding
        if adding:
            self.kind = self.kind or self.KIND
            self.state = self.state or self.INITIAL_STATE
            self.priority_class = self.priority_class or DEFAULT_CLASS.get(self.kind, PriorityClass.UNATTENDED)
        super().save(*args, **kwargs)
        if adding and not PodSet.objects.filter(workload_id=self.pk).exists():
            PodSet.objects.bulk_create(self.pod_sets())

    def pod_sets(self) -> list[PodSet]:
        """What it asks for, one pod set per role, made when it is created (none: it holds nothing
        of its own, as a notebook on its instance's GPUs)."""
        return []

    @property
    def scheduling_priority(self) -> int:
        """What the scheduler orders and preempts by: its class first, then its own priority."""
        rank = CLASS_RANK.get(PriorityClass(self.priority_class or PriorityClass.UNATTENDED), 0)
        return rank * CLASS_STEP + self.priority

    def get_state_display(self) -> str:
        states = getattr(type(self), "State", None)
        if states is not None and self.state in states.values:
            return str(states(self.state).label)
        return self.state.title()


class PodSet(models.Model):
    """One role of a workload: ``replicas`` alike replicas, each holding ``gpus`` GPUs of
    ``gpu_type`` (a share below one, or a whole number), ``cpu_cores`` and ``memory_gb``.
    ``min_replicas`` and ``max_replicas`` bound the replicas of a role that scales (None: fixed).
    A workload is admitted with all of its pod sets at once, each placed by its own shape."""

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="podsets")
    role = models.CharField(max_length=32, validators=[validate_dns_label])
    position = models.PositiveSmallIntegerField(default=0)
    replicas = models.PositiveIntegerField(default=1, validators=[MaxValueValidator(1024)])
    min_replicas = models.PositiveIntegerField(null=True, blank=True)
    max_replicas = models.PositiveIntegerField(null=True, blank=True)
    gpu_type = models.CharField(max_length=32, blank=True, validators=[validate_gpu_type])
    gpus = models.DecimalField(
        max_digits=7,
        decimal_places=3,
        default=Decimal("0"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("1024"))],
    )
    cpu_cores = models.PositiveIntegerField(default=1, validators=[MaxValueValidator(4096)])
    memory_gb = models.PositiveIntegerField(default=4, validators=[MaxValueValidator(65536)])

    class Meta:
        ordering = ["workload_id", "position"]
        constraints = [models.UniqueConstraint(fields=["workload", "role"], name="podset_role_unique")]

    def __str__(self) -> str:
        return f"{self.workload_id}/{self.role} x{self.replicas}"

    @property
    def total_gpus(self) -> Decimal:
        return self.gpus * self.replicas


def single_pod_set(row: Any) -> PodSet:
    """The one pod set of a kind whose replicas are alike (a job's gang, an instance): its
    ``replicas``, ``gpu_type``, ``gpus_per_replica``, ``cpu_cores`` and ``memory_gb``."""
    return PodSet(
        workload_id=row.pk,
        role="main",
        replicas=row.replicas,
        gpu_type=row.gpu_type,
        gpus=row.gpus_per_replica,
        cpu_cores=row.cpu_cores,
        memory_gb=row.memory_gb,
    )
