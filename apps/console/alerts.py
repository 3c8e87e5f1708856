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
from apps.alerts.api import AlertRuleSerializer
from apps.alerts.delivery import silenced
from apps.alerts.models import Alert, AlertRule
from apps.console.forms import form_data, save
from apps.errors import ActionError
from apps.web.common import action_kwargs, admin_only, page

TEXT = ("name", "kind", "workspace", "gpu_type", "threshold", "window_s", "for_s", "webhook_url", "webhook_secret")
FIELDS = {*TEXT, "emails", "enabled"}
RECENT = timedelta(days=1)  # resolved alerts shown this long
SILENCES = ((3600, "1 hour"), (4 * 3600, "4 hours"), (86400, "1 day"), (7 * 86400, "1 week"))


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


def _values(rule: AlertRule) -> dict[str, Any]:
    values: dict[str, Any] = {name: getattr(rule, name, "") for name in TEXT if name != "webhook_secret"}
    values.update(
        workspace=rule.workspace.name if rule.workspace else "",
        emails="\n".join(rule.emails),
        enabled=rule.enabled if rule.pk else True,
        kind=rule.kind or AlertRule.Kind.QUEUE_WAIT,
        window_s=rule.window_s,
        for_s=rule.for_s,
    )
    return values


@admin_only
def rule_edit(request: HttpRequest, pk: int | None = None) -> HttpResponse:
    """Create a rule (no id in the URL) or change one."""
    rule = get_object_or_404(AlertRule.objects.select_related("workspace"), pk=pk) if pk else AlertRule()
    errors: dict[str, list[str]] = {}
    values = _values(rule)
    if request.method == "POST":
        data = form_data(request, TEXT, flags=("enabled",), nullable=("workspace",))
        data["emails"] = [e.strip() for e in request.POST.get("emails", "").replace(",", "\n").split("\n") if e.strip()]
        data.setdefault("gpu_type", "")
        data.setdefault("webhook_url", "")
        values = {**values, **{k: request.POST.get(k, "") for k in TEXT if k != "webhook_secret"},
                  "emails": request.POST.get("emails", ""), "enabled": data["enabled"]}  # fmt: skip

        def perform(checked: dict[str, Any]) -> AlertRule:
            secret = checked.pop("webhook_secret", None)
            return actions.do_save_rule(rule if rule.pk else None, webhook_secret=secret, **checked,
                                        **action_kwargs(request))  # fmt: skip

        saved, errors = save(
            request, AlertRuleSerializer, data, perform, instance=rule if rule.pk else None, fields=FIELDS
        )
        if saved is not None:
            messages.success(request, f"Alert rule {saved.name} saved.")
            return redirect("console:alerts")
    context = {
        "rule": rule if rule.pk else None,
        "values": values,
        "errors": errors,
        "kinds": AlertRule.Kind.choices,
        "live_workspaces": [],
    }
    return page(request, "console/alerts_rule_form.html", context, status=400 if errors else 200)


@admin_only
@require_POST
def rule_delete(request: HttpRequest, pk: int) -> HttpResponse:
    rule = get_object_or_404(AlertRule, pk=pk)
    actions.do_delete_rule(rule, **action_kwargs(request))
    messages.success(request, f"Alert rule {rule.name} deleted.")
    return redirect("console:alerts")


def _until(request: HttpRequest) -> Any:
    seconds = request.POST.get("for_s", "3600")
    try:
        return actions.silence_end(None, int(seconds))
    except ValueError:
        raise ActionError("Choose how long to silence it.") from None


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
        until = _until(request)
    except ActionError as exc:
        messages.error(request, exc.message)
        return redirect("console:alerts")
    do(target, until, **action_kwargs(request))
    messages.success(request, f"{name} silenced." if until else f"{name} no longer silenced.")
    return redirect("console:alerts")
