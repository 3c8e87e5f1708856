"""The API of elastic node pools (``/api/v1/pool-scaling/``), for platform admins only, reads too:
pools are the platform's. A pool's scaling is found by the pool's id; each shows its cluster and
pool names, its nodes with their power state and since when, and the month's GPU-hours; the
autoscaler's decisions are listed newest first at ``<id>/decisions/``."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from django.db.models import Prefetch, QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.strict import StrictModelSerializer
from apps.api.views import IsPlatformAdmin, PortalViewSet
from apps.elastic import actions
from apps.elastic.models import PoolScaling, ScalingDecision
from apps.inventory.models import Node, NodePool

WEEK_S = 7 * 86400


def month_used(scaling: PoolScaling, now: datetime) -> float:
    """GPU-hours the pool ran above its minimum this calendar month (none yet in a month the
    autoscaler has not counted)."""
    return scaling.used_gpu_hours if scaling.budget_month == f"{now:%Y-%m}" else 0.0


class PoolScalingSerializer(StrictModelSerializer):
    id = serializers.IntegerField(source="pool_id", read_only=True, help_text="The node pool's id.")
    pool = serializers.PrimaryKeyRelatedField(
        queryset=NodePool.objects.select_related("cluster"), help_text="The node pool's id (on creation only)."
    )
    cluster = serializers.CharField(source="pool.cluster.name", read_only=True)
    pool_name = serializers.CharField(source="pool.name", read_only=True)
    command = serializers.CharField(
        max_length=500, required=False, allow_blank=True,
        help_text="For provider `command`: the absolute path of an executable file, run as "
        "`<command> up|down <cluster> <pool> <node>...`.",
    )  # fmt: skip
    min_nodes = serializers.IntegerField(min_value=0, max_value=10_000, required=False)
    max_nodes = serializers.IntegerField(
        min_value=1, max_value=10_000, help_text="At most the pool's nodes in the inventory."
    )
    scale_down_delay_s = serializers.IntegerField(
        min_value=0, max_value=WEEK_S, required=False, help_text="An empty node is powered down after this long."
    )
    start_timeout_s = serializers.IntegerField(
        min_value=10, max_value=3600, required=False, help_text="A node not up this long after its start has failed."
    )
    budget_gpu_hours = serializers.IntegerField(
        min_value=0, max_value=10_000_000, allow_null=True, required=False,
        help_text="GPU-hours a calendar month the pool's nodes may run above its minimum; null: no budget.",
    )  # fmt: skip
    used_gpu_hours = serializers.SerializerMethodField()
    nodes = serializers.SerializerMethodField()

    class Meta:
        model = PoolScaling
        fields = ["id", "pool", "cluster", "pool_name", "enabled", "provider", "command", "min_nodes", "max_nodes",
                  "scale_down_delay_s", "start_timeout_s", "budget_gpu_hours", "used_gpu_hours", "nodes",
                  "updated_at"]  # fmt: skip
        read_only_fields = ["updated_at"]
        validators: list[Any] = []  # the action checks the pool and the limits together

    def get_used_gpu_hours(self, scaling: PoolScaling) -> float:
        """GPU-hours run above the minimum this calendar month."""
        return round(month_used(scaling, timezone.now()), 2)

    @extend_schema_field(
        {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "state": {"type": "string"},
            "since": {"type": "string", "format": "date-time", "nullable": True}}}}
    )  # fmt: skip
    def get_nodes(self, scaling: PoolScaling) -> list[dict[str, Any]]:
        """The pool's nodes, each with its state and since when it is in it (as far as the autoscaler knows)."""
        out = []
        for node in scaling.pool.nodes.all():
            power = getattr(node, "power", None)
            since = power.changed_at.isoformat() if power is not None else None
            out.append({"name": node.name, "state": node.state, "since": since})
        return out


class DecisionSerializer(StrictModelSerializer):
    class Meta:
        model = ScalingDecision
        fields = ["id", "at", "action", "nodes", "reason", "error"]


class PoolScalingViewSet(PortalViewSet):
    """Elastic node pools, by the pool's id: `POST` makes a pool elastic (`pool` names it), `PATCH`
    changes its limits, `DELETE` makes it static again (refused while a node is not up). Platform
    admins only."""

    serializer_class = PoolScalingSerializer
    queryset = PoolScaling.objects.none()  # for the schema; get_queryset() is the truth
    permission_classes = [IsPlatformAdmin]
    filterset_fields = ["enabled", "provider"]
    ordering_fields = ["pool__cluster__name", "pool__name"]

    def get_queryset(self) -> QuerySet[PoolScaling]:
        nodes = Node.objects.select_related("power").order_by("name")
        return (
            PoolScaling.objects.select_related("pool__cluster")
            .prefetch_related(Prefetch("pool__nodes", queryset=nodes))
            .order_by("pool__cluster__name", "pool__name")
        )

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = dict(serializer.validated_data)
        pool = data.pop("pool")
        if PoolScaling.objects.filter(pool=pool).exists():
            raise ValidationError({"pool": [f"Pool {pool} is elastic already: change it at {pool.pk}/."]})
        scaling = actions.do_set_pool_scaling(pool, actions.Limits(**data), **self.action_kwargs())
        serializer.instance = self.get_queryset().get(pk=scaling.pk)

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        scaling: PoolScaling = serializer.instance
        data = dict(serializer.validated_data)
        if "pool" in data and data.pop("pool") != scaling.pool:
            raise ValidationError({"pool": ["A pool's scaling stays with its pool: remove it, then make the other "
                                            "pool elastic."]})  # fmt: skip
        limits = actions.Limits(**{**asdict(actions.Limits.of(scaling)), **data})
        actions.do_set_pool_scaling(scaling.pool, limits, **self.action_kwargs())
        serializer.instance = self.get_queryset().get(pk=scaling.pk)

    def perform_destroy(self, instance: PoolScaling) -> None:
        actions.do_disable(instance, **self.action_kwargs())

    @extend_schema(responses=DecisionSerializer(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])  # the pools' filters are not the decisions'
    def decisions(self, request: Request, pk: str | None = None) -> Response:
        """The autoscaler's decisions for the pool, newest first: powered up, powered down, failed to
        start, refused; each with its nodes, its reason and the provider's error if there was one."""
        scaling = self.get_object()
        page = self.paginate_queryset(ScalingDecision.objects.filter(pool_id=scaling.pool_id).order_by("-at", "-id"))
        return self.get_paginated_response(DecisionSerializer(page, many=True).data)
