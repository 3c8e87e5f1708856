"""Invitations by email through the API: `/api/v1/invitations/`. Anyone who can see a workspace sees
its invitations (the address, role and state: never the link); its owners invite, send again and
withdraw (DELETE: the row stays, withdrawn, for the record)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.fields import WorkspaceField
from apps.api.strict import StrictModelSerializer
from apps.api.views import TenantViewSet
from apps.invitations import actions
from apps.invitations.models import Invitation
from apps.workspaces.access import MANAGE


class InvitationSerializer(StrictModelSerializer):
    workspace = WorkspaceField()
    email = serializers.EmailField(max_length=254)
    invited_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    accepted_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    state = serializers.CharField(read_only=True)

    class Meta:
        model = Invitation
        fields = [
            "id",
            "workspace",
            "email",
            "role",
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


class InvitationViewSet(TenantViewSet):
    """Invite an email address to a workspace with a role: the portal mails a link that works once,
    for that address only, for `PORTAL_INVITATION_DAYS` days. Limited per user and per workspace,
    per hour (429 with Retry-After past it)."""

    serializer_class = InvitationSerializer
    queryset = Invitation.objects.select_related("workspace", "invited_by", "accepted_by")
    filterset_fields = {"workspace__name": ["exact"], "email": ["iexact"], "role": ["exact"]}
    http_method_names = ["get", "post", "delete", "head", "options"]
    change_role = MANAGE

    def _base_url(self) -> str:
        return self.request.build_absolute_uri("/")

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = serializer.validated_data
        self.require(data["workspace"])
        serializer.instance = actions.do_invite(
            data["workspace"],
            data["email"],
            data.get("role", "member"),
            base_url=self._base_url(),
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
