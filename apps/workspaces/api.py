from __future__ import annotations

from decimal import Decimal
from typing import Any

import django_filters
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import DecimalField, ExpressionWrapper, F, Prefetch, Q, Sum
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied

from apps.api.fields import NameField, WorkspaceField
from apps.api.strict import StrictModelSerializer
from apps.api.views import IsAdminOrReadOnly, PortalViewSet, TenantViewSet
from apps.catalog.models import ComputeProfile
from apps.errors import RULE
from apps.workloads.kinds import scheduled
from apps.workloads.models import PodSet
from apps.workspaces import actions
from apps.workspaces.access import MANAGE, restrict, role_in, roles_in
from apps.workspaces.models import Cohort, GPUQuota, Membership, Workspace, WorkspaceDisk

User = get_user_model()

# What a workspace owner may change; everything else is for platform admins.
OWNER_FIELDS = {"display_name", "description"}


def gpus_in_use(workspace_ids: list[int]) -> dict[tuple[int, str], Decimal]:
    """GPUs held per (workspace, type): the pod sets of every kind's workloads in a state in which
    they hold their devices (their kind's `holding` states), in one query."""
    holding = Q(pk__in=[])
    for kind, traits in scheduled().items():
        holding |= Q(workload__kind=kind, workload__state__in=traits.holding)
    each = ExpressionWrapper(F("gpus") * F("replicas"), output_field=DecimalField(max_digits=12, decimal_places=3))
    rows = (
        PodSet.objects.filter(holding, workload__workspace_id__in=workspace_ids, gpus__gt=0)
        .values("workload__workspace_id", "gpu_type")
        .annotate(total=Sum(each))
        .order_by()
    )
    return {(row["workload__workspace_id"], row["gpu_type"]): row["total"] for row in rows}


def _shown(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The objects a viewset's get_serializer() was given to show (none when it only parses a body)."""
    if not args or args[0] is None:
        return []
    return list(args[0]) if kwargs.get("many") else [args[0]]


class GPUQuotaSerializer(StrictModelSerializer):
    workspace = WorkspaceField()
    in_use = serializers.SerializerMethodField()

    class Meta:
        model = GPUQuota
        fields = ["id", "workspace", "gpu_type", "gpus", "borrowing_limit", "lending_limit", "in_use", "updated_at"]
        validators: list[Any] = []  # the action updates the (workspace, gpu_type) row in place

    def get_in_use(self, quota: GPUQuota) -> str:
        counted = self.context.setdefault("in_use_of", set())
        if quota.workspace_id not in counted:  # an object the viewset did not know it would show (a create)
            self.context.setdefault("in_use", {}).update(gpus_in_use([quota.workspace_id]))
            counted.add(quota.workspace_id)
        used = self.context["in_use"].get((quota.workspace_id, quota.gpu_type), Decimal("0"))
        return f"{used:.2f}"


class DiskEntrySerializer(serializers.Serializer):
    name = serializers.CharField(read_only=True)
    bytes = serializers.IntegerField(read_only=True)


class WorkspaceDiskSerializer(serializers.ModelSerializer):
    """What the workspace's disk on the local backend holds, as the portal last measured it."""

    largest = DiskEntrySerializer(many=True, read_only=True, help_text="Its largest top-level entries, largest first.")

    class Meta:
        model = WorkspaceDisk
        fields = ["size_bytes", "used_bytes", "largest", "complete", "note", "measured_at"]
        read_only_fields = fields


class WorkspaceSerializer(StrictModelSerializer):
    name = NameField()
    cohort = serializers.SlugRelatedField(
        slug_field="name", queryset=Cohort.objects.all(), required=False, allow_null=True
    )
    assigned_group = serializers.SlugRelatedField(
        slug_field="name", queryset=Group.objects.all(), required=False, allow_null=True
    )
    assigned_user = serializers.SlugRelatedField(
        slug_field="username", queryset=User.objects.all(), required=False, allow_null=True
    )
    allowed_profiles = serializers.SlugRelatedField(
        slug_field="name", queryset=ComputeProfile.objects.all(), many=True, required=False
    )
    allowed_gpu_types = serializers.ListField(
        child=serializers.RegexField(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$", max_length=32),
        max_length=50,
        required=False,
    )
    gpu_quotas = serializers.SerializerMethodField()
    disk = WorkspaceDiskSerializer(
        read_only=True,
        allow_null=True,
        help_text="Its disk on this machine (the local backend) as last measured; null before its first workload.",
    )
    my_role = serializers.SerializerMethodField()

    class Meta:
        model = Workspace
        fields = [
            "id", "name", "display_name", "description", "kind", "assignee_kind", "assigned_group",
            "assigned_user", "max_instances", "max_notebooks", "cpu_cores", "memory_gb", "disk_gb",
            "allowed_profiles", "allowed_gpu_types", "max_runtime_s", "max_idle_s", "can_borrow",
            "fair_share_weight", "cohort", "gpu_quotas", "disk", "my_role", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = ["kind"]

    def get_gpu_quotas(self, workspace: Workspace) -> list[dict[str, Any]]:
        quotas = workspace.gpu_quotas.all()
        return GPUQuotaSerializer(quotas, many=True, context=self.context).data  # type: ignore[return-value]

    def get_my_role(self, workspace: Workspace) -> str | None:
        roles = self.context.get("roles", {})
        return roles[workspace.pk] if workspace.pk in roles else role_in(self.context["request"].user, workspace)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        kind = attrs.get("assignee_kind", getattr(self.instance, "assignee_kind", ""))
        group = attrs.get("assigned_group", getattr(self.instance, "assigned_group", None))
        user = attrs.get("assigned_user", getattr(self.instance, "assigned_user", None))
        if kind in ("team", "department") and group is None:
            raise serializers.ValidationError({"assigned_group": f"Name the group of the {kind}."}, code=RULE)
        if kind == "user" and user is None:
            raise serializers.ValidationError({"assigned_user": "Name the user."}, code=RULE)
        return attrs


class WorkspaceFilter(django_filters.FilterSet):
    class Meta:
        model = Workspace
        fields = ["kind", "cohort__name", "can_borrow"]


class WorkspaceViewSet(TenantViewSet):
    """Workspaces you belong to (all of them for platform admins).

    Platform admins create workspaces and change limits, policies and quotas; owners may change
    the display name and description.
    """

    serializer_class = WorkspaceSerializer
    queryset = Workspace.objects.all()
    lookup_field = "name"
    filterset_class = WorkspaceFilter
    ordering_fields = ["name", "created_at"]
    change_role = MANAGE

    def base_queryset(self) -> Any:
        return Workspace.objects.select_related("cohort", "assigned_group", "assigned_user", "disk").prefetch_related(
            "allowed_profiles", Prefetch("gpu_quotas", queryset=GPUQuota.objects.order_by("gpu_type"))
        )

    def get_serializer(self, *args: Any, **kwargs: Any) -> Any:
        """Usage and roles for exactly the workspaces being shown, in a few queries for a whole page."""
        serializer = super().get_serializer(*args, **kwargs)
        ids = [w.pk for w in _shown(args, kwargs)]
        serializer.context.update(in_use=gpus_in_use(ids), in_use_of=set(ids), roles=roles_in(self.request.user, ids))
        return serializer

    def workspace_of(self, obj: Any) -> Workspace:
        return obj

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        if not self.request.user.is_staff:
            raise PermissionDenied("Only platform admins create shared workspaces; you have a private one.")
        serializer.instance = actions.do_create_workspace(**serializer.validated_data, **self.action_kwargs())

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        admin_only = set(serializer.validated_data) - OWNER_FIELDS
        if admin_only and not self.request.user.is_staff:
            raise PermissionDenied(f"Only platform admins change {', '.join(sorted(admin_only))}.")
        serializer.instance = actions.do_update_workspace(
            serializer.instance, **serializer.validated_data, **self.action_kwargs()
        )

    def perform_destroy(self, instance: Workspace) -> None:
        if not self.request.user.is_staff:
            raise PermissionDenied("Only platform admins delete workspaces.")
        actions.do_delete_workspace(instance, **self.action_kwargs())


class MembershipSerializer(StrictModelSerializer):
    workspace = WorkspaceField()
    user = serializers.SlugRelatedField(slug_field="username", queryset=User.objects.all())

    class Meta:
        model = Membership
        fields = ["id", "workspace", "user", "role", "created_at"]
        validators: list[Any] = []  # set_membership updates an existing row instead of failing

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.instance is not None and not isinstance(self.instance, list):
            self.fields["workspace"].read_only = True
            self.fields["user"].read_only = True


class MembershipViewSet(TenantViewSet):
    """Who may use a workspace and how: owners manage members; viewers only look."""

    serializer_class = MembershipSerializer
    queryset = Membership.objects.select_related("workspace", "user")
    filterset_fields = {"workspace__name": ["exact"], "user__username": ["exact"], "role": ["exact"]}
    change_role = MANAGE

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = serializer.validated_data
        self.require(data["workspace"])
        serializer.instance = actions.do_set_membership(
            data["workspace"], data["user"], data.get("role", "member"), **self.action_kwargs()
        )

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        membership = serializer.instance
        role = serializer.validated_data.get("role", membership.role)
        serializer.instance = actions.do_set_membership(
            membership.workspace, membership.user, role, **self.action_kwargs()
        )

    def perform_destroy(self, instance: Membership) -> None:
        actions.do_remove_membership(instance, **self.action_kwargs())


class GPUQuotaViewSet(TenantViewSet):
    """GPUs per type each workspace is guaranteed, may borrow and lends. Admins set them."""

    serializer_class = GPUQuotaSerializer
    queryset = GPUQuota.objects.select_related("workspace")
    filterset_fields = {"workspace__name": ["exact"], "gpu_type": ["exact"]}

    def get_serializer(self, *args: Any, **kwargs: Any) -> Any:
        """Usage for exactly the quotas being shown."""
        serializer = super().get_serializer(*args, **kwargs)
        ids = list({q.workspace_id for q in _shown(args, kwargs)})
        serializer.context.update(in_use=gpus_in_use(ids), in_use_of=set(ids))
        return serializer

    def _save(self, serializer: serializers.BaseSerializer, workspace: Workspace, gpu_type: str) -> None:
        if not self.request.user.is_staff:
            raise PermissionDenied("Only platform admins set quotas.")
        data = serializer.validated_data
        current = serializer.instance
        serializer.instance = actions.do_set_gpu_quota(
            workspace,
            gpu_type,
            gpus=data.get("gpus", getattr(current, "gpus", Decimal("0"))),
            borrowing_limit=data.get("borrowing_limit", getattr(current, "borrowing_limit", None)),
            lending_limit=data.get("lending_limit", getattr(current, "lending_limit", None)),
            **self.action_kwargs(),
        )

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = serializer.validated_data
        self._save(serializer, data["workspace"], data["gpu_type"])

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        quota = serializer.instance
        if set(serializer.validated_data) & {"workspace", "gpu_type"}:
            message = "Create a new quota to change its workspace or type."
            raise serializers.ValidationError({"gpu_type": message}, code=RULE)
        self._save(serializer, quota.workspace, quota.gpu_type)

    def perform_destroy(self, instance: GPUQuota) -> None:
        if not self.request.user.is_staff:
            raise PermissionDenied("Only platform admins set quotas.")
        actions.do_delete_gpu_quota(instance, **self.action_kwargs())


class CohortSerializer(StrictModelSerializer):
    name = NameField()
    workspaces = serializers.SerializerMethodField()

    class Meta:
        model = Cohort
        fields = ["id", "name", "description", "workspaces", "created_at"]

    def get_workspaces(self, cohort: Cohort) -> list[str]:
        return [w.name for w in cohort.workspaces.all()]


class CohortViewSet(PortalViewSet):
    """Groups of workspaces that lend each other idle GPU quota."""

    serializer_class = CohortSerializer
    queryset = Cohort.objects.none()  # for the schema; get_queryset() is the truth
    permission_classes = [IsAdminOrReadOnly]
    lookup_field = "name"
    ordering_fields = ["name"]

    def get_queryset(self) -> Any:
        visible = restrict(Workspace.objects.all(), self.request.user).only("name", "cohort_id").order_by("name")
        cohorts = Cohort.objects.prefetch_related(Prefetch("workspaces", queryset=visible))
        if self.request.user.is_staff:
            return cohorts
        return cohorts.filter(Q(workspaces__in=visible.values("pk"))).distinct()

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = actions.do_save_cohort(None, **serializer.validated_data, **self.action_kwargs())

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = actions.do_save_cohort(
            serializer.instance, **serializer.validated_data, **self.action_kwargs()
        )

    def perform_destroy(self, instance: Cohort) -> None:
        actions.do_delete_cohort(instance, **self.action_kwargs())
