"""Template context that every page gets (TEMPLATES' context_processors)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def sandbox(request: HttpRequest) -> dict[str, bool]:
    """Whether local workloads run unsandboxed (PORTAL_SANDBOX=off), without resource limits
    (PORTAL_RESOURCE_LIMITS=off) or without disk quotas (PORTAL_DISK_QUOTA=off), so every page can
    warn about it.

    "off" is the explicit opt-out of a single-user workstation: user code then runs with the portal's
    own rights, or may take the whole machine, which nobody should be able to miss.
    """
    return {
        "sandbox_off": getattr(settings, "PORTAL_SANDBOX", "bwrap") == "off",
        "limits_off": getattr(settings, "PORTAL_RESOURCE_LIMITS", "cgroup") == "off",
        "disk_quota_off": getattr(settings, "PORTAL_DISK_QUOTA", "on") == "off",
    }
