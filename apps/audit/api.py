from __future__ import annotations

import csv
import datetime as dt
import itertools
import json
from typing import Any

import django_filters
from django.db.models import Q
from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.views import APIView

from apps.api.negotiation import AnswerAsIs
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


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 moment, in UTC before it reaches the database: an offset the standard allows
    (up to 23:59) but PostgreSQL does not (past 15:59) then works; a moment before year 1 or after
    year 9999 in UTC is the earliest or latest there is."""

    def filter(self, qs: Any, value: Any) -> Any:
        if value:
            try:
                value = value.astimezone(dt.UTC)
            except OverflowError:
                value = (dt.datetime.min if value.year < 5000 else dt.datetime.max).replace(tzinfo=dt.UTC)
        return super().filter(qs, value)


class AuditEventFilter(django_filters.FilterSet):
    actor = django_filters.CharFilter(field_name="actor_name", help_text="the username that acted")
    created_at__gte = UtcDateTimeFilter(field_name="created_at", lookup_expr="gte", help_text="at or after (ISO 8601)")
    created_at__lt = UtcDateTimeFilter(field_name="created_at", lookup_expr="lt", help_text="before (ISO 8601)")

    class Meta:
        model = AuditEvent
        fields = {"action": ["exact", "startswith"], "workspace__name": ["exact"], "target_type": ["exact"]}


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """Who changed what, when and from where: your workspaces' events (everything, for admins)."""

    serializer_class = AuditEventSerializer
    queryset = AuditEvent.objects.none()  # for the schema; get_queryset() is the truth
    workspace_field = "workspace"  # for the `?workspace=` filter
    filterset_class = AuditEventFilter
    ordering_fields = ["created_at"]

    def get_queryset(self) -> Any:
        events = AuditEvent.objects.select_related("workspace")
        user = self.request.user
        if user.is_staff:
            return events
        return events.filter(Q(workspace__in=workspace_ids(user)) | Q(workspace__isnull=True, actor=user))


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_cell(value: Any) -> Any:
    """A cell as written: JSON for the data, and text that a spreadsheet would run as a formula
    (=, +, -, @ first) made inert with a leading apostrophe."""
    if isinstance(value, (dict, list)):
        value = json.dumps(value, sort_keys=True)
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


class AuditExportView(APIView):
    """Every audit event the list would show for the same filters (`action`, `action__startswith`,
    `workspace`, `target_type`, `actor`, `created_at__gte`, `created_at__lt`), at once and oldest
    first, as CSV (`?format=csv`, the default) or a JSON array (`?format=json`): for platform admins,
    every event; for others, their workspaces' and their own."""

    content_negotiation_class = AnswerAsIs  # `format` is read here, not by DRF's renderers

    @extend_schema(
        parameters=[OpenApiParameter("format", str, enum=["csv", "json"], description="csv (default) or json")],
        responses={(200, "text/csv"): OpenApiTypes.STR, (200, "application/json"): AuditEventSerializer(many=True)},
    )
    def get(self, request: Request) -> StreamingHttpResponse:
        chosen = request.query_params.get("format", "csv")
        if chosen not in ("csv", "json"):
            raise ValidationError({"format": ["Choose csv or json."]})
        listing = AuditEventViewSet(request=request, format_kwarg=None, action="list", kwargs={})
        events = listing.filter_queryset(listing.get_queryset()).order_by("created_at", "id")
        rows = (AuditEventSerializer(event).data for event in events.iterator(chunk_size=2000))
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        if chosen == "csv":
            writer = csv.DictWriter(_Echo(), fieldnames=AuditEventSerializer.Meta.fields)
            lines = itertools.chain(
                [writer.writeheader()],  # each write returns the line, for the response to send
                (writer.writerow({k: _csv_cell(v) for k, v in row.items()}) for row in rows),
            )
            response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
        else:
            response = StreamingHttpResponse(_json_array(rows), content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.{chosen}"'
        return response


def _json_array(rows: Any) -> Any:
    yield "["
    for n, row in enumerate(rows):
        yield ("," if n else "") + json.dumps(row)
    yield "]"
