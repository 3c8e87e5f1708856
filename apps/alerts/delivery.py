"""Sending alerts: one mail to the rule's addresses, one signed POST to its webhook.

Each channel is told once when an alert starts firing and once when it resolves (a reminder after
`PORTAL_ALERTS_REPEAT_S` while it keeps firing, unless that is 0); nothing while the alert or its
rule is silenced. A failure is kept on the alert (`last_delivery`, shown) as a coarse reason
("delivery failed: timed out"): what a webhook's target answered is not shown to the tenant, so
that a webhook cannot serve to probe the portal's network. The channel is tried again at the next
evaluation; a resolved alert's notice is tried for a day. Nothing here raises to the caller for a
channel that fails, and each attempt is bounded (`WEBHOOK_TIMEOUT_S`, Django's
`EMAIL_TIMEOUT`), so delivery never stops the scheduler loop.

A webhook's name is resolved once per delivery, every address checked (apps/alerts/targets.py),
and the POST goes to the first of them, with the URL's Host and, for https, a certificate verified
for the name: a name that answers differently the second time (DNS rebinding) leads nowhere else.

The webhook's body is JSON; `X-GPUPortal-Timestamp` is the Unix time of the sending and
`X-GPUPortal-Signature` is ``sha256=`` and the hex HMAC-SHA256, keyed with the rule's secret, of
the timestamp, a ".", and the raw body: a receiver recomputes it, compares in constant time, and
refuses a timestamp more than a few minutes old (a replay).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
import smtplib
import ssl
import time
import unicodedata
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import EmailMessage
from django.template.loader import render_to_string
from django.urls import reverse

from apps.alerts import targets
from apps.alerts.models import Alert, AlertRule

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_S = 5.0
RESOLVED_NOTICE = timedelta(days=1)  # how long a resolved alert's notice is tried
SIGNATURE_HEADER = "X-GPUPortal-Signature"
TIMESTAMP_HEADER = "X-GPUPortal-Timestamp"


class DeliveryFailed(Exception):
    """A channel could not be told; its message is the coarse reason shown with the alert."""


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
            reason = f"delivery failed: {error}" if isinstance(error, DeliveryFailed) else "delivery failed"
            alert.last_delivery[channel] = _attempt(now, status, reason)
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
    """Where a person sees the alert: the console's alerts page for a rule over every workspace,
    else its workspace's alerts page."""
    base = settings.PORTAL_PUBLIC_URL.rstrip("/")
    if alert.rule.workspace_id is None:
        return base + reverse("console:alerts")
    return base + reverse("web:alerts", kwargs={"ws": alert.rule.workspace.name})


def api_url(alert: Alert) -> str:
    """The alert in the API (`/api/v1/alerts/<id>/`), for a program."""
    return settings.PORTAL_PUBLIC_URL.rstrip("/") + reverse("alert-detail", kwargs={"pk": alert.pk})


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
        # A label that does not apply is left out, never sent empty (as alerts evaluated before
        # labels were left out may still hold).
        "labels": {key: value for key, value in alert.labels.items() if value != ""},
        "value": None if alert.value is None else str(alert.value),
        "threshold": str(rule.threshold),
        "started_at": (alert.firing_since or alert.pending_since).isoformat(),
        "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None,
        "url": page_url(alert),
        "api_url": api_url(alert),
    }


def describe(alert: Alert) -> str:
    """The condition in words: "queue wait 900 seconds (threshold 600 seconds)"."""
    rule = alert.rule
    unit = AlertRule.UNITS.get(AlertRule.Kind(rule.kind), "")
    if alert.value is None:
        return rule.get_kind_display()
    return f"{rule.get_kind_display().lower()} {alert.value} {unit} (threshold {rule.threshold} {unit})"


def plain_name(rule: AlertRule) -> str:
    """The rule's name as mails show it: quoted, on one line (a name saved before names were
    checked may hold control characters: they become spaces)."""
    name = "".join(" " if unicodedata.category(c)[0] in "CZ" and c != " " else c for c in rule.name)
    return f'"{name.strip()[:100]}"'


def send_email(alert: Alert, status: str, now: datetime) -> None:
    """One plain-text mail to the rule's addresses (its members', apps/alerts/actions.py), the
    rule's name quoted in the subject and the body. `DeliveryFailed` with a coarse reason."""
    rule = alert.rule
    name = plain_name(rule)
    labels = ", ".join(f"{k}={v}" for k, v in sorted(alert.labels.items()) if v)
    subject = f"[{status.upper()}] Alert rule {name}" + (f": {labels}" if labels else "")
    context = {"alert": alert, "rule": rule, "name": name, "status": status, "labels": sorted(alert.labels.items()),
               "what": describe(alert), "url": page_url(alert)}  # fmt: skip
    message = EmailMessage(
        subject=subject[:200], body=render_to_string("alerts/email.txt", context), to=list(rule.emails)
    )
    try:
        message.send()
    except TimeoutError:
        raise DeliveryFailed("timed out") from None
    except smtplib.SMTPException:
        raise DeliveryFailed("the mail server refused it") from None
    except OSError:
        raise DeliveryFailed("connection failed") from None


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to an address already resolved and checked, whose certificate is verified for the
    URL's host name (sent as the TLS server name), not for the address."""

    def __init__(self, address: str, port: int, *, server_hostname: str, timeout: float) -> None:
        self.tls = ssl.create_default_context()
        super().__init__(address, port, timeout=timeout, context=self.tls)
        self.server_hostname = server_hostname

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP to the pinned address
        self.sock = self.tls.wrap_socket(self.sock, server_hostname=self.server_hostname)


def webhook_addresses(rule: AlertRule) -> tuple[str, int, list[Any]]:
    """The webhook's host, port and the addresses to connect to: one resolution, each address
    checked (`Refused` for one this rule may not reach) unless the rule may reach private ones."""
    parts = urlsplit(rule.webhook_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    checked = not (rule.webhook_private_ok or settings.PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS)
    if checked and targets.loopback_name(host):
        raise targets.Refused("refused address")
    literal = targets.literal_address(host)
    addresses: list[Any] = [str(literal)] if literal is not None else targets.resolve(host, port)
    if checked:
        targets.check_addresses(host, addresses)
    return host, port, addresses


def send_webhook(alert: Alert, status: str, now: datetime) -> None:
    """POST the signed payload to the address the webhook's name resolved to and passed the check,
    with the URL's Host and, for https, its name's certificate; no redirect is followed. Raises
    `DeliveryFailed` with a coarse reason: what the target answered is not the tenant's to read."""
    rule = alert.rule
    try:
        host, port, addresses = webhook_addresses(rule)
    except targets.Refused:
        raise DeliveryFailed("refused address") from None
    except (OSError, UnicodeError):
        raise DeliveryFailed("connection failed") from None
    body = json.dumps(payload(alert, status), separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    parts = urlsplit(rule.webhook_url)
    headers = {
        "Host": parts.netloc.rpartition("@")[2],
        "Content-Type": "application/json",
        "User-Agent": "gpu-portal-alerts",
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: sign(rule.webhook_secret, timestamp, body),
    }
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    code = _post(parts.scheme, addresses[0], port, host, target, body, headers)
    if not 200 <= code < 300:
        raise DeliveryFailed("HTTP error")


def _post(scheme: str, address: str, port: int, host: str, target: str, body: bytes, headers: dict[str, str]) -> int:
    """One POST to `address`: the answer's status (its body read, at most 64 KiB, and dropped)."""
    connection: http.client.HTTPConnection
    if scheme == "https":
        connection = _PinnedHTTPSConnection(address, port, server_hostname=host, timeout=WEBHOOK_TIMEOUT_S)
    else:
        connection = http.client.HTTPConnection(address, port, timeout=WEBHOOK_TIMEOUT_S)
    try:
        connection.request("POST", target, body=body, headers=headers)
        response = connection.getresponse()
        response.read(65536)
        return response.status
    except TimeoutError:
        raise DeliveryFailed("timed out") from None
    except (OSError, http.client.HTTPException):
        raise DeliveryFailed("connection failed") from None
    finally:
        connection.close()
