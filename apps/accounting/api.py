"""`GET /api/v1/usage/`: GPU-hours per month and workspace, user and GPU type, as JSON or CSV.

Platform admins see every workspace's usage; anyone else, that of the workspaces they own. A
workspace they do not own, or that does not exist, gives no rows, as the `workspace` filter of
every list does.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounting.queries import GROUPS, MONTH_PATTERN, Month, UsageReport, UsageRow, usage_report
from apps.api.negotiation import AnswerAsIs

FORMATS = ("json", "csv")
CSV_COLUMNS = ("month", "workspace", "user", "gpu_type", "gpu_hours", "gpu_seconds", "measured_gpu_hours")


class GroupByField(serializers.CharField):
    """A comma-separated list of GROUPS ("" for none: totals per month)."""

    def to_internal_value(self, data: Any) -> tuple[str, ...]:
        text = super().to_internal_value(data)
        chosen = [part for part in text.split(",") if part] if text else []
        wrong = sorted({part for part in chosen if part not in GROUPS})
        if wrong or (text and not chosen):
            raise serializers.ValidationError(
                f"Not a choice: {', '.join(wrong) or repr(text)}. Choose among: {', '.join(GROUPS)}.", code="invalid"
            )
        return tuple(name for name in GROUPS if name in chosen)


class UsageQuerySerializer(serializers.Serializer):
    """The report's query parameters."""

    month = serializers.RegexField(
        MONTH_PATTERN,
        required=False,
        error_messages={"invalid": "Give a month as YYYY-MM (01 to 12), such as 2026-11."},
    )
    # A name as the workspaces' list filter takes it: no trimming, and "" matches no workspace.
    workspace = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    group_by = GroupByField(required=False, allow_blank=True, trim_whitespace=False, default=GROUPS)
    format = serializers.ChoiceField(choices=FORMATS, required=False, default="json")

    def validate_month(self, value: str) -> Month:
        return Month.parse(value)


class UsageRowSerializer(serializers.Serializer):
    month = serializers.CharField(help_text="YYYY-MM, in UTC")
    workspace = serializers.CharField(allow_null=True, help_text="null when not grouped by workspace")
    user = serializers.CharField(
        allow_null=True, help_text="who created the work; null when not grouped by user, or for a deleted account"
    )
    gpu_type = serializers.CharField(allow_null=True, help_text="null when not grouped by GPU type")
    gpu_hours = serializers.DecimalField(max_digits=30, decimal_places=6, help_text="rounded half up")
    gpu_seconds = serializers.DecimalField(max_digits=40, decimal_places=9, help_text="exact")
    measured_gpu_hours = serializers.DecimalField(
        max_digits=30,
        decimal_places=6,
        allow_null=True,
        help_text="GPU-hours of measured use (utilisation x time), where GPU telemetry exists; else null",
    )


class UsageReportSerializer(serializers.Serializer):
    as_of = serializers.DateTimeField(help_text="running work counts up to this moment")
    month = serializers.CharField(allow_null=True, help_text="the month asked for; null for every month")
    workspace = serializers.CharField(allow_null=True, help_text="the workspace asked for, if one was")
    group_by = serializers.ListField(child=serializers.ChoiceField(choices=GROUPS))
    rows = UsageRowSerializer(many=True)


def report_data(report: UsageReport) -> dict[str, Any]:
    return {
        "as_of": report.as_of,
        "month": report.month.label if report.month else None,
        "workspace": report.workspace,
        "group_by": list(report.group_by),
        "rows": [row.as_dict() for row in report.rows],
    }


def _inert(value: Any) -> Any:
    """A cell a spreadsheet would run as a formula (=, +, -, @ first) made inert with a leading
    apostrophe; None as an empty cell."""
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def csv_text(rows: Iterable[UsageRow]) -> str:
    """The rows as CSV, with a header line: CSV_COLUMNS."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        cells = row.as_dict()
        writer.writerow([_inert(cells[column]) for column in CSV_COLUMNS])
    return out.getvalue()


def csv_response(report: UsageReport) -> HttpResponse:
    """The report as a CSV download named after its month and workspace."""
    name = "-".join(["gpu-usage", report.month.label if report.month else "all-months", report.workspace or ""])
    response = HttpResponse(csv_text(report.rows), content_type="text/csv; charset=utf-8")
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name.rstrip("-"))
    response["Content-Disposition"] = f'attachment; filename="{safe}.csv"'
    return response


def parse_query(params: Any) -> dict[str, Any]:
    """The validated query parameters; a ValidationError (400) naming each one at fault, an
    unknown or repeated one included."""
    known = set(UsageQuerySerializer().fields)
    errors: dict[str, list[str]] = {}
    for name, values in params.lists():
        if name not in known:
            errors[name] = [f"Unknown query parameter. This report knows: {', '.join(sorted(known))}."]
        elif len(values) > 1:
            errors[name] = ["Give this parameter once (several groups: group_by=workspace,user)."]
    if errors:
        raise ValidationError(errors)
    query = UsageQuerySerializer(data={name: params[name] for name in params})
    query.is_valid(raise_exception=True)
    return dict(query.validated_data)


class UsageView(APIView):
    """GPU-hours per calendar month (UTC) and, as `group_by` asks, workspace, user and GPU type:
    for platform admins, every workspace's; for others, the workspaces they own. As JSON
    (`?format=json`, the default) or CSV (`?format=csv`)."""

    content_negotiation_class = AnswerAsIs  # `format` is read here, not by DRF's renderers

    @extend_schema(
        parameters=[
            OpenApiParameter("month", str, pattern=MONTH_PATTERN, description="YYYY-MM (UTC); every month if left out"),
            OpenApiParameter("workspace", str, description="Only this workspace's (by name)."),
            OpenApiParameter(
                "group_by",
                str,
                enum=list(GROUPS),
                many=True,
                style="form",
                explode=False,
                description="Comma-separated: workspace, user, gpu_type (all three if left out; empty: per month).",
            ),
            OpenApiParameter("format", str, enum=list(FORMATS), description="json (default) or csv"),
        ],
        responses={(200, "application/json"): UsageReportSerializer, (200, "text/csv"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> HttpResponse:
        query = parse_query(request.query_params)
        report = usage_report(
            request.user, month=query.get("month"), workspace=query.get("workspace"), group_by=query["group_by"]
        )
        if query["format"] == "csv":
            return csv_response(report)
        return Response(UsageReportSerializer(report_data(report)).data)
