"""Invitations by email through the API: `/api/v1/invitations/`. Anyone who can see a workspace sees
its invitations (the address, role or access, and state: never the link); its owners invite to the
workspace, its members to one of its instances (as a collaborator), and they send again and
withdraw (DELETE: the row stays, withdrawn, for the record)."""

from __future__ import annotations

from typing import Any

from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.fields import WorkspaceField
from apps.api.filters import IdFilter
from apps.api.strict import StrictModelSerializer
from apps.api.views import TenantViewSet
from apps.compute.api import InstanceRefField
from apps.compute.models import Collaborator
from apps.errors import RULE
from apps.invitations import actions
from apps.invitations.models import Invitation
from apps.workspaces.access import CHANGE, MANAGE
from apps.workspaces.models import Role, Workspace


class InvitationSerializer(StrictModelSerializer):
    workspace = WorkspaceField(required=False)
    instance = InstanceRefField(required=False, allow_null=True)
    email = serializers.EmailField(max_length=254)
    role = serializers.ChoiceField(choices=Role.choices, required=False)
    access = serializers.ChoiceField(choices=Collaborator.Access.choices, required=False)
    invited_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    accepted_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    state = serializers.CharField(read_only=True)

    class Meta:
        model = Invitation
        fields = [
            "id",
            "workspace",
            "instance",
            "email",
            "role",
            "access",
            "state",
            "invited_by",
            "created_at",
            "expires_at",
            "sent_at",
            "times_sent",
            "send_error",
            "accepted_at",
            "accepted_by",
            "withdrawn_at",
        ]
        read_only_fields = [
            "created_at",
            "expires_at",
            "sent_at",
            "times_sent",
            "send_error",
            "accepted_at",
            "withdrawn_at",
        ]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        instance = attrs.get("instance")
        if instance is not None:
            if "workspace" in attrs and attrs["workspace"] != instance.workspace:
                raise serializers.ValidationError(
                    {"instance": f"Instance {instance.name} is not in {attrs['workspace']}."}
                )
            if "role" in attrs:
                raise serializers.ValidationError(
                    {"role": "An invitation to an instance gives `access`, not a role."}, code=RULE
                )
            if "access" not in attrs:
                raise serializers.ValidationError({"access": "Give read or write."}, code=RULE)
            attrs["workspace"] = instance.workspace
        elif "workspace" not in attrs:
            raise serializers.ValidationError(
                {"workspace": "Give the workspace, or the instance, to invite to."}, code=RULE
            )
        elif "access" in attrs:
            raise serializers.ValidationError(
                {"access": "Access is for an invitation to an instance; give a role."}, code=RULE
            )
        return attrs

    def to_representation(self, invitation: Invitation) -> dict[str, Any]:
        data = super().to_representation(invitation)
        data["role" if invitation.instance_id is not None else "access"] = None
        return data


class InvitationFilter(filters.FilterSet):
    # By id, not a choice among instances: an id that matches none finds no invitation (not a 400).
    instance = IdFilter(field_name="instance_id")

    class Meta:
        model = Invitation
        fields = {"workspace__name": ["exact"], "email": ["iexact"], "role": ["exact"]}


class InvitationViewSet(TenantViewSet):
    """Invite an email address to a workspace with a role (`workspace`, `role`: for its owners), or
    to one of its instances with an access (`instance`, `access`: read or write, for its members):
    the portal mails a link that works once, for that address only, for `PORTAL_INVITATION_DAYS`
    days. Limited per user and per workspace, per hour (429 with Retry-After past it)."""

    serializer_class = InvitationSerializer
    queryset = Invitation.objects.select_related("workspace", "instance", "invited_by", "accepted_by")
    filterset_class = InvitationFilter
    http_method_names = ["get", "post", "delete", "head", "options"]
    change_role = MANAGE

    def _base_url(self) -> str:
        return self.request.build_absolute_uri("/")

    def require_for(self, workspace: Workspace, shared: bool) -> None:
        """An owner's role for the workspace; a member's for one of its instances."""
        self.require(workspace, CHANGE if shared else MANAGE)

    def check_object_permissions(self, request: Any, obj: Invitation) -> None:
        super(TenantViewSet, self).check_object_permissions(request, obj)
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            self.require_for(obj.workspace, obj.instance_id is not None)

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = serializer.validated_data
        instance = data.get("instance")
        self.require_for(data["workspace"], instance is not None)
        serializer.instance = actions.do_invite(
            data["workspace"],
            data["email"],
            data.get("role", "member"),
            base_url=self._base_url(),
            instance=instance,
            access=data.get("access", ""),
            **self.action_kwargs(),
        )

    def perform_destroy(self, instance: Invitation) -> None:
        actions.do_withdraw(instance, **self.action_kwargs())

    @extend_schema(request=None, responses=InvitationSerializer)
    @action(detail=True, methods=["post"])
    def resend(self, request: Request, pk: Any = None) -> Response:
        """Send the invitation again, with a new link (the old one stops working) and a new expiry."""
        invitation = self.get_object()
        done = actions.do_resend(invitation, base_url=self._base_url(), **self.action_kwargs())
        return Response(self.get_serializer(done).data)
