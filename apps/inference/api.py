"""The API of inference endpoints (``/api/v1/endpoints/``) and their profiles
(``/api/v1/inference-profiles/``, curated by admins)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts import api_tokens
from apps.accounts.models import ApiToken
from apps.api.fields import NameField, WorkspaceField
from apps.api.strict import GPUCountField, StrictModelSerializer
from apps.api.views import TenantViewSet
from apps.catalog.api import ProfileSerializer, ProfileViewSet
from apps.catalog.models import InferenceProfile
from apps.compute.api import TargetClusterField, VisibleProfileField
from apps.errors import RULE
from apps.inference import actions
from apps.inference.models import MAX_REPLICAS, Endpoint, Replica, Sample, ScaleEvent
from apps.scheduling.limits import check_gpu_shape
from apps.workloads import host
from apps.workloads.api import StartProgressMixin
from apps.workloads.models import Workload
from apps.workspaces.access import restrict
from workers.backends import servers


class InferenceProfileSerializer(ProfileSerializer):
    size = serializers.CharField(source="size_label", read_only=True)
    gpus = GPUCountField(required=False)
    server_args = serializers.ListField(child=serializers.CharField(max_length=500), max_length=100, required=False)
    image = serializers.RegexField(
        r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$", max_length=300, required=False, allow_blank=True,
        help_text="Container image for the Kubernetes backend (registry/name:tag).",
    )  # fmt: skip

    class Meta:
        model = InferenceProfile
        fields = [
            *["id", "name", "display_name", "description", "published", "visible_to", "created_at", "updated_at"],
            "server", "server_args", "image", "gpu_type", "gpus", "cpu_cores", "memory_gb", "size", "concurrency",
            "scale_up_after_s", "scale_down_after_s",
        ]  # fmt: skip

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        gpus = attrs.get("gpus", getattr(self.instance, "gpus", 0))
        gpu_type = attrs.get("gpu_type", getattr(self.instance, "gpu_type", ""))
        server = attrs.get("server", getattr(self.instance, "server", InferenceProfile.Server.LLAMACPP))
        try:
            check_gpu_shape(gpus, field="gpus")
        except Exception as exc:  # ActionError: a field error
            raise serializers.ValidationError({"gpus": str(exc)}, code=RULE) from None
        if gpus and not gpu_type:
            raise serializers.ValidationError({"gpu_type": "A profile with GPUs names their type."}, code=RULE)
        if not gpus and gpu_type:
            raise serializers.ValidationError({"gpus": "A profile with a GPU type has at least some GPU."}, code=RULE)
        if servers.SERVERS[server].needs_gpu and not gpus:
            raise serializers.ValidationError({"gpus": f"{servers.SERVERS[server].label} needs a GPU."}, code=RULE)
        problem = servers.check_extra_args(
            server, list(attrs.get("server_args", getattr(self.instance, "server_args", [])))
        )
        if problem:
            raise serializers.ValidationError({"server_args": problem}, code=RULE)
        return attrs


class InferenceProfileViewSet(ProfileViewSet):
    """What endpoints' replicas run: a server (llama.cpp's on CPU, vLLM on a GPU), its extra
    arguments, one replica's size, and how its endpoints scale. Admins curate them; users see
    the published ones open to them."""

    serializer_class = InferenceProfileSerializer
    filterset_fields = ["published", "server", "gpu_type"]


class ReplicaSerializer(StartProgressMixin, StrictModelSerializer):
    class Meta:
        model = Replica
        fields = ["id", "name", "version", "baseline", "state", "reason", "wait_reason", "cluster", "created_at",
                  "admitted_at", "started_at", "finished_at", "start_progress", "retiring_at",
                  "retire_reason"]  # fmt: skip
        read_only_fields = fields


class ScaleEventSerializer(StrictModelSerializer):
    class Meta:
        model = ScaleEvent
        fields = ["at", "from_replicas", "to_replicas", "reason"]
        read_only_fields = fields


class SampleSerializer(StrictModelSerializer):
    class Meta:
        model = Sample
        fields = ["at", "replicas", "serving", "waiting", "requests_per_s", "errors_per_s", "p50_s", "p95_s",
                  "tokens_per_s"]  # fmt: skip
        read_only_fields = fields


@extend_schema_field({"type": "integer", "nullable": True, "description": "A finished job's id."})
class SourceJobField(serializers.PrimaryKeyRelatedField):
    """A finished job (or Ray job) of a workspace the user can see, by id."""

    default_error_messages = {
        "does_not_exist": "No job {pk_value} is visible to you.",
        "incorrect_type": "Give a job's id.",
    }

    def get_queryset(self) -> Any:
        return restrict(Workload.objects.filter(kind__in=("job", "raycluster")), self.context["request"].user)


@extend_schema_field({"type": "string", "description": "An inference profile's name."})
class InferenceProfileField(VisibleProfileField):
    """An inference profile, by name, among those the user can see."""


class EndpointSerializer(StrictModelSerializer):
    workspace = WorkspaceField()
    name = NameField()
    profile = VisibleProfileField(InferenceProfile)
    path = serializers.CharField(
        source="model_path", max_length=1000, required=False, allow_blank=True,
        help_text="The model: a path relative to the workspace's directory (a GGUF file for llama.cpp, a Hugging "
        "Face model directory for vLLM). Or give source_job and artifact; read back, where the model is.",
    )  # fmt: skip
    source_job = SourceJobField(required=False, allow_null=True, help_text="A finished job whose artifact it serves.")
    artifact = serializers.CharField(
        source="source_artifact", max_length=1000, required=False, allow_blank=True,
        help_text="The job's artifact to serve: a file it left, or a directory of them (model/).",
    )  # fmt: skip
    min_replicas = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, required=False)
    max_replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, required=False)
    scale_to_zero_s = serializers.IntegerField(min_value=0, required=False, allow_null=True)
    cluster = TargetClusterField(required=False, allow_null=True, write_only=True)
    url = serializers.CharField(read_only=True)
    replicas = serializers.SerializerMethodField()
    serving = serializers.SerializerMethodField()

    class Meta:
        model = Endpoint
        fields = [
            "id", "workspace", "name", "description", "profile", "source", "path", "source_job", "artifact",
            "min_replicas", "max_replicas", "scale_to_zero_s", "version", "desired_replicas",
            "replicas", "serving", "state", "failure_reason", "url", "cluster", "last_request_at", "created_by",
            "created_at", "finished_at",
        ]  # fmt: skip
        read_only_fields = ["source", "version", "desired_replicas", "state", "failure_reason",
                            "last_request_at", "created_by", "created_at", "finished_at"]  # fmt: skip

    def get_replicas(self, endpoint: Endpoint) -> list[dict[str, Any]]:
        live = [r for r in endpoint.replicas.all() if r.state not in Replica.FINAL_STATES]
        return ReplicaSerializer(live, many=True).data  # type: ignore[return-value]

    def get_serving(self, endpoint: Endpoint) -> int:
        return sum(1 for r in endpoint.replicas.all() if r.state == Replica.State.READY)


class EndpointUpdateSerializer(serializers.Serializer):
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    min_replicas = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, required=False)
    max_replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, required=False)
    scale_to_zero_s = serializers.IntegerField(min_value=0, required=False, allow_null=True)
    profile = InferenceProfileField(InferenceProfile, required=False)
    path = serializers.CharField(max_length=1000, required=False, allow_blank=True)
    source_job = SourceJobField(required=False, allow_null=True)
    artifact = serializers.CharField(max_length=1000, required=False, allow_blank=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(self.initial_data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError({name: "Unknown field." for name in sorted(unknown)})
        return attrs


class EndpointTokenSerializer(serializers.Serializer):
    name = serializers.RegexField(
        r"^[\w .:@/+-]{1,100}$",
        max_length=100,
        required=False,
        help_text="what the token is for (default: its endpoint)",
    )
    expires_in_days = serializers.IntegerField(min_value=1, max_value=365, required=False)


class EndpointViewSet(TenantViewSet):
    """Inference endpoints: a model served at a stable `url` (the OpenAI API: POST
    `<url>/chat/completions`, `<url>/completions`) by replicas of a profile's server, between
    `min_replicas` and `max_replicas`, each admitted under the workspace's quota. Serve a path of
    the workspace's directory (`path`) or a finished job's artifact (`source_job`, `artifact`).
    PATCH changes the bounds, or what it serves (rolled out without a failed request). Call it with
    a token made for it (POST `<id>/tokens/`) or any portal token of a member."""

    serializer_class = EndpointSerializer
    queryset = Endpoint.objects.all()
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    filterset_fields = {"workspace__name": ["exact"], "state": ["exact", "in"], "name": ["exact"]}
    ordering_fields = ["created_at", "name", "state"]

    def base_queryset(self) -> Any:
        return Endpoint.objects.select_related("workspace", "profile", "created_by").prefetch_related("replicas")

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = dict(serializer.validated_data)
        workspace = data.pop("workspace")
        self.require(workspace)
        endpoint = actions.check_create_endpoint(
            workspace,
            name=data["name"],
            profile=data["profile"],
            path=data.get("model_path", ""),
            job=data.get("source_job"),
            artifact=data.get("source_artifact", ""),
            min_replicas=data.get("min_replicas", 1),
            max_replicas=data.get("max_replicas", max(1, data.get("min_replicas", 1))),
            scale_to_zero_s=data.get("scale_to_zero_s"),
            description=data.get("description", ""),
            requested_cluster=data.get("cluster"),
            **self.action_kwargs(),
        )
        serializer.instance = Endpoint.objects.prefetch_related("replicas").get(pk=endpoint.pk)

    @extend_schema(request=EndpointUpdateSerializer, responses=EndpointSerializer)
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        endpoint = self.get_object()
        self.require(endpoint.workspace)
        update = EndpointUpdateSerializer(data=request.data, context=self.get_serializer_context())
        update.is_valid(raise_exception=True)
        data = dict(update.validated_data)
        model = None
        if any(name in data for name in ("path", "source_job", "artifact", "profile")):
            model = {"path": data.get("path", ""), "job": data.get("source_job"), "artifact": data.get("artifact", ""),
                     "profile": data.get("profile")}  # fmt: skip
            if not model["path"] and model["job"] is None:
                model["path"] = endpoint.model_path  # a new profile for the same model
        kwargs_: dict[str, Any] = {}
        if "scale_to_zero_s" in data:
            kwargs_["scale_to_zero_s"] = data["scale_to_zero_s"]
        actions.do_update_endpoint(
            endpoint,
            min_replicas=data.get("min_replicas"),
            max_replicas=data.get("max_replicas"),
            description=data.get("description"),
            model=model,
            **kwargs_,
            **self.action_kwargs(),
        )
        return Response(self.get_serializer(self.base_queryset().get(pk=endpoint.pk)).data)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Stop every replica: 204 at once; the endpoint is DELETING until they stopped, then DELETED."""
        endpoint = self.get_object()
        self.require(endpoint.workspace)
        actions.do_delete_endpoint(endpoint, **self.action_kwargs())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=ScaleEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        """Its scaling decisions, newest first, each with its reason (the last 200)."""
        endpoint = self.get_object()
        return Response(ScaleEventSerializer(endpoint.scale_events.all()[:200], many=True).data)

    @extend_schema(responses=SampleSerializer(many=True))
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        """Its figures over the last day, oldest first: replicas, requests per second, p50 and p95
        latency, errors, tokens per second."""
        endpoint = self.get_object()
        samples = endpoint.samples.order_by("-at")[:8640]
        return Response(SampleSerializer(reversed(list(samples)), many=True).data)

    @extend_schema(
        request=EndpointTokenSerializer,
        responses=inline_serializer("NewEndpointToken", {"id": serializers.IntegerField(),
                                    "token": serializers.CharField(), "expires_at": serializers.DateTimeField()}),
    )  # fmt: skip
    @action(detail=True, methods=["post"])
    def tokens(self, request: Request, pk: str | None = None) -> Response:
        """Make a token for calling this endpoint alone (shown once; the tokens page lists and
        revokes it). It opens nothing else: not the portal's API, not another endpoint."""
        endpoint = self.get_object()
        self.require(endpoint.workspace)
        if endpoint.is_final:
            raise NotFound("This endpoint has ended.")
        given = EndpointTokenSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        token, text = api_tokens.do_create_token(
            request.user,
            name=given.validated_data.get("name", f"calls endpoint {endpoint.name}"),
            expires_in_days=given.validated_data.get("expires_in_days", api_tokens.default_days_for(request.user)),
            scope=ApiToken.Scope.READ,
            endpoint=endpoint,
            limited=True,
            **self.action_kwargs(),
        )
        return Response({"id": token.pk, "token": text, "expires_at": token.expires_at})

    @extend_schema(
        responses=inline_serializer("ReplicaLog", {"replica": serializers.IntegerField(),
                                    "offset": serializers.IntegerField(), "text": serializers.CharField()}),
    )  # fmt: skip
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str | None = None) -> Response:
        """A replica's server log from `offset` on (`replica`: its id; default the newest)."""
        endpoint = self.get_object()
        replicas = Replica.objects.filter(endpoint=endpoint).select_related("cluster")
        wanted = request.query_params.get("replica", "")
        try:
            replica = replicas.get(pk=int(wanted)) if wanted else replicas.order_by("-pk").first()
            offset = max(0, int(request.query_params.get("offset", "0")))
        except (ValueError, Replica.DoesNotExist):
            raise serializers.ValidationError({"replica": "Give the id of one of this endpoint's replicas."}) from None
        if replica is None:
            return Response({"replica": None, "offset": 0, "text": ""})
        data, offset = host.logs("replica", replica, 0, offset)
        return Response({"replica": replica.pk, "offset": offset, "text": data.decode("utf-8", "replace")})
