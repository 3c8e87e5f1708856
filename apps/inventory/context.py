"""Template context that every page gets: the maintenance windows that affect the user's work."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from apps.inventory.maintenance import upcoming_windows, window_summary
from apps.workspaces.access import workspace_ids


def maintenance(request: HttpRequest) -> dict[str, Any]:
    """The windows not yet over that affect work in the user's workspaces, as one line each (no
    workload named: the banner says when, where and why). Lazy: pages that show no banner pay no query."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}

    def lines() -> list[str]:
        return [window_summary(window) for window in upcoming_windows(workspace_ids(user))]

    return {"maintenance_windows": lines}
