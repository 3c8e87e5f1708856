"""Inference endpoints: a trained model served at a stable URL by replicas of an OpenAI-compatible
server, between a minimum and a maximum of replicas.

An ``Endpoint`` is a workload that holds nothing itself: its replicas do. Each ``Replica`` is a
workload of its own, admitted by the scheduler under its workspace's quota like any other: the
replicas up to the endpoint's minimum in the inference class, the ones above it as preemptible
work that gives way first. The autoscaler (apps/inference/scaling.py) decides how many there should
be, from what the portal's proxy records of the endpoint's traffic (``Traffic``), and writes every
decision down (``ScaleEvent``). A new version of the model rolls out replica by replica: the new
ones must answer before the old ones stop.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.crypto import salted_hmac

from apps.compute.hosts import host_label, notebook_host, notebook_origin
from apps.workloads.models import PodSet, Workload

MAX_REPLICAS = 64
#: Longest a quiet endpoint may wait before it scales to zero (and the shortest, so that a replica
#: that just started is not stopped before anyone could call it).
SCALE_TO_ZERO_RANGE_S = (60, 7 * 86400)


class Endpoint(Workload):
    class State(models.TextChoices):
        DEPLOYING = "DEPLOYING", "Deploying"  # no replica serves yet
        READY = "READY", "Ready"  # at least one replica serves
        IDLE = "IDLE", "Scaled to zero"
        FAILED = "FAILED", "Failed"
        DELETING = "DELETING", "Deleting"
        DELETED = "DELETED", "Deleted"

    class Source(models.TextChoices):
        ARTIFACT = "artifact", "A finished job's artifact"
        PATH = "path", "A path in the workspace's directory"

    KIND = "endpoint"
    INITIAL_STATE = State.DEPLOYING
    workload_ptr = models.OneToOneField(
        Workload, on_delete=models.CASCADE, parent_link=True, primary_key=True, related_name="as_endpoint"
    )
    LIVE_STATES = (State.DEPLOYING, State.READY, State.IDLE, State.DELETING)
    FINAL_STATES = (State.FAILED, State.DELETED)

    description = models.CharField(max_length=2000, blank=True)
    profile = models.ForeignKey("catalog.InferenceProfile", on_delete=models.PROTECT, related_name="endpoints")
    source = models.CharField(max_length=16, choices=Source.choices)
    # The job whose artifact it serves (source "artifact"), and that artifact's path in the job.
    source_job = models.ForeignKey(
        Workload, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_constraint=True
    )
    source_artifact = models.CharField(max_length=1000, blank=True)
    # What the replicas load: relative to the workspace's directory (resolved from the source).
    model_path = models.CharField(max_length=1000)
    min_replicas = models.PositiveIntegerField(default=1, validators=[MaxValueValidator(MAX_REPLICAS)])
    max_replicas = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(MAX_REPLICAS)]
    )
    # Every replica stops after this many quiet seconds; None: never below the minimum.
    scale_to_zero_s = models.PositiveIntegerField(null=True, blank=True)
    # Bumped by each update of what it serves: replicas of an older version are rolled out.
    version = models.PositiveIntegerField(default=1)
    # How many replicas of the current version it should have now: the autoscaler's last decision.
    desired_replicas = models.PositiveIntegerField(default=0)
    last_request_at = models.DateTimeField(null=True, blank=True)
    # Since when fewer replicas would have done (the quiet delay before scaling down counts from it).
    quiet_since = models.DateTimeField(null=True, blank=True)
    # Since when its load has needed more replicas than it has (the delay before scaling up counts
    # from it).
    pressed_since = models.DateTimeField(null=True, blank=True)
    failure_reason = models.CharField(max_length=4000, blank=True)
    # What it served before its last update ({"version", "model_path", "profile"}): what a rollout
    # that fails goes back to.
    previous = models.JSONField(null=True, blank=True, default=None)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.workspace}/{self.name}"

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES

    @property
    def host_label(self) -> str:
        """The DNS label of its own host name (beside notebooks' and Ray dashboards')."""
        return host_label(f"ep-{self.name}", self.pk)

    @property
    def host(self) -> str:
        return notebook_host(self.host_label)

    @property
    def url(self) -> str:
        """Its base URL for OpenAI clients (``base_url``): ``<origin>/v1``."""
        return f"{notebook_origin(self.host_label)}/v1" if self.pk else ""


class Replica(Workload):
    """One server of an endpoint, admitted and started like any workload."""

    class State(models.TextChoices):
        QUEUED = "QUEUED", "Queued"
        ADMITTED = "ADMITTED", "Starting"
        READY = "READY", "Serving"
        STOPPING = "STOPPING", "Stopping"
        PREEMPTED = "PREEMPTED", "Preempted"
        STOPPED = "STOPPED", "Stopped"
        FAILED = "FAILED", "Failed"

    KIND = "replica"
    INITIAL_STATE = State.QUEUED
    workload_ptr = models.OneToOneField(
        Workload, on_delete=models.CASCADE, parent_link=True, primary_key=True, related_name="as_replica"
    )
    LIVE_STATES = (State.QUEUED, State.ADMITTED, State.READY, State.STOPPING, State.PREEMPTED)
    HOLDING_STATES = (State.ADMITTED, State.READY)
    FINAL_STATES = (State.STOPPED, State.FAILED)

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="replicas")
    version = models.PositiveIntegerField()
    # Whether it is one of the endpoint's minimum (inference class) or above it (gives way first).
    baseline = models.BooleanField(default=True)
    # Its size, from the endpoint's profile when it was made.
    gpu_type = models.CharField(max_length=32, blank=True)
    gpus = models.DecimalField(max_digits=7, decimal_places=3, default=Decimal("0"))
    cpu_cores = models.PositiveIntegerField(default=1)
    memory_gb = models.PositiveIntegerField(default=4)
    # Where the proxy sends its requests, once it answers.
    proxy_target = models.CharField(max_length=500, blank=True)
    # Why it was stopped or failed ("scaled down", "rolled out", the server's last log lines).
    reason = models.CharField(max_length=4000, blank=True)
    # A drain of the node it serves on asked it to make way (make before break): the endpoint starts
    # a replacement elsewhere and stops this one once the replacement serves, or at the drain's
    # deadline (PORTAL_DRAIN_REPLACE_S). Cleared if the node comes back first.
    retiring_at = models.DateTimeField(null=True, blank=True)
    retire_reason = models.CharField(max_length=500, blank=True, default="", db_default="")

    class Meta:
        ordering = ["endpoint_id", "id"]

    def __str__(self) -> str:
        return f"{self.endpoint_id}/{self.name}"

    @property
    def api_key(self) -> str:
        """The replica's own secret: its server refuses a request without it, and only the portal's
        proxy sends it. Derived from the portal's secret key and the replica's identity (nothing
        that lets anyone in is stored); a replica of another endpoint, or the next one of this,
        has another."""
        return replica_key(self.pk, self.created_at)

    def pod_sets(self) -> list[PodSet]:
        return [
            PodSet(
                workload_id=self.pk,
                role="server",
                replicas=1,
                gpu_type=self.gpu_type if self.gpus else "",
                gpus=self.gpus,
                cpu_cores=self.cpu_cores,
                memory_gb=self.memory_gb,
            )
        ]


def replica_key(pk: int, created_at: Any) -> str:
    return salted_hmac("apps.inference.replica", f"{pk}:{created_at.isoformat()}").hexdigest()


class ScaleEvent(models.Model):
    """One decision of the autoscaler, or a change asked for, with its reason in words."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="scale_events")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    from_replicas = models.PositiveIntegerField()
    to_replicas = models.PositiveIntegerField()
    reason = models.CharField(max_length=500)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.from_replicas} -> {self.to_replicas}: {self.reason}"


class Traffic(models.Model):
    """What one web process's proxy saw of an endpoint, written at most about once a second:
    requests now being served and waiting, and counters since the process started (the
    autoscaler and the endpoint's figures read their differences)."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="+")
    process = models.CharField(max_length=64)
    in_flight = models.PositiveIntegerField(default=0)
    waiting = models.PositiveIntegerField(default=0)
    # Since when the oldest of the waiting requests waits (None: none waits).
    waiting_since = models.DateTimeField(null=True, blank=True)
    requests = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0)
    # Answered requests by latency: how many fell in each bucket of LATENCY_BUCKETS_S.
    latency_counts = models.JSONField(default=list)
    latency_sum_s = models.FloatField(default=0.0)
    completion_tokens = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["endpoint", "process"], name="traffic_endpoint_process")]


class Sample(models.Model):
    """The endpoint's figures over time, one row per period of the autoscaler (its page's charts)."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField(db_index=True)
    replicas = models.PositiveIntegerField()
    serving = models.PositiveIntegerField()
    waiting = models.PositiveIntegerField()
    requests_per_s = models.FloatField()
    errors_per_s = models.FloatField()
    p50_s = models.FloatField(null=True)
    p95_s = models.FloatField(null=True)
    tokens_per_s = models.FloatField(null=True)
    # The proxy's counters summed at that time, which the next sample's rates are worked out from.
    totals = models.JSONField(default=dict)

    class Meta:
        ordering = ["endpoint_id", "at"]


#: The upper bounds of the proxy's latency buckets, in seconds (the last catches the rest).
LATENCY_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, float("inf"))
