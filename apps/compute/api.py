from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.fields import NameField, WorkspaceField
from apps.api.filters import IdFilter
from apps.api.negotiation import AnswerAsIs
from apps.api.strict import GPUCountField, StrictModelSerializer
from apps.api.views import TenantViewSet
from apps.catalog.models import ComputeProfile, NotebookProfile
from apps.compute import actions, collaborators
from apps.compute.kubeconfig import read_kubeconfig
from apps.compute.models import Collaborator, Instance, Notebook
from apps.inventory.models import Cluster
from apps.names import DNS_LABEL_RE
from apps.workloads.api import StartProgressMixin
from apps.workspaces.access import USE, may, restrict


class VisibleProfileField(serializers.SlugRelatedField):
    """A profile by name, among those the requesting user can see."""

    default_error_messages = {
        "does_not_exist": "No profile named {value} is available to you.",
        "invalid": "Give a profile's name.",
    }

    def __init__(self, model: type[ComputeProfile] | type[NotebookProfile], **kwargs: Any):
        self.model = model
        super().__init__(slug_field="name", **kwargs)

    def get_queryset(self) -> Any:
        return self.model.objects.visible_to(self.context["request"].user)


@extend_schema_field({"type": "string", "pattern": DNS_LABEL_RE.pattern.replace("\\Z", "$"), "nullable": True})
class TargetClusterField(serializers.SlugRelatedField):
    """An enabled cluster, by name, that a new job or instance must run on.

    Read back, it is where it runs (or ran) once admitted, and where it was asked to run while it waits.
    """

    default_error_messages = {
        "does_not_exist": "No cluster is named {value}.",
        "disabled": "Cluster {value} is disabled.",
        "invalid": "Give a cluster's name.",
    }

    def __init__(self, **kwargs: Any):
        super().__init__(slug_field="name", queryset=Cluster.objects.all(), source="requested_cluster", **kwargs)

    def to_internal_value(self, data: Any) -> Cluster:
        if not isinstance(data, str) or not DNS_LABEL_RE.fullmatch(data):
            self.fail("invalid")
        cluster = Cluster.objects.filter(name=data).first()
        if cluster is None:
            self.fail("does_not_exist", value=data)
        if not cluster.enabled:
            self.fail("disabled", value=data)
        return cluster

    def get_attribute(self, instance: Any) -> Cluster | None:
        return instance.cluster if instance.cluster_id else instance.requested_cluster


class WorkloadStatusMixin(serializers.Serializer):
    """Where a queued workload stands: its reason, queue positions and estimated start."""

    wait_reason = serializers.CharField(read_only=True)
    workspace_queue_position = serializers.IntegerField(read_only=True, allow_null=True)
    cluster_queue_position = serializers.IntegerField(read_only=True, allow_null=True)
    estimated_start_at = serializers.DateTimeField(read_only=True, allow_null=True)
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)


ERROR = {"$ref": "#/components/schemas/Error"}


class InstanceSerializer(WorkloadStatusMixin, StartProgressMixin, StrictModelSerializer):
    workspace = WorkspaceField()
    name = NameField()
    profile = VisibleProfileField(ComputeProfile)
    size = serializers.CharField(source="profile.size_label", read_only=True)
    cluster = TargetClusterField(required=False, allow_null=True)
    requested_cluster = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    running_for_s = serializers.SerializerMethodField()
    gpus_per_replica = GPUCountField(read_only=True)

    class Meta:
        model = Instance
        fields = [
            "id", "workspace", "name", "description", "profile", "size", "state", "failure_reason", "stop_reason",
            "gpu_type", "gpus_per_replica", "cpu_cores", "memory_gb", "wait_reason", "workspace_queue_position",
            "cluster_queue_position", "estimated_start_at", "cluster", "requested_cluster", "created_by", "launched_at",
            "admitted_at",
            "started_at", "finished_at", "running_for_s", "start_progress",
        ]  # fmt: skip
        read_only_fields = ["state", "failure_reason", "stop_reason", "gpu_type", "gpus_per_replica", "cpu_cores",
                            "memory_gb", "admitted_at", "started_at", "finished_at"]  # fmt: skip

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.instance is not None and not isinstance(self.instance, list):
            for name in ("workspace", "name", "profile", "cluster"):
                self.fields[name].read_only = True

    def get_running_for_s(self, instance: Instance) -> int | None:
        running = instance.running_for
        return int(running.total_seconds()) if running is not None else None


class InstanceViewSet(TenantViewSet):
    """Compute instances: launched from a profile, queued until the scheduler admits them."""

    serializer_class = InstanceSerializer
    queryset = Instance.objects.all()
    workload_tokens_may_change = True  # a workload's own token may change these (apps/api/permissions.py)
    filterset_fields = {"workspace__name": ["exact"], "state": ["exact", "in"], "name": ["exact"]}
    ordering_fields = ["created_at", "name", "state"]

    def base_queryset(self) -> Any:
        return Instance.objects.select_related("workspace", "profile", "cluster", "requested_cluster", "created_by")

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = dict(serializer.validated_data)
        workspace = data.pop("workspace")
        self.require(workspace)
        serializer.instance = actions.check_launch_instance(workspace, **data, **self.action_kwargs())

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = actions.do_update_instance(
            serializer.instance, **serializer.validated_data, **self.action_kwargs()
        )

    def perform_destroy(self, instance: Instance) -> None:
        actions.do_delete_instance(instance, **self.action_kwargs())

    @extend_schema(
        responses={
            (200, "application/yaml"): OpenApiResponse(OpenApiTypes.STR, description="The kubeconfig."),
            (404, "application/json"): OpenApiResponse(ERROR, description="Not found, not yours, or no kubeconfig."),
            (409, "application/json"): OpenApiResponse(ERROR, description="Not running, or being issued."),
        }
    )
    @action(detail=True, methods=["get"], content_negotiation_class=AnswerAsIs)
    def kubeconfig(self, request: Request, pk: str | None = None) -> HttpResponse:
        """The instance's kubeconfig (YAML), for its workspace's members (not viewers) and its
        read-write collaborators, where its
        backend has one (a Kubernetes namespace or vcluster instance): 404 where it has none, 409
        while the instance does not run or its kubeconfig is being issued."""
        instance = self.get_object()
        self.require_on(instance, USE)
        response = HttpResponse(read_kubeconfig(instance), content_type="application/yaml")
        response["Content-Disposition"] = f'attachment; filename="{instance.workspace.name}-{instance.name}.kubeconfig"'
        response["Cache-Control"] = "no-store"  # a credential
        return response


class InstanceRefField(serializers.PrimaryKeyRelatedField):
    def __init__(self, **kwargs: Any):
        kwargs.setdefault("pk_field", serializers.IntegerField())  # else the ORM reads 1.5 as instance 1
        super().__init__(**kwargs)

    def get_queryset(self) -> Any:
        return restrict(Instance.objects.all(), self.context["request"].user)


class NotebookSerializer(StartProgressMixin, StrictModelSerializer):
    workspace = serializers.SlugRelatedField(slug_field="name", read_only=True)
    instance = InstanceRefField()
    name = NameField()
    profile = VisibleProfileField(NotebookProfile)
    access_token = serializers.SerializerMethodField()

    class Meta:
        model = Notebook
        fields = [
            "id", "workspace", "instance", "name", "description", "profile", "state", "failure_reason", "stop_reason",
            "url", "access_token", "created_at", "started_at", "stopped_at", "start_progress",
        ]  # fmt: skip
        read_only_fields = ["state", "failure_reason", "stop_reason", "url", "started_at", "stopped_at"]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.instance is not None and not isinstance(self.instance, list):
            for name in ("instance", "name", "profile"):
                self.fields[name].read_only = True

    def get_access_token(self, notebook: Notebook) -> str | None:
        """The notebook's secret, for who may use it (members, read-write collaborators): viewers
        and read-only collaborators see that it exists, not how to open it."""
        allowed = self.context.setdefault("_may_open", {})
        if notebook.instance_id not in allowed:  # the same answer for every notebook of an instance
            allowed[notebook.instance_id] = may(self.context["request"].user, notebook, USE)
        return notebook.access_token if allowed[notebook.instance_id] else None


class NotebookFilter(filters.FilterSet):
    # By id, not a choice among instances: an id that matches none finds no notebook (not a 400).
    instance = IdFilter(field_name="instance_id")

    class Meta:
        model = Notebook
        fields = {"workspace__name": ["exact"], "state": ["exact", "in"]}


class NotebookViewSet(TenantViewSet):
    """Jupyter notebooks running on an instance."""

    serializer_class = NotebookSerializer
    queryset = Notebook.objects.all()
    workload_tokens_may_change = True  # a workload's own token may change these (apps/api/permissions.py)
    # Changing or stopping a notebook takes its use: a member's role, or write access to its instance.
    object_role = USE
    filterset_class = NotebookFilter
    ordering_fields = ["created_at", "name", "state"]

    def base_queryset(self) -> Any:
        # Its instance: what a pending notebook's start waits for (start_progress).
        return Notebook.objects.select_related("workspace", "profile", "instance")

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = dict(serializer.validated_data)
        instance = data.pop("instance")
        self.require_on(instance, USE)
        serializer.instance = actions.check_launch_notebook(
            instance.workspace, instance=instance, **data, **self.action_kwargs()
        )

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = actions.do_update_notebook(
            serializer.instance, **serializer.validated_data, **self.action_kwargs()
        )

    def perform_destroy(self, instance: Notebook) -> None:
        actions.do_delete_notebook(instance, **self.action_kwargs())

    @extend_schema(request=None, responses=NotebookSerializer)
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str | None = None) -> Response:
        """Start a stopped notebook again (culled when idle, or stopped by someone): on its
        instance, at its own address, its files where they were. 409 unless it is stopped."""
        notebook = self.get_object()
        self.require_on(notebook, USE)
        started = actions.do_start_notebook(notebook, **self.action_kwargs())
        return Response(self.get_serializer(started).data)


class CollaboratorSerializer(StrictModelSerializer):
    instance = serializers.PrimaryKeyRelatedField(read_only=True)
    workspace = serializers.SlugRelatedField(source="instance.workspace", slug_field="name", read_only=True)
    user = serializers.SlugRelatedField(slug_field="username", read_only=True)
    added_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    access = serializers.ChoiceField(choices=Collaborator.Access.choices)

    class Meta:
        model = Collaborator
        fields = ["id", "instance", "workspace", "user", "access", "added_by", "created_at"]
        read_only_fields = ["created_at"]


class CollaboratorFilter(filters.FilterSet):
    instance = IdFilter(field_name="instance_id")

    class Meta:
        model = Collaborator
        fields = {"instance__workspace__name": ["exact"], "user__username": ["exact"], "access": ["exact"]}


class CollaboratorViewSet(TenantViewSet):
    """Those an instance is shared with, and how (read or write). They come in by invitation
    (`POST /api/v1/invitations/` with `instance` and `access`); the instance's workspace members
    change their access (PATCH) and remove them (DELETE), which takes effect at once. Those it is
    shared with see who else it is shared with."""

    serializer_class = CollaboratorSerializer
    queryset = Collaborator.objects.all()
    filterset_class = CollaboratorFilter
    ordering_fields = ["created_at"]
    http_method_names = ["get", "patch", "delete", "head", "options"]
    workspace_field = "instance__workspace"

    def base_queryset(self) -> Any:
        return Collaborator.objects.select_related("instance__workspace", "user", "added_by")

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        row = serializer.instance
        access = serializer.validated_data.get("access", row.access)
        serializer.instance = collaborators.do_set_collaborator(row.instance, row.user, access, **self.action_kwargs())

    def perform_destroy(self, instance: Collaborator) -> None:
        collaborators.do_remove_collaborator(instance, **self.action_kwargs())
