"""The alert rule form and the Silence buttons, shared by the admin console's alerts page
(apps/console/alerts.py) and a workspace's alerts page (apps/web/alerts.py).

The form is parsed with the API's serializer and saved with `do_save_rule`, and a silence's length
is checked with the API's `SilenceSerializer`, so a page refuses what the API refuses (an owner's
webhook to a private address included), in the same words, next to the field.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import HttpRequest

from apps.alerts import actions
from apps.alerts.api import AlertRuleSerializer, SilenceSerializer
from apps.alerts.models import AlertRule
from apps.console.forms import form_data, save
from apps.errors import ActionError
from apps.web.common import Errors, action_kwargs
from apps.workspaces.models import Workspace

TEXT = ("name", "kind", "gpu_type", "threshold", "window_s", "for_s", "webhook_url", "webhook_secret")
SILENCES = ((3600, "1 hour"), (4 * 3600, "4 hours"), (86400, "1 day"), (7 * 86400, "1 week"))
# The kinds of a workspace's own rules: the others are about the whole platform, and platform admins'.
WORKSPACE_KINDS = [(value, label) for value, label in AlertRule.Kind.choices if value not in AlertRule.ADMIN_KINDS]


def rule_values(rule: AlertRule) -> dict[str, Any]:
    """What the form shows of a rule (a new one: the defaults); never its secret."""
    values: dict[str, Any] = {name: getattr(rule, name) for name in TEXT if name != "webhook_secret"}
    values.update(
        workspace=rule.workspace.name if rule.workspace else "",
        emails="\n".join(rule.emails),
        enabled=rule.enabled if rule.pk else True,
        kind=rule.kind or AlertRule.Kind.QUEUE_WAIT,
    )
    return values


def _posted(request: HttpRequest, text: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The POSTed form as the API's body would carry it, and as typed, to show again."""
    data = form_data(request, text, flags=("enabled",), nullable=("workspace",))
    emails = request.POST.get("emails", "")
    data["emails"] = [e.strip() for e in emails.replace(",", "\n").split("\n") if e.strip()]
    data.setdefault("gpu_type", "")
    data.setdefault("webhook_url", "")
    typed = {name: request.POST.get(name, "") for name in text if name != "webhook_secret"}
    return data, {**typed, "emails": emails, "enabled": data["enabled"]}


def rule_form(
    request: HttpRequest,
    rule: AlertRule,
    *,
    workspace: Workspace | None = None,
    kinds: list[tuple[str, Any]] = AlertRule.Kind.choices,
) -> tuple[AlertRule | None, dict[str, Any]]:
    """Show the form for `rule` (unsaved: a new one) and, on POST, save it: the rule saved (with a
    message said), or None; and the form's context (`rule`, `values`, `errors`, `kinds`).

    With `workspace`, the rule is that workspace's whatever the form says, and the form has no
    workspace field; without, its `workspace` field names one (empty: every workspace). A kind
    the form does not offer is refused next to the field.
    """
    existing = rule if rule.pk else None
    values = rule_values(rule)
    errors: Errors = {}
    saved = None
    if request.method == "POST":
        text = TEXT if workspace is not None else ("workspace", *TEXT)
        data, typed = _posted(request, text)
        values.update(typed)
        fixed = {} if workspace is None else {"workspace": workspace}

        def perform(checked: dict[str, Any]) -> AlertRule:
            if checked.get("kind", rule.kind) not in dict(kinds):
                raise ActionError("Choose one of the kinds offered.", field="kind")
            secret = checked.pop("webhook_secret", None)
            return actions.do_save_rule(
                existing, webhook_secret=secret, **{**checked, **fixed}, **action_kwargs(request)
            )

        fields = {*text, "emails", "enabled"}
        saved, errors = save(request, AlertRuleSerializer, data, perform, instance=existing, fields=fields)
        if saved is not None:
            messages.success(request, f"Alert rule {saved.name} saved.")
    return saved, {"rule": existing, "values": values, "errors": errors, "kinds": kinds}


def silence_until(for_s: str) -> datetime | None:
    """When a silence of `for_s` seconds (as the form sends it; "0" lifts it) ends, checked as the
    API checks its `for_s`."""
    body = SilenceSerializer(data={"for_s": for_s})
    if not body.is_valid():
        raise ActionError("Choose how long to silence it.", field="for_s")
    until: datetime | None = body.end()
    return until


def silence(request: HttpRequest, target: Any, name: str, do: Any) -> str:
    """Silence an alert or a rule with `do` for the time the form asks (0: lift it); what to say."""
    until = silence_until(request.POST.get("for_s", str(actions.DEFAULT_SILENCE_S)))
    do(target, until, **action_kwargs(request))
    return f"{name} silenced." if until else f"{name} no longer silenced."
