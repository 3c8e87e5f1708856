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
from apps.api.strict import StrictModelSerializer, StrictSerializer, ThousandthsField
from apps.api.views import IsAdminOrReadOnly, IsPlatformAdmin, PortalViewSet
from apps.audit.actions import Origin
from apps.inventory import actions, maintenance
from apps.inventory.models import GPU, Allocation, Cluster, MaintenanceWindow, Node
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
    maintenance = serializers.ChoiceField(
        choices=["", "cordoned", "draining", "drained"], read_only=True,
        help_text="The portal's maintenance of the node ('' : in service), apart from the `state` its cluster reports.",
    )  # fmt: skip
    cordoned_by = serializers.CharField(source="cordoned_by.username", read_only=True, default=None, allow_null=True,
                                        help_text="The admin who cordoned it (shown to admins only).")  # fmt: skip

    class Meta:
        model = Node
        fields = ["id", "cluster", "pool", "name", "cpu_cores", "memory_gb", "state", "gpus", "maintenance",
                  "maintenance_reason", "cordoned_at", "cordoned_by", "drain_requested_at", "drained_at",
                  "updated_at"]  # fmt: skip

    def to_representation(self, instance: Node) -> dict[str, Any]:
        data = super().to_representation(instance)
        if not self.context["request"].user.is_staff:
            data["cordoned_by"] = None  # who administers the platform is the admins' business
        return data


class CordonSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class DrainSerializer(CordonSerializer):
    grace_s = serializers.IntegerField(
        min_value=0, max_value=3600, required=False, allow_null=True, default=None,
        help_text="Seconds the work moved off is given to checkpoint (default: the preemption grace).",
    )  # fmt: skip


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """Nodes of every registered cluster; platform admins cordon, drain and bring them back."""

    serializer_class = NodeSerializer
    queryset = Node.objects.none()  # for the schema; get_queryset() is the truth
    filterset_fields = {"pool__cluster__name": ["exact"], "state": ["exact"]}
    ordering_fields = ["name"]

    def get_queryset(self) -> Any:
        return (
            Node.objects.select_related("pool__cluster", "cordoned_by")
            .annotate(gpu_count=Count("gpus"))
            .order_by("pool__cluster__name", "name")  # aggregates drop Meta.ordering
        )

    def _answer(self, node: Node) -> Response:
        return Response(self.get_serializer(self.get_queryset().get(pk=node.pk)).data)

    def _kwargs(self) -> dict[str, Any]:
        return {"acting_user": self.request.user, "origin": Origin.from_request(self.request)}

    @extend_schema(request=CordonSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsPlatformAdmin])
    def cordon(self, request: Request, pk: str | None = None) -> Response:
        """Place no new work on the node; what runs there goes on (on Slurm, drained in Slurm too)."""
        node = self.get_object()
        body = CordonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._answer(maintenance.do_cordon_node(node, reason=body.validated_data["reason"], **self._kwargs()))

    @extend_schema(request=DrainSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsPlatformAdmin])
    def drain(self, request: Request, pk: str | None = None) -> Response:
        """Cordon the node and move its work off: preemptible jobs and Ray clusters are given their
        grace and requeued; inference replicas serve on until their replacements on other nodes
        serve; instances and work not preemptible are waited out (docs/operations.md).
        `maintenance` is "drained" once the node is empty."""
        node = self.get_object()
        body = DrainSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        node = maintenance.do_drain_node(
            node, reason=body.validated_data["reason"], grace_s=body.validated_data["grace_s"], **self._kwargs()
        )
        return self._answer(node)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsPlatformAdmin])
    def uncordon(self, request: Request, pk: str | None = None) -> Response:
        """Bring the node back into service (on Slurm, resumed in Slurm too)."""
        return self._answer(maintenance.do_uncordon_node(self.get_object(), **self._kwargs()))


class NodeNamesField(serializers.ListField):
    """Nodes by name: names in, the names of a window's nodes out."""

    def to_representation(self, data: Any) -> list[str]:
        return sorted(node.name for node in data.all())


class MaintenanceWindowSerializer(StrictModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="name", queryset=Cluster.objects.all())
    nodes = NodeNamesField(
        child=serializers.CharField(max_length=253), required=False, max_length=1000,
        help_text="Names of the cluster's nodes; none: every node of the cluster.",
    )  # fmt: skip
    state = serializers.ChoiceField(choices=["scheduled", "active", "ended"], read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)
    workspaces = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True,
                                              help_text="The workspaces of the work it affects (told so).")  # fmt: skip

    class Meta:
        model = MaintenanceWindow
        fields = ["id", "cluster", "nodes", "start_at", "end_at", "reason", "state", "workspaces", "created_by",
                  "created_at", "announced_at", "started_at", "ended_at"]  # fmt: skip

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """The named nodes, as nodes of the window's cluster."""
        names = attrs.pop("nodes", None)
        if names is not None:
            cluster = attrs.get("cluster") or (self.instance.cluster if self.instance else None)
            found = {n.name: n for n in Node.objects.filter(pool__cluster=cluster, name__in=names)}
            missing = sorted(set(names) - set(found))
            if missing:
                raise ValidationError({"nodes": [f"No node {', '.join(missing)} in cluster {cluster}."]})
            attrs["node_list"] = [found[name] for name in dict.fromkeys(names)]
        return attrs


class MaintenanceWindowViewSet(PortalViewSet):
    """Maintenance windows, for platform admins: announced to the users whose work they affect, their
    nodes drained at the start and brought back at the end."""

    serializer_class = MaintenanceWindowSerializer
    queryset = MaintenanceWindow.objects.none()  # for the schema; get_queryset() is the truth
    permission_classes = [IsPlatformAdmin]
    filterset_fields = {"cluster__name": ["exact"]}
    ordering_fields = ["start_at"]

    def get_queryset(self) -> Any:
        return (
            MaintenanceWindow.objects.select_related("cluster", "created_by")
            .prefetch_related("nodes", "workspaces")
            .order_by("start_at", "id")
        )

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        fields = dict(serializer.validated_data)
        nodes = fields.pop("node_list", None)
        serializer.instance = maintenance.check_save_window(
            MaintenanceWindow(), fields, nodes=nodes, **self.action_kwargs()
        )

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        fields = dict(serializer.validated_data)
        nodes = fields.pop("node_list", None)
        serializer.instance = maintenance.check_save_window(
            serializer.instance, fields, nodes=nodes, **self.action_kwargs()
        )

    def perform_destroy(self, instance: MaintenanceWindow) -> None:
        maintenance.do_delete_window(instance, **self.action_kwargs())


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
