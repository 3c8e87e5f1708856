"""Changing alert rules and silencing alerts: every change checked here and audited.

The caller has checked the acting user's role (a workspace's owner for its rules, a platform admin
for rules over every workspace); these actions check what spans fields or reads the settings:
a rule about every workspace, or a platform kind, is an admin's; a webhook is http(s), and a
workspace owner's may not point at a loopback, private or other non-public address, however
written or resolved, unless `PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS` is on (apps/alerts/targets.py;
delivery resolves and checks again, and connects to what it checked: apps/alerts/delivery.py);
a rule's name is one short line of text, and the addresses an owner adds are its members' (the
portal mails no one else on a tenant's word).
"""

from __future__ import annotations

import unicodedata
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.alerts import targets
from apps.alerts.models import Alert, AlertRule
from apps.audit.actions import SYSTEM, Origin, apply_changes, do_log_event
from apps.audit.events import Event
from apps.errors import ActionError
from apps.names import GPU_TYPE_RE
from apps.workspaces.models import Workspace

EDITABLE = (
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
)
DEFAULT_SILENCE_S = 3600
MAX_NAME = 100
MAX_SILENCE_S = 30 * 86400


def is_admin(user: Any) -> bool:
    return bool(
        getattr(user, "is_authenticated", False) and user.is_staff and getattr(user, "workspace_scope", None) is None
    )


def check_webhook_url(url: str, *, private_ok: bool) -> None:
    """Refuse a webhook URL that is not http(s)://host[...], or, unless `private_ok`, whose host is
    or resolves to an address a tenant's webhook may not reach (apps/alerts/targets.py); a name
    that does not resolve now is checked at each delivery."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ActionError("Give an http:// or https:// URL.", field="webhook_url") from None
    if parts.scheme not in ("http", "https") or not host or any(c.isspace() or ord(c) < 32 for c in url):
        raise ActionError("Give an http:// or https:// URL.", field="webhook_url")
    if private_ok:
        return
    if targets.loopback_name(host):
        raise ActionError("A webhook may not point at this host (loopback).", field="webhook_url")
    literal = targets.literal_address(host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            addresses = targets.resolve(host, port)
        except (OSError, UnicodeError):
            return  # not resolvable now: each delivery resolves and checks it
    try:
        targets.check_addresses(host, addresses)
    except targets.Refused:
        raise ActionError(
            "A webhook may not point at a loopback, private, link-local or other non-public address.",
            field="webhook_url",
        ) from None


def check_rule_name(name: str) -> None:
    """A rule's name goes into mail subjects and bodies: a short line of text, no control characters."""
    if not name.strip():
        raise ActionError("Give the rule a name.", field="name")
    if len(name) > MAX_NAME:
        raise ActionError(f"A rule's name is at most {MAX_NAME} characters.", field="name")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name):
        raise ActionError("A rule's name is one line of text, without control characters.", field="name")


def member_addresses(workspace: Workspace) -> set[str]:
    """The email addresses (lowercase) of the workspace's active members: its members of any role,
    the user it is assigned to and the people of the group it is assigned to. A user's address is
    one a platform admin set, the identity provider vouched for, or an invitation's link proved:
    users cannot change their own."""
    people = Q(memberships__workspace=workspace)
    if workspace.assigned_user_id is not None:
        people |= Q(pk=workspace.assigned_user_id)
    if workspace.assigned_group_id is not None:
        people |= Q(groups=workspace.assigned_group_id)
    users = get_user_model().objects.filter(people, is_active=True).exclude(email="")
    return {address.lower() for address in users.values_list("email", flat=True)}


def check_recipients(rule: AlertRule, added: list[str]) -> None:
    """The addresses added to a workspace's rule by someone other than a platform admin must be its
    members' (`member_addresses`): the portal mails no one else on a tenant's word."""
    if not added:
        return
    allowed = member_addresses(rule.workspace) if rule.workspace is not None else set()
    others = [address for address in added if address.lower() not in allowed]
    if others:
        raise ActionError(
            f"{', '.join(others)}: alerts go only to the addresses of this workspace's members.", field="emails"
        )


def _check(rule: AlertRule, acting_user: Any, *, added_emails: list[str]) -> None:
    admin = is_admin(acting_user)
    check_rule_name(rule.name)
    if rule.kind in AlertRule.ADMIN_KINDS:
        if not admin:
            raise ActionError("Only platform admins may define this kind of rule.", field="kind")
        if rule.workspace_id is not None:
            raise ActionError("This kind of rule is about the whole platform: leave the workspace out.",
                              field="workspace")  # fmt: skip
    elif rule.workspace_id is None and not admin:
        raise ActionError("Give the workspace: rules over every workspace are platform admins'.", field="workspace")
    if rule.gpu_type and not GPU_TYPE_RE.match(rule.gpu_type):
        raise ActionError("A GPU type is a short lowercase name such as 'h100' or 'a100-80gb'.", field="gpu_type")
    if rule.kind == AlertRule.Kind.QUOTA_USED and rule.threshold > 1000:
        raise ActionError("A share of the quota is a percentage, at most 1000.", field="threshold")
    if rule.kind == AlertRule.Kind.GPU_IDLE and not 0 < rule.threshold <= 100:
        raise ActionError("Give the utilisation, in percent, under which held GPUs are idle: 1 to 100.",
                          field="threshold")  # fmt: skip
    for address in rule.emails:
        try:
            validate_email(address)
        except ValidationError:
            raise ActionError(f"{address!r} is not an email address.", field="emails") from None
    if len({address.lower() for address in rule.emails}) != len(rule.emails):
        raise ActionError("An address is given twice.", field="emails")
    if not admin:
        check_recipients(rule, added_emails)
    if rule.webhook_url:
        check_webhook_url(
            rule.webhook_url, private_ok=rule.webhook_private_ok or settings.PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS
        )
        if not rule.webhook_secret:
            raise ActionError("Give the webhook's shared secret (16 characters or more).", field="webhook_secret")


def do_save_rule(
    rule: AlertRule | None,
    *,
    acting_user: Any,
    origin: Origin = SYSTEM,
    webhook_secret: str | None = None,
    **fields: Any,
) -> AlertRule:
    """Create a rule (`rule` None) or change one. `webhook_secret` None keeps the one set; "" with
    the webhook's URL left out removes both."""
    creating = rule is None
    rule = rule or AlertRule(created_by=acting_user if getattr(acting_user, "is_authenticated", False) else None)
    unknown = set(fields) - set(EDITABLE)
    if unknown:
        raise TypeError(f"not a rule's field: {sorted(unknown)}")
    if "emails" in fields:
        fields["emails"] = [str(e).strip() for e in fields["emails"]]
    if "webhook_url" in fields:
        fields["webhook_url"] = (fields["webhook_url"] or "").strip()
    old_url, old_emails, old_workspace = rule.webhook_url, rule.emails, rule.workspace_id
    changed = apply_changes(rule, fields)
    if webhook_secret is not None and webhook_secret != rule.webhook_secret:
        rule.webhook_secret = webhook_secret
        changed["webhook_secret"] = "(changed)"
    if not rule.webhook_url:
        rule.webhook_secret = ""
    if creating or rule.webhook_url != old_url:
        rule.webhook_private_ok = is_admin(acting_user)
    # Addresses to check: the new ones, or all of them where the rule moves to another workspace.
    kept = {address.lower() for address in old_emails} if rule.workspace_id == old_workspace and not creating else set()
    _check(rule, acting_user, added_emails=[address for address in rule.emails if address.lower() not in kept])
    with transaction.atomic():
        rule.save()
        if creating:
            changed = {k: v for k, v in changed.items() if k != "webhook_secret"}
        if creating or changed:
            do_log_event(
                Event.ALERT_RULE_CREATE if creating else Event.ALERT_RULE_UPDATE,
                rule,
                acting_user=acting_user,
                origin=origin,
                workspace=rule.workspace,
                data={"kind": rule.kind, **({} if creating else {"changed": changed})},
            )
    return rule


def do_delete_rule(rule: AlertRule, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    with transaction.atomic():
        do_log_event(Event.ALERT_RULE_DELETE, rule, acting_user=acting_user, origin=origin, workspace=rule.workspace,
                     data={"name": rule.name, "kind": rule.kind})  # fmt: skip
        rule.delete()


def silence_end(until: datetime | None, for_s: int | None, now: datetime | None = None) -> datetime | None:
    """When a silence asked for with `until` or `for_s` ends: None (lifted) for `for_s` 0, an hour
    from now if neither is given."""
    now = now or timezone.now()
    if until is not None and for_s is not None:
        raise ActionError("Give `until` or `for_s`, not both.", field="until")
    if until is not None:
        if until <= now:
            raise ActionError("Give a time in the future.", field="until")
        if until > now + timedelta(seconds=MAX_SILENCE_S):
            raise ActionError("A silence lasts at most 30 days.", field="until")
        return until
    if for_s == 0:
        return None
    return now + timedelta(seconds=DEFAULT_SILENCE_S if for_s is None else for_s)


def do_silence_rule(rule: AlertRule, until: datetime | None, *, acting_user: Any, origin: Origin = SYSTEM) -> AlertRule:
    """Deliver none of the rule's alerts until `until` (None: lift the silence)."""
    with transaction.atomic():
        AlertRule.objects.filter(pk=rule.pk).update(silenced_until=until)
        rule.silenced_until = until
        do_log_event(Event.ALERT_RULE_SILENCE, rule, acting_user=acting_user, origin=origin, workspace=rule.workspace,
                     data={"until": until.isoformat() if until else None})  # fmt: skip
    return rule


def do_silence_alert(alert: Alert, until: datetime | None, *, acting_user: Any, origin: Origin = SYSTEM) -> Alert:
    """Deliver nothing of this alert until `until` (None: lift the silence); it is still listed."""
    with transaction.atomic():
        Alert.objects.filter(pk=alert.pk).update(silenced_until=until)
        alert.silenced_until = until
        do_log_event(Event.ALERT_SILENCE, alert, acting_user=acting_user, origin=origin,
                     workspace=alert.rule.workspace, data={"until": until.isoformat() if until else None})  # fmt: skip
    return alert
