"""Small formatting helpers for the pages: GPU counts, durations, state badges."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django import template
from django.utils import timezone

from apps import sizes

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
    return sizes.gpus_text(value)


@register.filter
def gpus_of(count: Decimal | float | int | None, gpu_type: str | None) -> str:
    """How many GPUs of which type, the one way pages say it: (1, "h100") -> "1 × H100"."""
    return sizes.gpus_of(count, gpu_type)


@register.filter
def size(profile: Any) -> str:
    """A compute profile's size: "1 × H100, 8 CPU, 64 GB" ("2 CPU, 8 GB" without GPUs)."""
    return str(profile.size_label)


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


# What each step of a start is called on a workload's page (apps/workloads/progress.py).
STEP_LABELS = {
    "queued": "Waiting",
    "environment": "Python environment",
    "starting": "Starting",
    "answering": "Waiting for an answer",
}


@register.filter
def start_progress(workload: Any) -> dict[str, Any]:
    """A workload's start as its page shows it: its steps (each with a ``label`` and, once ended,
    how long it ``took``), whether one is still under way (``open``) and how long the whole start
    took once it ended (``took``)."""
    from apps.workloads.api import start_steps

    steps = start_steps(workload)
    for step in steps:
        step["label"] = STEP_LABELS.get(step["step"], step["step"].title())
        ended = step["ended_at"]
        step["took"] = _seconds((ended - step["started_at"]).total_seconds()) if ended else ""
        step["usually"] = _seconds(step["expected_s"]) if step.get("expected_s") is not None else ""
    open_ = bool(steps) and steps[-1]["ended_at"] is None
    took = "" if open_ or not steps else _seconds((steps[-1]["ended_at"] - steps[0]["started_at"]).total_seconds())
    return {"steps": steps, "open": open_, "took": took}


def _seconds(value: float) -> str:
    """A step's length: "0.4 s", "12 s", "2 min 39 s"."""
    if value < 10:
        return f"{max(value, 0):.1f} s"
    minutes, seconds = divmod(int(round(value)), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"
