from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group
from rest_framework import serializers

from apps.api.fields import NameField
from apps.api.strict import GPUCountField, StrictModelSerializer
from apps.api.views import IsAdminOrReadOnly, PortalViewSet
from apps.catalog import actions
from apps.catalog.models import ComputeProfile, NotebookProfile
from apps.errors import RULE
from apps.scheduling.limits import check_gpu_shape

PROFILE_FIELDS = ["id", "name", "display_name", "description", "published", "visible_to", "created_at", "updated_at"]


class ProfileSerializer(StrictModelSerializer):
    name = NameField()
    visible_to = serializers.SlugRelatedField(
        slug_field="name", queryset=Group.objects.all(), many=True, required=False
    )


class ComputeProfileSerializer(ProfileSerializer):
    size = serializers.CharField(source="size_label", read_only=True)
    gpu_count = GPUCountField(required=False)

    class Meta:
        model = ComputeProfile
        fields = [*PROFILE_FIELDS, "kind", "gpu_type", "gpu_count", "cpu_cores", "memory_gb", "size"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        gpu_count = attrs.get("gpu_count", getattr(self.instance, "gpu_count", 0))
        gpu_type = attrs.get("gpu_type", getattr(self.instance, "gpu_type", ""))
        try:
            check_gpu_shape(gpu_count, field="gpu_count")
        except Exception as exc:  # ActionError: report it as a field error
            raise serializers.ValidationError({"gpu_count": str(exc)}, code=RULE) from None
        if gpu_count and not gpu_type:
            raise serializers.ValidationError({"gpu_type": "A profile with GPUs names their type."}, code=RULE)
        if not gpu_count and gpu_type:
            message = "A profile with a GPU type has at least some GPU."
            raise serializers.ValidationError({"gpu_count": message}, code=RULE)
        return attrs


class NotebookProfileSerializer(ProfileSerializer):
    # An image reference's characters (registry/name:tag@digest), spelled out rather than "no white
    # space" so that the schema's pattern means the same in every regular expression dialect; one of
    # spaces alone is refused as what it is, not trimmed to a blank.
    image = serializers.RegexField(
        r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$",
        max_length=300,
        trim_whitespace=False,
        help_text="Container image for the Kubernetes backend (registry/name:tag).",
        error_messages={
            "invalid": "An image reference is letters, digits and . _ / : @ + - with no spaces, "
            "such as quay.io/jupyter/minimal-notebook."
        },
    )
    python_packages = serializers.ListField(child=serializers.CharField(max_length=200), max_length=200, required=False)

    class Meta:
        model = NotebookProfile
        fields = [*PROFILE_FIELDS, "image", "python_packages"]


class ProfileViewSet(PortalViewSet):
    permission_classes = [IsAdminOrReadOnly]
    lookup_field = "name"
    filterset_fields = ["published"]
    ordering_fields = ["name", "created_at"]

    def get_queryset(self) -> Any:
        model = self.get_serializer_class().Meta.model
        return model.objects.visible_to(self.request.user).prefetch_related("visible_to")

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        model = self.get_serializer_class().Meta.model
        serializer.instance = actions.do_save_profile(model(), **serializer.validated_data, **self.action_kwargs())

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = actions.do_save_profile(
            serializer.instance, **serializer.validated_data, **self.action_kwargs()
        )

    def perform_destroy(self, instance: Any) -> None:
        actions.do_delete_profile(instance, **self.action_kwargs())


class ComputeProfileViewSet(ProfileViewSet):
    """Admin-curated sizes users launch instances from. Users see the published ones open to them."""

    serializer_class = ComputeProfileSerializer
    filterset_fields = ["published", "kind", "gpu_type"]


class NotebookProfileViewSet(ProfileViewSet):
    """Notebook environments: an image for Kubernetes, Python packages for the local backend."""

    serializer_class = NotebookProfileSerializer
