from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from django.http import FileResponse
from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.fields import EnvField, NameField, RelativePathListField, WorkspaceField
from apps.api.strict import GPUCountField, StrictModelSerializer
from apps.api.views import TenantViewSet
from apps.catalog.models import ComputeProfile
from apps.compute.api import TargetClusterField, VisibleProfileField, WorkloadStatusMixin
from apps.jobs.api import ArtifactQuerySerializer, ArtifactSerializer, LogQuerySerializer
from apps.jobs.hosting import artifact_file
from apps.jobs.models import Artifact
from apps.rayclusters import actions
from apps.rayclusters.models import RayCluster
from apps.workloads import host
from apps.workloads.api import StartProgressMixin

# What a profile gives a role: its GPUs, CPU cores and memory (and the cluster's GPU type).
_SIZES = {"gpus": "gpu_count", "cpu_cores": "cpu_cores", "memory_gb": "memory_gb"}


@extend_schema_field({"type": "string", "nullable": True, "description": "A compute profile's name (null: none)."})
class ProfileNameField(VisibleProfileField):
    """A compute profile, by name, that sizes a role (written only: the sizes are read back)."""


class RayClusterSerializer(WorkloadStatusMixin, StartProgressMixin, StrictModelSerializer):
    workspace = WorkspaceField()
    name = NameField()
    env = EnvField(required=False)
    artifact_paths = RelativePathListField(required=False)
    gpu_type = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$", max_length=32, required=False, allow_blank=True
    )
    head_gpus = GPUCountField(required=False)
    worker_gpus = GPUCountField(required=False)
    # A compute profile instead of sizes: the head's or each worker's GPUs, CPU and memory.
    head_profile = ProfileNameField(ComputeProfile, required=False, allow_null=True, write_only=True)
    worker_profile = ProfileNameField(ComputeProfile, required=False, allow_null=True, write_only=True)
    cluster = TargetClusterField(required=False, allow_null=True)
    requested_cluster = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    dashboard_url = serializers.SerializerMethodField()
    artifacts = ArtifactSerializer(many=True, read_only=True)

    class Meta:
        model = RayCluster
        fields = [
            "id", "workspace", "name", "description", "workers", "gpu_type", "head_gpus", "head_cpu_cores",
            "head_memory_gb", "worker_gpus", "worker_cpu_cores", "worker_memory_gb", "head_profile",
            "worker_profile", "entrypoint", "image", "env", "artifact_paths", "max_runtime_s", "priority",
            "preemptible", "state", "failure_reason", "exit_code", "attempts", "nodes", "dashboard_url",
            "wait_reason", "workspace_queue_position", "cluster_queue_position", "estimated_start_at", "cluster",
            "requested_cluster", "created_by", "created_at", "admitted_at", "started_at", "finished_at", "artifacts",
            "start_progress",
        ]  # fmt: skip
        read_only_fields = ["state", "failure_reason", "exit_code", "attempts", "nodes", "admitted_at",
                            "started_at", "finished_at"]  # fmt: skip

    def get_dashboard_url(self, cluster: RayCluster) -> str | None:
        """Its dashboard and Jobs API, through the portal (with the portal's sign-in), while it runs."""
        running = cluster.state in (RayCluster.State.RUNNING, RayCluster.State.DEGRADED)
        return cluster.dashboard_url if running else None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for role in ("head", "worker"):
            profile = attrs.pop(f"{role}_profile", None)
            if profile is None:
                continue
            given = [f"{role}_{size}" for size in _SIZES if f"{role}_{size}" in attrs]
            if given:
                raise serializers.ValidationError({given[0]: f"Give the {role}'s size or its profile, not both."})
            for size, field in _SIZES.items():
                attrs[f"{role}_{size}"] = getattr(profile, field)
            if profile.gpu_count:
                if attrs.get("gpu_type", profile.gpu_type) != profile.gpu_type:
                    wrong = f"Profile {profile.name} has {profile.gpu_type} GPUs, not {attrs['gpu_type']}."
                    raise serializers.ValidationError({f"{role}_profile": wrong})
                attrs["gpu_type"] = profile.gpu_type
        return attrs


class RayClusterViewSet(TenantViewSet):
    """Ray clusters: a head and WORKERS workers, each of its own size (or a compute profile's),
    admitted all together under the workspace's quota. With an `entrypoint`, a fire-and-forget
    Ray job: it runs once every node joined, and the cluster ends with it (its exit code, its
    artifacts). Reach the dashboard and Ray's Jobs API at `dashboard_url` with a portal token
    (`Authorization: Bearer ...`). Delete a cluster to stop it."""

    serializer_class = RayClusterSerializer
    queryset = RayCluster.objects.all()
    workload_tokens_may_change = True  # a workload's own token may create and delete clusters
    http_method_names = ["get", "post", "delete", "head", "options"]
    filterset_fields = {"workspace__name": ["exact"], "state": ["exact", "in"], "name": ["exact"]}
    ordering_fields = ["created_at", "priority", "state", "cluster_queue_position"]

    def base_queryset(self) -> Any:
        return RayCluster.objects.select_related(
            "workspace", "cluster", "requested_cluster", "created_by"
        ).prefetch_related("artifacts")

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = dict(serializer.validated_data)
        workspace = data.pop("workspace")
        self.require(workspace)
        cluster = actions.check_create_cluster(workspace, **data, **self.action_kwargs())
        cluster._prefetched_objects_cache = {"artifacts": Artifact.objects.none()}
        serializer.instance = cluster

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Stop the cluster (and the Ray jobs on it): 204 at once; its record stays, STOPPING until its
        processes are gone, then STOPPED."""
        cluster = self.get_object()
        self.require(cluster.workspace)
        actions.do_delete_cluster(cluster, **self.action_kwargs())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        parameters=[LogQuerySerializer],
        responses=inline_serializer(
            "RayClusterLog",
            {"replica": serializers.IntegerField(), "offset": serializers.IntegerField(),
             "text": serializers.CharField(), "state": serializers.CharField()},
        ),
    )  # fmt: skip
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str | None = None) -> Response:
        """The cluster's output from `offset` on: its nodes' start and, for a Ray job, its
        entrypoint's logs; follow it by passing back the `offset` each answer gives."""
        cluster = self.get_object()
        query = LogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        offset = query.validated_data["offset"]
        if query.validated_data["replica"] != 0:
            raise serializers.ValidationError({"replica": "A cluster has one log: replica 0."})
        data, offset = host.logs("raycluster", cluster, 0, offset)
        return Response(
            {"replica": 0, "offset": offset, "text": data.decode("utf-8", "replace"), "state": cluster.state}
        )

    @extend_schema(parameters=[ArtifactQuerySerializer], responses={(200, "application/octet-stream"): bytes})
    @action(detail=True, methods=["get"], url_path="artifact")
    def artifact(self, request: Request, pk: str | None = None) -> FileResponse:
        """Download one of the cluster's recorded artifacts, by its `path`."""
        cluster = self.get_object()
        query = ArtifactQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        path = query.validated_data["path"]
        opened = artifact_file(cluster, path)  # type: ignore[arg-type]
        if opened is None:
            raise NotFound("This cluster has no such artifact.")
        name = PurePosixPath(path).name
        return FileResponse(opened, as_attachment=True, filename=name, content_type="application/octet-stream")
