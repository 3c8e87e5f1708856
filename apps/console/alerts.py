"""Alerts for admins: what fires, is pending, was resolved lately or is silenced, with a Silence
button; every alert rule, with forms to create, change and delete them (apps/alerts)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_POST

from apps.alerts import actions
from apps.alerts.delivery import silenced
from apps.alerts.forms import SILENCES, rule_form, silence
from apps.alerts.models import Alert, AlertRule
from apps.errors import ActionError
from apps.web.common import action_kwargs, admin_only, page

RECENT = timedelta(days=1)  # resolved alerts shown this long


@admin_only
def alert_list(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    rows = Alert.objects.select_related("rule__workspace").exclude(
        state=Alert.State.RESOLVED, resolved_at__lt=now - RECENT
    )
    alerts = sorted(rows, key=lambda a: (_order(a, now), -a.pending_since.timestamp()))
    context = {
        "alerts": [(a, silenced(a, now)) for a in alerts],
        "rules": AlertRule.objects.select_related("workspace").order_by("name", "id"),
        "silences": SILENCES,
        "now": now,
        "live_workspaces": [],
    }
    return page(request, "console/alerts.html", context)


def _order(alert: Alert, now: Any) -> int:
    if silenced(alert, now):
        return 3
    return {Alert.State.FIRING: 0, Alert.State.PENDING: 1}.get(Alert.State(alert.state), 2)


@admin_only
def rule_edit(request: HttpRequest, pk: int | None = None) -> HttpResponse:
    """Create a rule (no id in the URL) or change one."""
    rule = get_object_or_404(AlertRule.objects.select_related("workspace"), pk=pk) if pk else AlertRule()
    saved, context = rule_form(request, rule)
    if saved is not None:
        return redirect("console:alerts")
    status = 400 if context["errors"] else 200
    return page(request, "console/alerts_rule_form.html", {**context, "live_workspaces": []}, status=status)


@admin_only
@require_POST
def rule_delete(request: HttpRequest, pk: int) -> HttpResponse:
    rule = get_object_or_404(AlertRule, pk=pk)
    actions.do_delete_rule(rule, **action_kwargs(request))
    messages.success(request, f"Alert rule {rule.name} deleted.")
    return redirect("console:alerts")


@admin_only
@require_POST
def alert_silence(request: HttpRequest, pk: int) -> HttpResponse:
    alert = get_object_or_404(Alert.objects.select_related("rule__workspace"), pk=pk)
    return _silence(request, alert, f"Alert {alert}", actions.do_silence_alert)


@admin_only
@require_POST
def rule_silence(request: HttpRequest, pk: int) -> HttpResponse:
    rule = get_object_or_404(AlertRule.objects.select_related("workspace"), pk=pk)
    return _silence(request, rule, f"Rule {rule.name}", actions.do_silence_rule)


def _silence(request: HttpRequest, target: Any, name: str, do: Any) -> HttpResponse:
    """Silence an alert or a rule for the time the form asks (0: lift it), back on the alerts page."""
    try:
        messages.success(request, silence(request, target, name, do))
    except ActionError as exc:
        messages.error(request, exc.message)
    return redirect("console:alerts")
