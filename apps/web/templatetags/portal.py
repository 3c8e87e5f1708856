"""Small formatting helpers for the pages: GPU counts, durations, state badges."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django import template
from django.utils import timezone

register = template.Library()

# The tone of each state's badge: what the user should feel about it at a glance.
TONES = {
    "QUEUED": "wait", "PENDING": "wait", "ADMITTED": "busy", "PROVISIONING": "busy", "STARTING": "busy",
    "RUNNING": "ok", "READY": "ok", "SUCCEEDED": "done", "DELETING": "busy", "STOPPING": "busy",
    "FAILED": "bad", "PREEMPTED": "warn", "DEGRADED": "warn", "CANCELLED": "off", "DELETED": "off", "STOPPED": "off",
}  # fmt: skip


@register.filter
def tone(state: str) -> str:
    return TONES.get(state, "off")


@register.filter
def gpus(value: Decimal | float | int | None) -> str:
    """2.00 -> "2", 0.25 -> "0.25"."""
    if value is None:
        return "0"
    number = Decimal(str(value)).normalize()
    return f"{number:f}"


@register.filter
def gpus_of(count: Decimal | float | int | None, gpu_type: str | None) -> str:
    """How many GPUs of which type, the one way pages say it: (1, "h100") -> "1 × H100"."""
    return f"{gpus(count)} × {(gpu_type or 'GPU').upper()}"


@register.filter
def size(profile: Any) -> str:
    """A compute profile's size: "1 × H100, 8 CPU, 64 GB" ("2 CPU, 8 GB" without GPUs)."""
    held = f"{gpus_of(profile.gpu_count, profile.gpu_type)}, " if profile.gpu_count else ""
    return f"{held}{profile.cpu_cores} CPU, {profile.memory_gb} GB"


@register.filter
def duration(value: timedelta | float | int | None) -> str:
    """A short human duration: "3 h 12 min", "45 s"."""
    if value is None:
        return "—"
    seconds = int(value.total_seconds() if isinstance(value, timedelta) else value)
    if seconds < 60:
        return f"{max(seconds, 0)} s"
    minutes, _ = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


@register.filter
def until(moment: datetime | None) -> str:
    """How far ahead an estimated start is: "in 5 min"; "unknown" without one, and for one that has
    passed: the scheduler's next cycle, seconds later, replaces it (docs/scheduler.md), so a passed one
    is stale and says nothing of when the start will be."""
    if moment is None:
        return "unknown"
    delta = moment - timezone.now()
    return f"in {duration(delta)}" if delta.total_seconds() >= 1 else "unknown"


@register.filter
def percent(value: float | None) -> int:
    return 0 if value is None else max(0, min(100, round(value * 100)))


@register.filter
def get(mapping: dict[str, Any] | None, key: str) -> Any:
    return (mapping or {}).get(key)


@register.simple_tag
def field_id(name: str) -> str:
    return f"id_{name}"


SECTIONS = {"landing": "home", "dashboard": "dashboard", "usage": "dashboard"}


@register.simple_tag(takes_context=True)
def nav_section(context: dict[str, Any]) -> str:
    """Which entry of the navigation the page belongs to, from its URL's name."""
    request = context.get("request")
    match = getattr(request, "resolver_match", None)
    if match is None:
        return ""
    name = match.url_name or ""
    if context.get("member") is False:  # something shared with the user, in a workspace not theirs
        return "shared"
    if match.namespace == "console":
        return f"console-{name.split('-')[0]}"
    if name in SECTIONS:
        return SECTIONS[name]
    return name.split("-")[0].rstrip("s") + "s"
