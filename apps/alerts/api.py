"""Alert rules and alerts through the API: `/api/v1/alert-rules/` and `/api/v1/alerts/`.

Anyone who can see a workspace sees its rules and their alerts; its owners create, change,
delete and silence them (a rule's webhook URL is shown to them only, its secret to no one: the
answer says whether one is set). Rules over every workspace, and the platform kinds
(node_unhealthy, backend_failing), are platform admins': no one else sees them or their alerts.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.utils.dateparse import parse_datetime
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from apps.alerts import actions
from apps.alerts.models import Alert, AlertRule
from apps.api.fields import WorkspaceField
from apps.api.filters import IdFilter
from apps.api.strict import StrictModelSerializer, StrictSerializer
from apps.api.views import TenantViewSet
from apps.audit.actions import Origin
from apps.errors import RULE
from apps.workspaces.access import MANAGE, VIEW, can, restrict, workspace_ids
from apps.workspaces.models import Workspace

WEEK_S = 7 * 86400


def _managed(context: dict[str, Any]) -> Any:
    """The ids of the workspaces the requesting user owns (True: every one), once per request."""
    if "managed" not in context:
        request = context.get("request")
        user = getattr(request, "user", None)
        if actions.is_admin(user):
            context["managed"] = True
        else:
            context["managed"] = set(workspace_ids(user, MANAGE).values_list("pk", flat=True)) if user else set()
    return context["managed"]


class RuleWorkspaceField(WorkspaceField):
    """A workspace by name, or null for every workspace; "" is neither (DRF would take it for null)."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data == "":
            raise serializers.ValidationError("Give a workspace's name, or null for every workspace.")
        return super().run_validation(data)


class AlertRuleSerializer(StrictModelSerializer):
    name = serializers.CharField(max_length=100, trim_whitespace=False)
    workspace = RuleWorkspaceField(required=False, allow_null=True)
    gpu_type = serializers.CharField(max_length=32, allow_blank=True, required=False)
    threshold = serializers.DecimalField(
        max_digits=12, decimal_places=2, min_value=Decimal("0"), max_value=Decimal("999999999")
    )
    window_s = serializers.IntegerField(min_value=60, max_value=WEEK_S, required=False)
    for_s = serializers.IntegerField(min_value=0, max_value=WEEK_S, required=False)
    emails = serializers.ListField(
        child=serializers.CharField(max_length=254, allow_blank=True), max_length=20, required=False
    )
    webhook_url = serializers.CharField(max_length=500, allow_blank=True, required=False)
    webhook_secret = serializers.CharField(
        min_length=16, max_length=200, write_only=True, required=False, trim_whitespace=False,
        help_text="The webhook's shared secret: write only, never answered.",
    )  # fmt: skip
    webhook_secret_set = serializers.SerializerMethodField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = AlertRule
        fields = [
            "id",
            "name",
            "kind",
            "workspace",
            "gpu_type",
            "threshold",
            "window_s",
            "for_s",
            "enabled",
            "emails",
            "webhook_url",
            "webhook_secret",
            "webhook_secret_set",
            "silenced_until",
            "created_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["silenced_until", "created_at", "updated_at"]

    def get_webhook_secret_set(self, rule: AlertRule) -> bool:
        return bool(rule.webhook_secret)

    def to_representation(self, rule: AlertRule) -> dict[str, Any]:
        data = super().to_representation(rule)
        managed = _managed(self.context)
        if managed is not True and rule.workspace_id not in managed:
            data["webhook_url"] = ""  # it may carry a credential: its owners' to see
        return data


class SilenceSerializer(StrictSerializer):
    until = serializers.CharField(
        max_length=64, required=False, help_text="When the silence ends (ISO 8601, at most 30 days ahead)."
    )
    for_s = serializers.IntegerField(
        min_value=0, max_value=actions.MAX_SILENCE_S, required=False,
        help_text="Or for how long, in seconds; 0 lifts the silence. Neither: one hour.",
    )  # fmt: skip

    def end(self) -> Any:
        data = self.validated_data
        until = None
        if "until" in data:
            until = parse_datetime(data["until"].strip())
            if until is None or until.tzinfo is None:
                raise serializers.ValidationError(
                    {"until": "Give a date and time with its zone, such as 2026-11-25T09:00:00Z."}, code=RULE
                )
        return actions.silence_end(until, data.get("for_s"))


class AlertRuleFilter(filters.FilterSet):
    class Meta:
        model = AlertRule
        fields = {"kind": ["exact"], "enabled": ["exact"]}


def _silence(request: Request, view: Any, obj: Any, do: Any) -> Any:
    body = SilenceSerializer(data=request.data, context=view.get_serializer_context())
    body.is_valid(raise_exception=True)
    return do(obj, body.end(), acting_user=request.user, origin=Origin.from_request(request))


class AlertRuleViewSet(TenantViewSet):
    """Threshold rules: `queue_wait` (seconds the oldest queued workload has waited), `quota_used`
    (% of a workspace's nominal GPU quota allocated), `gpu_idle` (% measured utilisation of the GPUs
    a workspace holds, under which they are idle; where GPU telemetry exists), `reservation_idle`
    (seconds an active GPU reservation has run nothing of its workspace), and, for platform
    admins, `node_unhealthy` and `backend_failing` (failures in `window_s`). An alert fires once the
    condition has held for `for_s`, to `emails` and a signed `webhook_url` (see docs/operations.md)."""

    serializer_class = AlertRuleSerializer
    queryset = AlertRule.objects.all()
    filterset_class = AlertRuleFilter
    ordering_fields = ["name", "created_at"]
    change_role = MANAGE

    def base_queryset(self) -> Any:
        return AlertRule.objects.select_related("workspace", "created_by")

    def require(self, workspace: Workspace | None, role: str | None = None) -> None:
        if workspace is None:
            if not actions.is_admin(self.request.user):
                raise PermissionDenied("Only platform admins can change rules over every workspace.")
            return
        super().require(workspace, role)

    def check_object_permissions(self, request: Any, obj: AlertRule) -> None:
        super(TenantViewSet, self).check_object_permissions(request, obj)
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            self.require(obj.workspace, MANAGE)

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = dict(serializer.validated_data)
        self.require(data.get("workspace"), MANAGE)
        secret = data.pop("webhook_secret", None)
        serializer.instance = actions.do_save_rule(None, webhook_secret=secret, **data, **self.action_kwargs())

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        data = dict(serializer.validated_data)
        if "workspace" in data:
            self.require(data["workspace"], MANAGE)
        secret = data.pop("webhook_secret", None)
        rule = serializer.instance
        serializer.instance = actions.do_save_rule(rule, webhook_secret=secret, **data, **self.action_kwargs())

    def perform_destroy(self, instance: AlertRule) -> None:
        actions.do_delete_rule(instance, **self.action_kwargs())

    @extend_schema(request=SilenceSerializer, responses=AlertRuleSerializer)
    @action(detail=True, methods=["post"])
    def silence(self, request: Request, pk: Any = None) -> Response:
        """Deliver none of the rule's alerts `until` a time or `for_s` seconds (an hour if neither;
        `for_s` 0 lifts it). They are still evaluated and listed."""
        rule = _silence(request, self, self.get_object(), actions.do_silence_rule)
        return Response(self.get_serializer(rule).data)


class AlertSerializer(serializers.ModelSerializer):
    rule_name = serializers.CharField(source="rule.name", read_only=True)
    kind = serializers.CharField(source="rule.kind", read_only=True)
    workspace = serializers.SerializerMethodField()
    threshold = serializers.DecimalField(source="rule.threshold", max_digits=12, decimal_places=2, read_only=True)
    labels = serializers.DictField(child=serializers.CharField(), read_only=True)
    rule_silenced_until = serializers.DateTimeField(source="rule.silenced_until", read_only=True)
    silenced = serializers.SerializerMethodField()
    last_delivery = serializers.DictField(child=serializers.DictField(), read_only=True)
    delivery_error = serializers.CharField(read_only=True)

    class Meta:
        model = Alert
        fields = [
            "id",
            "rule",
            "rule_name",
            "kind",
            "workspace",
            "key",
            "labels",
            "state",
            "value",
            "threshold",
            "pending_since",
            "firing_since",
            "resolved_at",
            "last_seen_at",
            "silenced",
            "silenced_until",
            "rule_silenced_until",
            "notified_at",
            "last_delivery",
            "delivery_error",
        ]
        read_only_fields = fields

    def get_workspace(self, alert: Alert) -> str | None:
        """The rule's workspace; null for a rule over every workspace (the labels name the one)."""
        return alert.rule.workspace.name if alert.rule.workspace else None

    def get_silenced(self, alert: Alert) -> bool:
        from django.utils import timezone

        from apps.alerts.delivery import silenced

        return silenced(alert, timezone.now())


class AlertFilter(filters.FilterSet):
    rule = IdFilter(field_name="rule_id")

    class Meta:
        model = Alert
        fields = {"state": ["exact", "in"]}


class AlertViewSet(viewsets.ReadOnlyModelViewSet):
    """Alerts of the rules you can see: pending, firing and resolved, with their last delivery."""

    serializer_class = AlertSerializer
    queryset = Alert.objects.none()  # for the schema; get_queryset() is the truth
    workspace_field = "rule__workspace"  # for the `?workspace=` filter
    filterset_class = AlertFilter
    ordering_fields = ["pending_since", "firing_since"]

    def get_queryset(self) -> Any:
        rows = Alert.objects.select_related("rule__workspace")
        return restrict(rows, self.request.user, VIEW, field="rule__workspace")

    @extend_schema(request=SilenceSerializer, responses=AlertSerializer)
    @action(detail=True, methods=["post"])
    def silence(self, request: Request, pk: Any = None) -> Response:
        """Deliver nothing of this alert `until` a time or `for_s` seconds (an hour if neither;
        `for_s` 0 lifts it): it is still listed."""
        alert = self.get_object()
        workspace = alert.rule.workspace
        allowed = actions.is_admin(request.user) if workspace is None else can(request.user, workspace, MANAGE)
        if not allowed:
            raise PermissionDenied("Only the workspace's owners can silence its alerts.")
        done = _silence(request, self, alert, actions.do_silence_alert)
        return Response(self.get_serializer(done).data)
