"""Sending alerts: one mail to the rule's addresses, one signed POST to its webhook.

Each channel is told once when an alert starts firing and once when it resolves (a reminder after
`PORTAL_ALERTS_REPEAT_S` while it keeps firing, unless that is 0); nothing while the alert or its
rule is silenced. A failure is kept on the alert (`last_delivery`, shown) and the channel is tried
again at the next evaluation; a resolved alert's notice is tried for a day. Nothing here raises to
the caller for a channel that fails, and each attempt is bounded (`WEBHOOK_TIMEOUT_S`, Django's
`EMAIL_TIMEOUT`), so delivery never stops the scheduler loop.

The webhook's body is JSON; `X-GPUPortal-Timestamp` is the Unix time of the sending and
`X-GPUPortal-Signature` is ``sha256=`` and the hex HMAC-SHA256, keyed with the rule's secret, of
the timestamp, a ".", and the raw body: a receiver recomputes it, compares in constant time, and
refuses a timestamp more than a few minutes old (a replay).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import EmailMessage
from django.template.loader import render_to_string
from django.urls import reverse

from apps.alerts.actions import private_address
from apps.alerts.models import Alert, AlertRule

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_S = 5.0
RESOLVED_NOTICE = timedelta(days=1)  # how long a resolved alert's notice is tried
SIGNATURE_HEADER = "X-GPUPortal-Signature"
TIMESTAMP_HEADER = "X-GPUPortal-Timestamp"


class Refused(Exception):
    """The webhook's target is not one this rule may reach."""


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature header's value: HMAC-SHA256 of "<timestamp>.<body>" with the secret."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def silenced(alert: Alert, now: datetime) -> bool:
    return any(until is not None and until > now for until in (alert.silenced_until, alert.rule.silenced_until))


def due(alert: Alert, now: datetime) -> tuple[str, list[str]]:
    """The status to tell ("firing" or "resolved") and the channels to tell it to now."""
    rule = alert.rule
    if alert.state == Alert.State.RESOLVED:
        return "resolved", [c for c in rule.channels if alert.delivered.get(c) == "firing"]
    if alert.state != Alert.State.FIRING:
        return "", []
    channels = [c for c in rule.channels if alert.delivered.get(c) != "firing"]
    repeat = settings.PORTAL_ALERTS_REPEAT_S
    if not channels and repeat and alert.notified_at and now - alert.notified_at >= timedelta(seconds=repeat):
        channels = rule.channels  # a reminder
    return "firing", channels


def deliver(alert: Alert, now: datetime) -> tuple[int, int]:
    """Send what is due for the alert; how many channels were told, and how many failed."""
    status, channels = due(alert, now)
    if not channels or silenced(alert, now):
        return 0, 0
    told = failed = 0
    for channel in channels:
        try:
            (send_email if channel == "email" else send_webhook)(alert, status, now)
        except Exception as error:  # refused, unreachable, timed out, answered an error...
            logger.warning("could not send alert %s by %s", alert.pk, channel, exc_info=True)
            alert.last_delivery[channel] = _attempt(now, status, f"{type(error).__name__}: {error}"[:500])
            failed += 1
            continue
        alert.last_delivery[channel] = _attempt(now, status, "")
        alert.delivered[channel] = status
        alert.notified_at = now
        told += 1
    Alert.objects.filter(pk=alert.pk).update(
        last_delivery=alert.last_delivery, delivered=alert.delivered, notified_at=alert.notified_at
    )
    return told, failed


def _attempt(now: datetime, status: str, error: str) -> dict[str, Any]:
    return {"at": now.isoformat(), "status": status, "ok": not error, "error": error}


def page_url(alert: Alert) -> str:
    """Where to see the alert: the console for a rule over every workspace, else the API."""
    base = settings.PORTAL_PUBLIC_URL.rstrip("/")
    if alert.rule.workspace_id is None:
        return base + reverse("console:alerts")
    return base + reverse("alert-detail", kwargs={"pk": alert.pk})


def payload(alert: Alert, status: str) -> dict[str, Any]:
    rule = alert.rule
    return {
        "alert": alert.pk,
        "status": status,
        "rule": {
            "id": rule.pk,
            "name": rule.name,
            "kind": rule.kind,
            "workspace": rule.workspace.name if rule.workspace else None,
        },
        "labels": alert.labels,
        "value": None if alert.value is None else str(alert.value),
        "threshold": str(rule.threshold),
        "started_at": (alert.firing_since or alert.pending_since).isoformat(),
        "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None,
        "url": page_url(alert),
    }


def describe(alert: Alert) -> str:
    """The condition in words: "queue wait 900 seconds (threshold 600 seconds)"."""
    rule = alert.rule
    unit = AlertRule.UNITS.get(AlertRule.Kind(rule.kind), "")
    if alert.value is None:
        return rule.get_kind_display()
    return f"{rule.get_kind_display().lower()} {alert.value} {unit} (threshold {rule.threshold} {unit})"


def send_email(alert: Alert, status: str, now: datetime) -> None:
    rule = alert.rule
    labels = ", ".join(f"{k}={v}" for k, v in sorted(alert.labels.items()) if v)
    subject = f"[{status.upper()}] {rule.name}" + (f": {labels}" if labels else "")
    context = {"alert": alert, "rule": rule, "status": status, "labels": sorted(alert.labels.items()),
               "what": describe(alert), "url": page_url(alert)}  # fmt: skip
    message = EmailMessage(
        subject=subject[:200], body=render_to_string("alerts/email.txt", context), to=list(rule.emails)
    )
    message.send()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A webhook's answer is not followed elsewhere: a redirect would slip past the address check."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirects)


def check_target(rule: AlertRule) -> None:
    """Refuse a webhook of a rule that may not reach private addresses whose host resolves to one."""
    if rule.webhook_private_ok or settings.PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS:
        return
    parts = urlsplit(rule.webhook_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = {info[4][0] for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
    if host == "localhost" or any(private_address(str(a)) for a in addresses):
        raise Refused(f"{host} is a loopback or private address, which this rule's webhook may not reach")


def send_webhook(alert: Alert, status: str, now: datetime) -> None:
    rule = alert.rule
    check_target(rule)
    body = json.dumps(payload(alert, status), separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    request = urllib.request.Request(
        rule.webhook_url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "gpu-portal-alerts",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(rule.webhook_secret, timestamp, body),
        },
    )
    try:
        with _opener.open(request, timeout=WEBHOOK_TIMEOUT_S) as response:
            response.read(65536)
            code = response.status
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"the webhook answered {error.code}") from None
    if not 200 <= code < 300:
        raise RuntimeError(f"the webhook answered {code}")
