"""A workspace's alerts: its alert rules, and every alert they raised, newest first. Anyone who can
see the workspace sees them (a rule's webhook URL is its owners' to see, its secret no one's); its
owners (and platform admins) create, change, delete and silence its rules and silence its alerts,
with the console's form (apps/alerts/forms.py) and the same actions as the API. Rules over every
workspace and the platform kinds are the console's: they never appear here."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone

from apps.alerts import actions
from apps.alerts.delivery import silenced
from apps.alerts.forms import SILENCES, WORKSPACE_KINDS, rule_form, silence
from apps.alerts.models import Alert, AlertRule
from apps.errors import ActionError
from apps.web.common import Errors, action_kwargs, page, signed_in, workspace_for
from apps.workspaces.access import MANAGE, VIEW, can
from apps.workspaces.models import Workspace

PER_PAGE = 50


def _rules(workspace: Workspace) -> QuerySet[AlertRule]:
    """The workspace's own rules: never one over every workspace, nor a platform kind."""
    return AlertRule.objects.filter(workspace=workspace).exclude(kind__in=AlertRule.ADMIN_KINDS)


def _posted(request: HttpRequest, rows: QuerySet[Any], name: str) -> Any:
    """The row of `rows` the form's `name` field names by id; any other is not found."""
    value = request.POST.get(name, "")
    return get_object_or_404(rows, pk=int(value) if value.isascii() and value.isdigit() else 0)


def _change(request: HttpRequest, workspace: Workspace, errors: Errors) -> str | None:
    """Apply one change from the page's buttons; the message to show once done, or None with `errors`."""
    what = request.POST.get("action", "")
    try:
        if what == "silence-alert":
            alert = _posted(request, Alert.objects.filter(rule__in=_rules(workspace)).select_related("rule"), "alert")
            return silence(request, alert, f"Alert {alert}", actions.do_silence_alert)
        if what in ("silence-rule", "delete"):
            rule = _posted(request, _rules(workspace).select_related("workspace"), "rule")
            if what == "silence-rule":
                return silence(request, rule, f"Rule {rule.name}", actions.do_silence_rule)
            actions.do_delete_rule(rule, **action_kwargs(request))
            return f"Alert rule {rule.name} deleted."
    except ActionError as exc:
        errors["form"] = [exc.message]
        return None
    errors["form"] = ["Unknown change."]
    return None


@signed_in
def alert_list(request: HttpRequest, ws: str) -> HttpResponse:
    # Another tenant's workspace: 404; a change by a member or a viewer: 403.
    workspace = workspace_for(request, ws, MANAGE if request.method == "POST" else VIEW)
    errors: Errors = {}
    done = _change(request, workspace, errors) if request.method == "POST" else None
    if done is not None:
        messages.success(request, done)
        return redirect("web:alerts", ws=workspace.name)
    now = timezone.now()
    rows = Alert.objects.filter(rule__in=_rules(workspace)).select_related("rule").order_by("-pending_since", "-id")
    page_obj = Paginator(rows, PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "workspace": workspace,
        "rules": _rules(workspace).order_by("name", "id"),
        "page_obj": page_obj,
        "alerts": [(a, silenced(a, now)) for a in page_obj],
        "may_manage": can(request.user, workspace, MANAGE),
        "silences": SILENCES,
        "now": now,
        "errors": errors,
    }
    return page(request, "web/alerts.html", context, status=400 if errors else 200)


@signed_in
def rule_edit(request: HttpRequest, ws: str, pk: int | None = None) -> HttpResponse:
    """Create a rule of the workspace (no id in the URL) or change one: its owners'."""
    workspace = workspace_for(request, ws, MANAGE)
    rule = get_object_or_404(_rules(workspace), pk=pk) if pk else AlertRule(workspace=workspace)
    saved, context = rule_form(request, rule, workspace=workspace, kinds=WORKSPACE_KINDS)
    if saved is not None:
        return redirect("web:alerts", ws=workspace.name)
    status = 400 if context["errors"] else 200
    return page(request, "web/alerts_rule_form.html", {**context, "workspace": workspace}, status=status)
