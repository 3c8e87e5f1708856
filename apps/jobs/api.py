from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from django.db.models import Prefetch
from django.http import FileResponse
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.fields import EnvField, NameField, RelativePathListField, WorkspaceField
from apps.api.strict import GPUCountField, StrictModelSerializer
from apps.api.views import TenantViewSet
from apps.compute.api import TargetClusterField, WorkloadStatusMixin
from apps.jobs import actions
from apps.jobs.hosting import artifact_file
from apps.jobs.models import Artifact, Job, JobAttempt
from apps.workloads import host
from apps.workloads.api import StartProgressMixin


class JobAttemptSerializer(StrictModelSerializer):
    class Meta:
        model = JobAttempt
        fields = ["number", "started_at", "finished_at", "exit_code", "outcome", "reason"]


class ArtifactSerializer(StrictModelSerializer):
    class Meta:
        model = Artifact
        fields = ["path", "size_bytes", "sha256", "created_at"]


class LogQuerySerializer(serializers.Serializer):
    replica = serializers.IntegerField(min_value=0, max_value=1023, default=0)
    offset = serializers.IntegerField(min_value=0, max_value=2**62, default=0)


class ArtifactQuerySerializer(serializers.Serializer):
    path = serializers.CharField(max_length=1000)


class JobSerializer(WorkloadStatusMixin, StartProgressMixin, StrictModelSerializer):
    workspace = WorkspaceField()
    name = NameField()
    env = EnvField(required=False)
    artifact_paths = RelativePathListField(required=False)
    # Empty for a job without GPUs.
    gpu_type = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$", max_length=32, required=False, allow_blank=True
    )
    gpus_per_replica = GPUCountField(required=False)
    cluster = TargetClusterField(required=False, allow_null=True)
    requested_cluster = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    attempt_history = JobAttemptSerializer(source="attempt_set", many=True, read_only=True)
    artifacts = ArtifactSerializer(many=True, read_only=True)

    class Meta:
        model = Job
        fields = [
            "id", "workspace", "name", "description", "command", "image", "env", "gpu_type", "gpus_per_replica",
            "replicas", "cpu_cores", "memory_gb", "priority", "preemptible", "checkpointable", "max_runtime_s",
            "artifact_paths", "state", "failure_reason", "exit_code", "attempts", "progress", "wait_reason",
            "workspace_queue_position", "cluster_queue_position", "estimated_start_at", "cluster", "requested_cluster",
            "created_by", "created_at", "admitted_at", "started_at", "finished_at", "attempt_history", "artifacts",
            "artifacts_note", "start_progress",
        ]  # fmt: skip
        read_only_fields = ["state", "failure_reason", "exit_code", "attempts", "progress", "admitted_at",
                            "started_at", "finished_at", "artifacts_note"]  # fmt: skip


class JobViewSet(TenantViewSet):
    """GPU jobs: a command or image on GPUS_PER_REPLICA x REPLICAS GPUs, admitted as a gang.

    A queued job carries why it waits, its positions in its workspace's and the cluster's
    queue, and an estimated start. Jobs are not edited once submitted: cancel and resubmit.
    """

    serializer_class = JobSerializer
    queryset = Job.objects.all()
    workload_tokens_may_change = True  # a workload's own token may submit and cancel jobs (apps/api/permissions.py)
    http_method_names = ["get", "post", "head", "options"]
    filterset_fields = {"workspace__name": ["exact"], "state": ["exact", "in"], "name": ["exact"]}
    ordering_fields = ["created_at", "priority", "state", "cluster_queue_position"]

    def base_queryset(self) -> Any:
        return Job.objects.select_related("workspace", "cluster", "requested_cluster", "created_by").prefetch_related(
            Prefetch("attempt_set", queryset=JobAttempt.objects.order_by("number")), "artifacts"
        )

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = dict(serializer.validated_data)
        workspace = data.pop("workspace")
        self.require(workspace)
        job = actions.check_submit_job(workspace, **data, **self.action_kwargs())
        # A new job has no attempts and no artifacts yet: answer without asking the database.
        job._prefetched_objects_cache = {"attempt_set": JobAttempt.objects.none(), "artifacts": Artifact.objects.none()}
        serializer.instance = job

    @extend_schema(
        parameters=[LogQuerySerializer],
        responses=inline_serializer(
            "JobLog",
            {"replica": serializers.IntegerField(), "offset": serializers.IntegerField(),
             "text": serializers.CharField(), "state": serializers.CharField()},
        ),
    )  # fmt: skip
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str | None = None) -> Response:
        """The job's output from `offset` on (stdout and stderr of one replica); follow it by passing
        back the `offset` each answer gives."""
        job = self.get_object()
        query = LogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        replica, offset = query.validated_data["replica"], query.validated_data["offset"]
        if replica >= job.replicas:
            raise serializers.ValidationError({"replica": f"This job has {job.replicas} replica(s), from 0."})
        data, offset = host.logs("job", job, replica, offset)
        return Response(
            {"replica": replica, "offset": offset, "text": data.decode("utf-8", "replace"), "state": job.state}
        )

    @extend_schema(parameters=[ArtifactQuerySerializer], responses={(200, "application/octet-stream"): bytes})
    @action(detail=True, methods=["get"], url_path="artifact")
    def artifact(self, request: Request, pk: str | None = None) -> FileResponse:
        """Download one of the job's recorded artifacts, by its `path`."""
        job = self.get_object()
        query = ArtifactQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        path = query.validated_data["path"]
        opened = artifact_file(job, path)
        if opened is None:
            raise NotFound("This job has no such artifact.")
        name = PurePosixPath(path).name
        return FileResponse(opened, as_attachment=True, filename=name, content_type="application/octet-stream")

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel a queued or running job; its GPUs are released."""
        job = self.get_object()
        self.require(job.workspace)
        job = actions.do_cancel_job(job, **self.action_kwargs())
        return Response(self.get_serializer(self.base_queryset().get(pk=job.pk)).data)
