"""`/api/v1/workloads/`: every kind's workloads in one read-only list (jobs, instances, notebooks,
Ray clusters, and any kind registered later), each with its kind, state, pod sets and where it
stands in the queue. A kind's own endpoint has the rest of it, and is where it is changed.

What a user sees here is what each kind's own list shows them (apps/workloads/listing.py's
``visible()``, through the access layer): another tenant's workloads are not found.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import django_filters
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers, viewsets
from rest_framework.exceptions import ValidationError

from apps.workloads import host, listing, progress
from apps.workloads.kinds import KINDS
from apps.workloads.models import PodSet, Workload


class PodSetSerializer(serializers.ModelSerializer):
    """One role of a workload: `replicas` alike replicas, each with `gpus` GPUs of `gpu_type` (a
    share below one, or whole devices), `cpu_cores` and `memory_gb`."""

    gpus = serializers.DecimalField(max_digits=7, decimal_places=3, read_only=True)

    class Meta:
        model = PodSet
        fields = ["role", "replicas", "min_replicas", "max_replicas", "gpu_type", "gpus", "cpu_cores", "memory_gb"]
        read_only_fields = fields


class StartStepSerializer(serializers.Serializer):
    """One step of a workload's start, as it happened (apps/workloads/progress.py)."""

    step = serializers.CharField(help_text="queued, environment, starting or answering")
    detail = serializers.CharField(help_text="What it does, in words.")
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True, help_text="null while it runs")
    expected_s = serializers.FloatField(
        allow_null=True, help_text="How long it usually takes, from earlier runs (an environment build's median)."
    )
    packages = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="What an environment build installs."
    )


def start_steps(row: Workload) -> list[dict[str, Any]]:
    """The steps of the workload's start, for the API and the pages, with times as datetimes."""
    kind = host.KINDS.get(row.kind)
    if kind is None:
        steps = list(row.start_progress or [])
    else:
        steps = progress.steps_of(row, kind.start_states, lambda: kind.start_wait(listing.detail(row)))
    return [
        {
            **step,
            "started_at": _when(step.get("started_at")),
            "ended_at": _when(step.get("ended_at")),
        }
        for step in steps
    ]


def _when(stamp: float | None) -> datetime | None:
    return datetime.fromtimestamp(float(stamp), tz=UTC) if stamp is not None else None


class StartProgressMixin(serializers.Serializer):
    """``start_progress``: what the workload's start did, step by step, with times; while it waits
    for a worker, that wait (JupyterHub's spawner progress)."""

    start_progress = serializers.SerializerMethodField()

    @extend_schema_field(StartStepSerializer(many=True))
    def get_start_progress(self, row: Workload) -> list[dict[str, Any]]:
        return StartStepSerializer(start_steps(row), many=True).data  # type: ignore[no-any-return]


class WorkloadSerializer(StartProgressMixin, serializers.ModelSerializer):
    workspace = serializers.SlugRelatedField(slug_field="name", read_only=True)
    kind = serializers.CharField(read_only=True, help_text="job, instance, notebook, raycluster, ...")
    podsets = PodSetSerializer(many=True, read_only=True)
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    requested_cluster = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    exit_code = serializers.SerializerMethodField()
    failure_reason = serializers.SerializerMethodField()

    class Meta:
        model = Workload
        fields = [
            "id", "kind", "workspace", "name", "state", "priority", "preemptible", "podsets", "exit_code",
            "failure_reason", "wait_reason", "workspace_queue_position", "cluster_queue_position",
            "estimated_start_at", "cluster", "requested_cluster", "created_by", "created_at", "admitted_at",
            "started_at", "finished_at", "start_progress",
        ]  # fmt: skip
        read_only_fields = fields

    def get_exit_code(self, workload: Workload) -> int | None:
        """Its exit code, for a kind that runs a command to its end (a job, a Ray job) and once it ended."""
        return getattr(listing.detail(workload), "exit_code", None)

    def get_failure_reason(self, workload: Workload) -> str:
        """Why it failed or was stopped, in its kind's words ("" when nothing went wrong)."""
        return str(getattr(listing.detail(workload), "failure_reason", "") or "")


def kind_choices() -> list[tuple[str, str]]:
    return [(name, info.label or name) for name, info in KINDS.items()]


class KindInFilter(django_filters.BaseInFilter, django_filters.CharFilter):
    """`kind__in=job,raycluster`: each value is a kind; one that is not is refused (400), rather
    than answered with an empty list, as if no workload of it existed."""

    def filter(self, qs: Any, value: Any) -> Any:
        unknown = sorted(set(value or ()) - set(KINDS))
        if unknown:
            choices = ", ".join(KINDS)
            raise ValidationError({"kind__in": [f"Not a choice: {', '.join(unknown)}. Choose among: {choices}."]})
        return super().filter(qs, value)


class WorkloadFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=kind_choices(), help_text="Only workloads of this kind.")
    kind__in = KindInFilter(field_name="kind", lookup_expr="in", help_text="Only workloads of these kinds.")

    class Meta:
        model = Workload
        fields = {"workspace__name": ["exact"], "state": ["exact", "in"], "name": ["exact"]}


class WorkloadViewSet(viewsets.ReadOnlyModelViewSet):
    """Every kind's workloads in one list, newest first: its `kind`, state, pod sets (what it asks
    for, per role), why it waits, its positions in its workspace's and the cluster's queue, and its
    estimated start. Filter by `kind` (or `kind__in`), `state`, `workspace` and `name`; the kind's own
    endpoint (`/api/v1/jobs/<id>/`, `/api/v1/ray-clusters/<id>/`...) has the rest of it."""

    serializer_class = WorkloadSerializer
    queryset = Workload.objects.none()  # for the schema; get_queryset() is the truth
    workspace_field = "workspace"  # for the `?workspace=` filter
    filterset_class = WorkloadFilter
    ordering_fields = ["created_at", "priority", "state", "kind", "cluster_queue_position"]

    def get_queryset(self) -> Any:
        rows = listing.with_details(listing.visible(self.request.user))
        return rows.select_related("requested_cluster", "created_by").prefetch_related("podsets")
