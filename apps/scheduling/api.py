"""`/api/v1/admin/whatif/`: platform admins' what-if replays of the portal's own history.

POST starts one (201, then it runs in the background: poll its `state` and `progress`); GET lists
them or shows one with its figures side by side; `.../<id>/csv/` downloads those as CSV. Anyone
but a platform admin gets a 403, whoever started the replay (apps/scheduling/whatif.py).

This module imports DRF but not apps.api: scheduling sits below the API layer (tests/test_layers.py).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.audit.actions import Origin
from apps.errors import RULE, Conflict
from apps.scheduling import whatif
from apps.scheduling.models import WhatIfReplay

SIZE = r"^[+-]?[0-9]{1,6}$"
NAME = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"  # a workspace's or cohort's: a DNS label
QUOTA_CHANGE = rf"^{NAME}=[+-]?[0-9]{{1,6}}$"
COHORT_CHANGE = rf"^{NAME}=({NAME})?$"


class IsPlatformAdmin(BasePermission):
    message = "Only platform admins can run or see what-if replays."

    def has_permission(self, request: Any, view: Any) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.is_staff)


class _Change(serializers.RegexField):
    """One change, "WORKSPACE=VALUE": its shape a pattern in the schema, refused naming the item."""

    def __init__(self, regex: str, hint: str) -> None:
        super().__init__(regex, max_length=200)
        self.hint = hint

    def run_validation(self, data: Any = serializers.empty) -> Any:
        try:
            return super().run_validation(data)
        except serializers.ValidationError:
            raise serializers.ValidationError(f"{str(data)[:100]!r}: {self.hint}") from None


class WhatIfRequestSerializer(serializers.Serializer):
    """What an admin asks: a window of history and changes to today's settings."""

    since = serializers.DateTimeField(help_text="replay the workloads submitted from this moment")
    until = serializers.DateTimeField(required=False, help_text="... up to this one (default: now)")
    # The shapes of the changes are in the schema; what they name is checked against today's settings.
    quotas = serializers.ListField(
        child=_Change(
            QUOTA_CHANGE, "the quota must be +N, -N or N whole GPUs, such as team-b=+16, team-b=-4 or team-b=24."
        ),
        required=False,
        max_length=1000,
        help_text='WORKSPACE=+N, WORKSPACE=-N or WORKSPACE=N whole GPUs, e.g. "team-b=+16"',
    )
    cohorts = serializers.ListField(
        child=_Change(
            COHORT_CHANGE, "give WORKSPACE=COHORT (lowercase letters, digits and dashes), or WORKSPACE= for none."
        ),
        required=False,
        max_length=1000,
        help_text='WORKSPACE=COHORT, or WORKSPACE= for no cohort, e.g. "team-b=pool-1"',
    )
    policy = serializers.ChoiceField(choices=whatif.POLICIES, required=False)
    preemption = serializers.BooleanField(required=False, allow_null=True, default=None)
    min_runtime_s = serializers.FloatField(required=False, min_value=0, max_value=30 * 86400)
    starvation_s = serializers.FloatField(required=False, min_value=0, max_value=30 * 86400)
    cluster_gpus = serializers.RegexField(
        SIZE,
        required=False,
        max_length=20,
        error_messages={"invalid": "Give +N, -N or N whole GPUs, such as +16 or 64."},
        help_text='+N, -N or N GPUs in the cluster, e.g. "+16" or "64"',
    )

    def validate_quotas(self, value: list[str]) -> dict[str, str]:
        return self._assignments(value, "quota", sizes=True)

    def validate_cohorts(self, value: list[str]) -> dict[str, str | None]:
        return {name: cohort or None for name, cohort in self._assignments(value, "cohort", sizes=False).items()}

    def validate_cluster_gpus(self, value: str) -> str:
        size = whatif.parse_size(value)
        if size is None:
            raise serializers.ValidationError("Give +N, -N or N whole GPUs, such as +16 or 64.")
        return size

    @staticmethod
    def _assignments(items: list[str], what: str, *, sizes: bool) -> dict[str, str]:
        found, errors = whatif.parse_assignments(items, what, sizes=sizes)
        if errors:
            raise serializers.ValidationError(errors, code=RULE)
        return found

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs.setdefault("until", timezone.now())
        changes = whatif.Changes.from_json({k: v for k, v in attrs.items() if k not in ("since", "until")})
        found = whatif.problems(changes, whatif.today(), attrs["since"], attrs["until"])
        if found:
            raise serializers.ValidationError(
                {
                    field: [
                        ErrorDetail(m, code="does_not_exist" if whatif.names_no_workspace(m) else RULE)
                        for m in messages
                    ]
                    for field, messages in found.items()
                }
            )
        return {"since": attrs["since"], "until": attrs["until"], "changes": changes}


class WhatIfReplaySerializer(serializers.ModelSerializer):
    """A replay, with its figures (`result`: null until it succeeded)."""

    changes_text = serializers.SerializerMethodField(help_text="each change in words")

    class Meta:
        model = WhatIfReplay
        fields = ["id", "state", "progress", "message", "since", "until", "changes", "changes_text", "created_at",
                  "started_at", "finished_at", "result"]  # fmt: skip
        read_only_fields = fields

    def get_changes_text(self, run: WhatIfReplay) -> list[str]:
        return whatif.Changes.from_json(run.changes).describe()


class _AsIs(BaseContentNegotiation):
    """The CSV route answers CSV whatever the client accepts; its errors are the API's JSON."""

    def select_parser(self, request: Request, parsers: list[Any]) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: list[Any], format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type


class WhatIfListView(APIView):
    permission_classes = [IsPlatformAdmin]

    @extend_schema(
        responses=inline_serializer("WhatIfReplayList", {"results": WhatIfReplaySerializer(many=True)}),
        summary="The latest 50 what-if replays",
        operation_id="v1_admin_whatif_list",
    )
    def get(self, request: Request) -> Response:
        runs = WhatIfReplay.objects.all()[:50]
        return Response({"results": WhatIfReplaySerializer(runs, many=True).data})

    @extend_schema(request=WhatIfRequestSerializer, responses={201: WhatIfReplaySerializer})
    def post(self, request: Request) -> Response:
        asked = WhatIfRequestSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        origin = Origin.from_request(request)
        run = whatif.check_start_whatif(**asked.validated_data, acting_user=request.user, origin=origin)
        run.refresh_from_db()
        return Response(WhatIfReplaySerializer(run).data, status=201)


class WhatIfDetailView(APIView):
    permission_classes = [IsPlatformAdmin]

    @extend_schema(responses=WhatIfReplaySerializer)
    def get(self, request: Request, pk: int) -> Response:
        return Response(WhatIfReplaySerializer(get_object_or_404(WhatIfReplay, pk=pk)).data)


class WhatIfCSVView(APIView):
    permission_classes = [IsPlatformAdmin]
    content_negotiation_class = _AsIs

    @extend_schema(responses={(200, "text/csv"): str})
    def get(self, request: Request, pk: int) -> HttpResponse:
        run = get_object_or_404(WhatIfReplay, pk=pk)
        if run.result is None:
            raise Conflict(f"What-if replay {pk} has no figures ({run.get_state_display().lower()}).")
        return csv_response(run)


def csv_response(run: WhatIfReplay) -> HttpResponse:
    """The replay's figures as a CSV download (the API's and the console's)."""
    response = HttpResponse(whatif.as_csv(run.result or {}), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="whatif-{run.pk}.csv"'
    return response
