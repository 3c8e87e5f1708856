"""The API of workspaces' provisioning policies (``/api/v1/gpr-policies/``): how each workspace's
GPU provisioning requests are decided. Members read their workspace's (a workspace without one has
the portal's defaults, shown as such); platform admins set them."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.fields import WorkspaceField
from apps.api.strict import StrictModelSerializer
from apps.api.views import TenantViewSet
from apps.provisioning import actions
from apps.provisioning.models import MAX_GPUS, ProvisioningPolicy
from apps.workspaces.access import restrict
from apps.workspaces.models import Workspace

DAY = 86400


class PolicySerializer(StrictModelSerializer):
    workspace = WorkspaceField()
    auto_approve_max_s = serializers.IntegerField(
        min_value=0, max_value=366 * DAY, allow_null=True, required=False,
        help_text="Requests within the workspace's quota and at most this long are approved at once; null: an "
        "admin decides each.",
    )  # fmt: skip
    max_duration_s = serializers.IntegerField(min_value=600, max_value=366 * DAY)
    max_gpus = serializers.IntegerField(min_value=1, max_value=MAX_GPUS, allow_null=True, required=False)

    class Meta:
        model = ProvisioningPolicy
        fields = ["workspace", "auto_approve_max_s", "max_duration_s", "max_gpus", "updated_at"]
        read_only_fields = ["updated_at"]
        validators: list[Any] = []  # the action updates the workspace's row in place


class ProvisioningPolicyViewSet(TenantViewSet):
    """A workspace's policy for GPU provisioning requests, by workspace name: `GET` (the portal's
    defaults where it has none of its own), `PUT`/`PATCH` (platform admins)."""

    serializer_class = PolicySerializer
    queryset = ProvisioningPolicy.objects.select_related("workspace").order_by("workspace__name")
    ordering_fields = ["updated_at"]
    lookup_field = "workspace__name"
    lookup_url_kwarg = "workspace"
    http_method_names = ["get", "put", "patch", "head", "options"]

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        workspace = self._workspace(kwargs["workspace"])
        policy = actions.policy_of(workspace)
        own = ProvisioningPolicy.objects.filter(workspace=workspace).first()
        return Response({
            "workspace": workspace.name,
            "auto_approve_max_s": policy.auto_approve_max_s,
            "max_duration_s": policy.max_duration_s,
            "max_gpus": policy.max_gpus,
            "updated_at": own.updated_at if own else None,
            "defaults": own is None,
        })  # fmt: skip

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if not request.user.is_staff:
            raise PermissionDenied("Only platform admins set provisioning policies.")
        workspace = self._workspace(kwargs["workspace"])
        current = actions.policy_of(workspace)
        body = {"workspace": workspace.name, "auto_approve_max_s": current.auto_approve_max_s,
                "max_duration_s": current.max_duration_s, "max_gpus": current.max_gpus, **request.data}  # fmt: skip
        serializer = self.get_serializer(data=body)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        auto = data.get("auto_approve_max_s")
        actions.do_set_policy(
            workspace, auto_approve_max_s=auto or None, max_duration_s=data["max_duration_s"],
            max_gpus=data.get("max_gpus"), **self.action_kwargs(),
        )  # fmt: skip
        return self.retrieve(request, workspace=workspace.name)

    def _workspace(self, name: str) -> Workspace:
        from django.http import Http404

        found = restrict(Workspace.objects.filter(name=name), self.request.user).first()
        if found is None:
            raise Http404(f"No workspace {name}.")
        return found
