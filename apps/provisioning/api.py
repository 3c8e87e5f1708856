"""The API of GPU provisioning requests (``/api/v1/gprs/``): ask for whole GPUs ahead of time,
change or withdraw the request, and, for admins, decide it.

Members of a workspace (its change role) ask, change, cancel and release; its viewers read. A
platform admin sees every workspace's requests (``?state=REQUESTED`` is the queue to decide) and
approves (as asked, or later, with fewer GPUs, shorter), rejects with a reason, or decides an
extension asked for after approval. ``estimate/`` checks a request without saving it: its earliest
feasible start and whether the workspace's policy would approve it at once. ``calendar/`` shows
every reservation in a window, whoever holds it, with only what the queue shows of it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api.fields import WorkspaceField
from apps.api.strict import StrictModelSerializer, StrictSerializer
from apps.api.views import TenantViewSet
from apps.compute.api import TargetClusterField
from apps.errors import RULE, ActionError
from apps.inventory.models import Allocation
from apps.names import validate_gpu_type
from apps.provisioning import actions
from apps.provisioning.models import MAX_GPUS, ProvisioningEvent, ProvisioningRequest
from apps.workspaces.access import CHANGE, can

MIN_DURATION_S = 600
MAX_DURATION_S = 366 * 86400
#: How far ahead a reservation may start.
MAX_AHEAD_S = 366 * 86400
#: The longest window the calendar shows at once.
MAX_CALENDAR_S = 366 * 86400
DEFAULT_CALENDAR_S = 14 * 86400

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")
#: What a duration in words may be: the schema's pattern, and exactly what `parse_duration` reads.
DURATION_PATTERN = r"^([0-9]+|([0-9]+(\.[0-9]+)?[smhdwSMHDW])+)$"


def parse_duration(text: str) -> int:
    """Seconds in ``"3d"``, ``"36h"``, ``"90m"``, ``"1h30m"``, ``"1.5h"`` or ``"7200"``; ValueError
    for anything else (spaces included)."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(text)
    if text.isdigit():
        return int(text)
    return round(sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(text.lower())))


@extend_schema_field({"type": "string", "pattern": DURATION_PATTERN, "maxLength": 32,
                      "description": 'A duration: "3d", "36h", "90m", "1h30m", or seconds ("7200").'})  # fmt: skip
class DurationField(serializers.Field):
    """A duration in words (``"3d"``, ``"36h"``, ``"90m"``), read as seconds."""

    def to_internal_value(self, data: Any) -> int:
        if not isinstance(data, str) or len(data) > 32:
            raise serializers.ValidationError('Expected a duration written as a string, such as "3d" or "36h".')
        try:
            seconds = parse_duration(data)
        except ValueError:
            raise serializers.ValidationError(f"{data!r} is not a duration such as 3d, 36h or 90m.") from None
        if not MIN_DURATION_S <= seconds <= MAX_DURATION_S:
            raise serializers.ValidationError("A reservation lasts from 10 minutes to 366 days.", code=RULE)
        return seconds

    def to_representation(self, value: Any) -> str:
        return f"{int(value)}s"


class StartField(serializers.DateTimeField):
    """When a reservation starts: at most a year ahead (a start in the past is the action's refusal)."""

    def to_internal_value(self, value: Any) -> datetime:
        moment = super().to_internal_value(value)
        if moment > timezone.now() + timedelta(seconds=MAX_AHEAD_S):
            raise serializers.ValidationError("A reservation starts within a year from now.", code=RULE)
        return moment


class _Durations(StrictSerializer):
    """How long: `duration_s` in seconds, or `duration` in words; `validate` gives `duration_s`."""

    duration_s = serializers.IntegerField(min_value=MIN_DURATION_S, max_value=MAX_DURATION_S, required=False,
                                          help_text="How long, in seconds (or give `duration`).")  # fmt: skip
    duration = DurationField(required=False, help_text='How long, in words: "3d", "36h", "90m".')


def _one_duration(attrs: dict[str, Any], *, required: bool) -> dict[str, Any]:
    """`duration` folded into `duration_s`, remembering which the caller gave (to name it in errors)."""
    if "duration" in attrs and "duration_s" in attrs:
        raise serializers.ValidationError({"duration": "Give duration or duration_s, not both."}, code=RULE)
    if "duration" in attrs:
        attrs["duration_s"] = attrs.pop("duration")
        attrs["duration_given_as"] = "duration"
    elif required and "duration_s" not in attrs:
        raise serializers.ValidationError({"duration": 'Say how long: duration ("3d", "36h") or duration_s.'},
                                          code=RULE)  # fmt: skip
    return attrs


def _said(text: str, missing: str) -> str:
    """Text that says something (blank is a refusal the schema cannot state), trimmed."""
    if not text.strip():
        raise serializers.ValidationError(missing, code=RULE)
    return text.strip()


@contextmanager
def _fields_as_given(attrs: dict[str, Any]) -> Iterator[None]:
    """An action's refusal of `duration_s` named `duration` where the caller gave that."""
    try:
        yield
    except ActionError as exc:
        if exc.field == "duration_s" and attrs.get("duration_given_as") == "duration":
            exc.field = "duration"
        raise


class GPRSerializer(StrictModelSerializer):
    workspace = serializers.CharField(source="workspace.name", read_only=True)
    cluster = serializers.CharField(source="cluster.name", read_only=True, default=None)
    held_cluster = serializers.CharField(source="held_cluster.name", read_only=True, default=None)
    end_at = serializers.DateTimeField(read_only=True)
    held_gpus = serializers.SerializerMethodField()
    in_use = serializers.SerializerMethodField()
    requested_by = serializers.CharField(source="requested_by.username", read_only=True, default=None)
    decided_by = serializers.CharField(source="decided_by.username", read_only=True, default=None)
    url = serializers.SerializerMethodField()

    class Meta:
        model = ProvisioningRequest
        fields = [
            "id", "workspace", "state", "gpu_type", "gpus", "cluster", "asap", "start_at", "duration_s", "end_at",
            "priority", "justification", "earliest_start", "held_cluster", "held_start", "held_end", "held_gpus",
            "in_use", "requested_by", "decided_by", "decided_at", "decision_reason", "auto_approved",
            "pending_change", "slurm_reservation", "created_at", "url",
        ]  # fmt: skip
        read_only_fields = fields

    def get_held_gpus(self, gpr: ProvisioningRequest) -> int:
        """The devices it holds (its GPUs once approved; none before)."""
        counted = getattr(gpr, "held_count", None)
        return int(counted) if counted is not None else gpr.held_gpus

    def get_in_use(self, gpr: ProvisioningRequest) -> int:
        """How many of its GPUs the workspace's work uses now."""
        counted = getattr(gpr, "in_use_count", None)
        return int(counted) if counted is not None else actions.in_use(gpr)

    def get_url(self, gpr: ProvisioningRequest) -> str:
        """Its page in the portal."""
        return actions.page_url(gpr)


def annotated(requests: QuerySet[ProvisioningRequest]) -> QuerySet[ProvisioningRequest]:
    """Requests with what the serializer shows of each, in one query for a whole list: the devices
    it holds, and those of them its work uses now (as `actions.in_use` counts them)."""
    used = (
        Allocation.objects.filter(workload__reservation=OuterRef("pk"), gpu__reservations=OuterRef("pk"))
        .values("workload__reservation")
        .annotate(n=Count("gpu_id", distinct=True))
        .values("n")
    )
    held = (
        ProvisioningRequest.devices.through.objects.filter(provisioningrequest=OuterRef("pk"))
        .values("provisioningrequest")
        .annotate(n=Count("gpu_id"))
        .values("n")
    )
    return requests.select_related("workspace", "cluster", "held_cluster", "requested_by", "decided_by").annotate(
        held_count=Coalesce(Subquery(held, output_field=IntegerField()), 0),
        in_use_count=Coalesce(Subquery(used, output_field=IntegerField()), 0),
    )


@extend_schema_field({"type": "string", "minLength": 1, "description": "A workspace's name."})
class WorkspaceNameField(WorkspaceField):
    """A workspace by name (the schema's type, in a serializer without a model)."""


class GPRCreateSerializer(_Durations):
    """A new request's terms."""

    workspace = WorkspaceNameField()
    gpu_type = serializers.CharField(max_length=32, validators=[validate_gpu_type])
    gpus = serializers.IntegerField(min_value=1, max_value=MAX_GPUS, help_text="Whole GPUs, all in one cluster.")
    cluster = TargetClusterField(required=False, allow_null=True)
    start_at = StartField(required=False, allow_null=True, help_text="From when; left out: as soon as possible.")
    priority = serializers.IntegerField(min_value=-100, max_value=100, default=0)
    justification = serializers.CharField(max_length=2000, trim_whitespace=False,
                                          help_text="What the GPUs are for: the admin reads it.")  # fmt: skip

    def validate_justification(self, value: str) -> str:
        return _said(value, "Say what the GPUs are for: the admin who decides reads it.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return _one_duration(attrs, required=True)


class GPREstimateSerializer(GPRCreateSerializer):
    """A new request's terms, for an estimate: the justification may wait for the request itself."""

    justification = serializers.CharField(max_length=2000, required=False, allow_blank=True)

    def validate_justification(self, value: str) -> str:
        return value.strip()


class GPRModifySerializer(_Durations):
    gpus = serializers.IntegerField(min_value=1, max_value=MAX_GPUS, required=False)
    start_at = StartField(required=False, help_text="A new start (a request not yet approved).")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = _one_duration(attrs, required=False)
        if not {"gpus", "duration_s", "start_at"} & attrs.keys():
            raise serializers.ValidationError({"gpus": "Give gpus, duration (or duration_s) or start_at."}, code=RULE)
        return attrs


class GPRApproveSerializer(_Durations):
    start_at = StartField(required=False, help_text="A later start than asked.")
    gpus = serializers.IntegerField(min_value=1, max_value=MAX_GPUS, required=False, help_text="Fewer than asked.")
    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return _one_duration(attrs, required=False)


class GPRRejectSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=1000, trim_whitespace=False, help_text="Why: the requester reads it.")

    def validate_reason(self, value: str) -> str:
        return _said(value, "Say why it is rejected: the requester reads it.")


class GPRDecideChangeSerializer(StrictSerializer):
    approve = serializers.BooleanField(help_text="true: extend it as asked; false: refuse the extension.")
    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


class GPREventSerializer(StrictModelSerializer):
    actor = serializers.CharField(source="actor.username", read_only=True, default=None)

    class Meta:
        model = ProvisioningEvent
        fields = ["at", "kind", "message", "actor"]
        read_only_fields = fields


class GPRViewSet(TenantViewSet):
    """GPU provisioning requests: whole GPUs of a type (in one cluster, or any) asked for ahead of
    time, from a start (or as soon as possible) for a duration, with a priority and a justification.
    The workspace's policy approves one at once (within its quota and the policy's longest time) or
    leaves it to an admin. REQUESTED, APPROVED (its GPUs held from `held_start` to `held_end`), ACTIVE,
    ENDED; or REJECTED, CANCELLED (before it began), RELEASED (ended early)."""

    serializer_class = GPRSerializer
    queryset = ProvisioningRequest.objects.all()
    http_method_names = ["get", "post", "patch", "head", "options"]
    # `state=REQUESTED` (an admin's queue), or several: `state__in=REQUESTED,APPROVED`.
    filterset_fields = {"state": ["exact", "in"], "gpu_type": ["exact"]}
    ordering_fields = ["created_at", "priority", "held_start", "state"]

    def base_queryset(self) -> QuerySet[ProvisioningRequest]:
        return annotated(ProvisioningRequest.objects.all())

    def _answer(self, gpr: ProvisioningRequest, code: int = status.HTTP_200_OK) -> Response:
        return Response(self.get_serializer(self.base_queryset().get(pk=gpr.pk)).data, status=code)

    def _require_admin(self) -> None:
        if not actions.is_admin(self.request.user):
            raise PermissionDenied("Only platform admins decide provisioning requests.")

    @extend_schema(request=GPRCreateSerializer, responses={201: GPRSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Ask for GPUs: the calendar finds the earliest feasible start; the workspace's policy
        approves it at once or leaves it to an admin (its `state` says which)."""
        given = GPRCreateSerializer(data=request.data, context=self.get_serializer_context())
        given.is_valid(raise_exception=True)
        data = given.validated_data
        self.require(data["workspace"])
        with _fields_as_given(data):
            asked = actions.check_request(
                data["workspace"], gpu_type=data["gpu_type"], gpus=data["gpus"], duration_s=data["duration_s"],
                start_at=data.get("start_at"), cluster=data.get("requested_cluster"),
            )  # fmt: skip
        gpr = actions.do_request(asked, priority=data["priority"], justification=data["justification"],
                                 **self.action_kwargs())  # fmt: skip
        return self._answer(gpr, status.HTTP_201_CREATED)

    @extend_schema(request=GPRModifySerializer, responses=GPRSerializer)
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Change it. Not yet approved: its GPUs, duration or start, checked again. Approved or
        active: fewer GPUs, a shorter time, or a longer one (beyond what the policy approves by
        itself, that waits for an admin: `pending_change`)."""
        gpr = self.get_object()
        given = GPRModifySerializer(data=request.data, context=self.get_serializer_context())
        given.is_valid(raise_exception=True)
        data = given.validated_data
        with _fields_as_given(data):
            actions.do_modify(gpr, gpus=data.get("gpus"), duration_s=data.get("duration_s"),
                              start_at=data.get("start_at"), **self.action_kwargs())  # fmt: skip
        return self._answer(gpr)

    @extend_schema(request=None, responses=GPRSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Withdraw it before it began (409 once it has)."""
        gpr = self.get_object()
        actions.do_cancel(gpr, **self.action_kwargs())
        return self._answer(gpr)

    @extend_schema(request=None, responses=GPRSerializer)
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str | None = None) -> Response:
        """End it now, while it is active: its GPUs go back to everyone at once (409 otherwise)."""
        gpr = self.get_object()
        actions.do_release(gpr, **self.action_kwargs())
        return self._answer(gpr)

    @extend_schema(request=GPRApproveSerializer, responses=GPRSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        """Platform admins: approve a pending request, as asked or with a later start, fewer GPUs
        or a shorter time; it holds the earliest devices the calendar finds from then on."""
        gpr = self.get_object()
        self._require_admin()
        given = GPRApproveSerializer(data=request.data, context=self.get_serializer_context())
        given.is_valid(raise_exception=True)
        data = given.validated_data
        with _fields_as_given(data):
            actions.do_approve(
                gpr, start_at=data.get("start_at"), gpus=data.get("gpus"), duration_s=data.get("duration_s"),
                reason=data["reason"], **self.action_kwargs(),
            )  # fmt: skip
        return self._answer(gpr)

    @extend_schema(request=GPRRejectSerializer, responses=GPRSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        """Platform admins: reject a pending request, saying why (the requester reads it)."""
        gpr = self.get_object()
        self._require_admin()
        given = GPRRejectSerializer(data=request.data, context=self.get_serializer_context())
        given.is_valid(raise_exception=True)
        actions.do_reject(gpr, reason=given.validated_data["reason"], **self.action_kwargs())
        return self._answer(gpr)

    @extend_schema(request=GPRDecideChangeSerializer, responses=GPRSerializer)
    @action(detail=True, methods=["post"], url_path="decide-change")
    def decide_change(self, request: Request, pk: str | None = None) -> Response:
        """Platform admins: approve or refuse an extension asked for after approval (`pending_change`)."""
        gpr = self.get_object()
        self._require_admin()
        given = GPRDecideChangeSerializer(data=request.data, context=self.get_serializer_context())
        given.is_valid(raise_exception=True)
        data = given.validated_data
        actions.do_decide_change(gpr, approve=data["approve"], reason=data["reason"], **self.action_kwargs())
        return self._answer(gpr)

    @extend_schema(responses=GPREventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        """Its timeline, oldest first: asked, approved or rejected, changed, began, warned, idle, ended."""
        gpr = self.get_object()
        steps = ProvisioningEvent.objects.filter(request=gpr).select_related("actor")
        return Response(GPREventSerializer(steps, many=True).data)


# --- Not saved: an estimate; everyone's reservations: the calendar ----------------------------------


class GPREstimateView(APIView):
    """What a request with these terms (the fields of a new request) would get, saving nothing:
    its earliest feasible start, the cluster and GPUs it would hold, and whether the workspace's
    policy would approve it at once (`auto_approve`; `needs_admin` says why not)."""

    @extend_schema(
        request=GPREstimateSerializer,
        responses=inline_serializer("GPREstimate", {
            "workspace": serializers.CharField(), "gpu_type": serializers.CharField(),
            "gpus": serializers.IntegerField(), "cluster": serializers.CharField(),
            "earliest_start": serializers.DateTimeField(), "end_at": serializers.DateTimeField(),
            "duration_s": serializers.IntegerField(), "auto_approve": serializers.BooleanField(),
            "needs_admin": serializers.CharField(),
        }),
    )  # fmt: skip
    def post(self, request: Request) -> Response:
        given = GPREstimateSerializer(data=request.data, context={"request": request})
        given.is_valid(raise_exception=True)
        data = given.validated_data
        workspace = data["workspace"]
        if not can(request.user, workspace, CHANGE):
            raise PermissionDenied(f"Your role in workspace {workspace.name} does not allow this.")
        with _fields_as_given(data):
            asked = actions.check_request(
                workspace, gpu_type=data["gpu_type"], gpus=data["gpus"], duration_s=data["duration_s"],
                start_at=data.get("start_at"), cluster=data.get("requested_cluster"),
            )  # fmt: skip
        why = actions.auto_refusal(asked)
        return Response({
            "workspace": workspace.name, "gpu_type": asked.gpu_type, "gpus": asked.found.gpus,
            "cluster": asked.found.cluster.name, "earliest_start": asked.found.start,
            "end_at": asked.found.start + timedelta(seconds=asked.duration_s), "duration_s": asked.duration_s,
            "auto_approve": why is None, "needs_admin": why or "",
        })  # fmt: skip


class CalendarWindowSerializer(serializers.Serializer):
    # `from` is a Python keyword: the field is named in get_fields.
    to = serializers.DateTimeField(required=False, help_text="The window's end (default: 14 days after its start).")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = serializers.DateTimeField(required=False, help_text="The window's start (default: now).")
        return fields

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        start = attrs.get("from") or timezone.now()
        try:
            end = attrs.get("to") or start + timedelta(seconds=DEFAULT_CALENDAR_S)
        except OverflowError:  # a start at the end of time
            raise serializers.ValidationError({"from": "Give a start before the year 9999."}, code=RULE) from None
        if end <= start:
            raise serializers.ValidationError({"to": "The window ends after it starts."}, code=RULE)
        if (end - start).total_seconds() > MAX_CALENDAR_S:
            raise serializers.ValidationError({"to": "The calendar shows at most 366 days at once."}, code=RULE)
        return {"from": start, "to": end}


class CalendarEntrySerializer(serializers.Serializer):
    workspace = serializers.CharField(source="workspace.name")
    gpu_type = serializers.CharField()
    gpus = serializers.IntegerField()
    cluster = serializers.CharField(source="held_cluster.name", default=None)
    start = serializers.DateTimeField(source="held_start")
    end = serializers.DateTimeField(source="held_end")
    state = serializers.CharField()


def calendar_between(start: datetime, end: datetime) -> QuerySet[ProvisioningRequest]:
    """Every approved or active reservation that overlaps [start, end), earliest first."""
    return (
        ProvisioningRequest.objects.filter(state__in=ProvisioningRequest.HOLDING_STATES)
        .filter(Q(held_start__lt=end) & Q(held_end__gt=start))
        .select_related("workspace", "held_cluster")
        .order_by("held_start", "id")
    )


class GPRCalendarView(APIView):
    """Every reservation (approved or active) that overlaps the window `from`..`to` (default: the
    next 14 days), whichever workspace holds it: its workspace, GPU type and count, cluster, start,
    end and state, and nothing more of it (its own page is its workspace's)."""

    @extend_schema(
        parameters=[OpenApiParameter("from", datetime, description="The window's start (default: now)."),
                    OpenApiParameter("to", datetime, description="The window's end (default: 14 days on).")],
        responses=CalendarEntrySerializer(many=True),
    )  # fmt: skip
    def get(self, request: Request) -> Response:
        unknown = sorted(set(request.query_params) - {"from", "to", "format"})
        if unknown:
            raise serializers.ValidationError({name: ["Unknown query parameter. This knows: from, to."]
                                               for name in unknown})  # fmt: skip
        window = CalendarWindowSerializer(data=request.query_params.dict())
        window.is_valid(raise_exception=True)
        found = calendar_between(window.validated_data["from"], window.validated_data["to"])
        return Response(CalendarEntrySerializer(found, many=True).data)
