from __future__ import annotations

from typing import Any

from django.db.models import Count, Prefetch
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.fields import NameField, SettingsField
from apps.api.strict import StrictModelSerializer, ThousandthsField
from apps.api.views import IsAdminOrReadOnly, IsPlatformAdmin, PortalViewSet
from apps.inventory import actions
from apps.inventory.models import GPU, Allocation, Cluster, Node
from apps.workspaces.access import workspace_ids


class ClusterSerializer(StrictModelSerializer):
    name = NameField()
    connection = SettingsField(required=False)
    gpus = serializers.IntegerField(source="gpu_count", read_only=True)
    nodes = serializers.IntegerField(source="node_count", read_only=True)

    class Meta:
        model = Cluster
        fields = ["id", "name", "kind", "connection", "placement", "is_default", "enabled", "gpus", "nodes",
                  "discovered_at", "created_at"]  # fmt: skip
        read_only_fields = ["discovered_at"]

    def to_representation(self, instance: Cluster) -> dict[str, Any]:
        data = super().to_representation(instance)
        if not self.context["request"].user.is_staff:
            data.pop("connection", None)  # endpoints and credentials are for admins
        return data

    def validate_connection(self, value: dict[str, Any]) -> dict[str, Any]:
        if len(str(value)) > 20000:
            raise ValidationError("Connection settings are limited to 20,000 characters.")
        return value


class ClusterViewSet(PortalViewSet):
    """Registered clusters. Admins register Slurm and Kubernetes clusters; 'local' is this machine."""

    serializer_class = ClusterSerializer
    queryset = Cluster.objects.none()  # for the schema; get_queryset() is the truth
    permission_classes = [IsAdminOrReadOnly]
    lookup_field = "name"
    filterset_fields = ["kind", "enabled"]
    ordering_fields = ["name"]

    def get_queryset(self) -> Any:
        # Aggregates drop Meta.ordering: order again, or pages may overlap.
        return Cluster.objects.annotate(
            gpu_count=Count("pools__nodes__gpus", distinct=True), node_count=Count("pools__nodes", distinct=True)
        ).order_by("name")

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = actions.do_save_cluster(Cluster(), serializer.validated_data, **self.action_kwargs())

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = actions.do_save_cluster(
            serializer.instance, serializer.validated_data, **self.action_kwargs()
        )

    def perform_destroy(self, instance: Cluster) -> None:
        actions.do_delete_cluster(instance, **self.action_kwargs())

    @extend_schema(request=None, responses=ClusterSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsPlatformAdmin])
    def discover(self, request: Request, name: str | None = None) -> Response:
        """Refresh the cluster's nodes and GPUs from what it reports (local: NVML or the declared
        inventory; Slurm: the nodes of its partition, from `scontrol`; Kubernetes: the API server's nodes).
        503 if the cluster does not answer."""
        cluster = self.get_object()
        actions.do_discover_cluster(cluster, **self.action_kwargs())
        return Response(self.get_serializer(self.get_queryset().get(pk=cluster.pk)).data)


class AllocationSerializer(StrictModelSerializer):
    fraction = ThousandthsField(max_digits=4, decimal_places=3, read_only=True)
    holder = serializers.SerializerMethodField()

    class Meta:
        model = Allocation
        fields = ["fraction", "replica", "holder"]

    @extend_schema_field({"type": "object", "nullable": True})
    def get_holder(self, allocation: Allocation) -> dict[str, Any] | None:
        """What holds the share: shown only where you can see the workload's workspace."""
        workload = allocation.workload
        if workload.workspace_id not in self.context["visible_workspaces"]:
            return None
        return {
            "kind": workload.kind,
            "id": workload.pk,
            "name": workload.name,
            "workspace": workload.workspace.name,
            "role": allocation.podset.role,
        }


class GPUSerializer(StrictModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)
    cluster = serializers.CharField(source="node.pool.cluster.name", read_only=True)
    pool = serializers.CharField(source="node.pool.name", read_only=True)
    allocations = AllocationSerializer(many=True, read_only=True)

    class Meta:
        model = GPU
        fields = ["id", "cluster", "pool", "node", "index", "uuid", "gpu_type", "model", "memory_mb",
                  "architecture", "declared", "allocations"]  # fmt: skip


class NodeSerializer(StrictModelSerializer):
    cluster = serializers.CharField(source="pool.cluster.name", read_only=True)
    pool = serializers.CharField(source="pool.name", read_only=True)
    gpus = serializers.IntegerField(source="gpu_count", read_only=True)

    class Meta:
        model = Node
        fields = ["id", "cluster", "pool", "name", "cpu_cores", "memory_gb", "state", "gpus", "updated_at"]


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """Nodes of every registered cluster."""

    serializer_class = NodeSerializer
    queryset = Node.objects.none()  # for the schema; get_queryset() is the truth
    filterset_fields = {"pool__cluster__name": ["exact"], "state": ["exact"]}
    ordering_fields = ["name"]

    def get_queryset(self) -> Any:
        return (
            Node.objects.select_related("pool__cluster")
            .annotate(gpu_count=Count("gpus"))
            .order_by("pool__cluster__name", "name")  # aggregates drop Meta.ordering
        )


class GPUViewSet(viewsets.ReadOnlyModelViewSet):
    """Every GPU with its model, memory and what holds it (where you may see the holder)."""

    serializer_class = GPUSerializer
    queryset = GPU.objects.none()  # for the schema; get_queryset() is the truth
    filterset_fields = {"node__pool__cluster__name": ["exact"], "gpu_type": ["exact"], "node__name": ["exact"]}
    ordering_fields = ["index"]

    def get_queryset(self) -> Any:
        holders = Allocation.objects.select_related("workload__workspace", "podset")
        return GPU.objects.select_related("node__pool__cluster").prefetch_related(
            Prefetch("allocations", queryset=holders)
        )

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        context["visible_workspaces"] = set(workspace_ids(self.request.user).values_list("pk", flat=True))
        return context
