from __future__ import annotations

from typing import Any

from django.db.models import Q
from rest_framework import serializers, viewsets

from apps.api.strict import StrictModelSerializer
from apps.audit.models import AuditEvent
from apps.workspaces.access import workspace_ids


class AuditEventSerializer(StrictModelSerializer):
    actor = serializers.CharField(source="actor_name", read_only=True)
    workspace = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)

    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "actor", "action", "target_type", "target_id", "target_repr", "workspace",
                  "data", "via", "ip_address"]  # fmt: skip


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """Who changed what, when and from where: your workspaces' events (everything, for admins)."""

    serializer_class = AuditEventSerializer
    queryset = AuditEvent.objects.none()  # for the schema; get_queryset() is the truth
    workspace_field = "workspace"  # for the `?workspace=` filter
    filterset_fields = {"action": ["exact", "startswith"], "workspace__name": ["exact"], "target_type": ["exact"]}
    ordering_fields = ["created_at"]

    def get_queryset(self) -> Any:
        events = AuditEvent.objects.select_related("workspace")
        user = self.request.user
        if user.is_staff:
            return events
        return events.filter(Q(workspace__in=workspace_ids(user)) | Q(workspace__isnull=True, actor=user))
