"""Template context that every page gets (TEMPLATES' context_processors)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def sandbox(request: HttpRequest) -> dict[str, bool]:
    """Whether local workloads run unsandboxed (PORTAL_SANDBOX=off), so every page can warn about it.

    "off" is the explicit opt-out of a single-user workstation: user code then runs with the portal's
    own rights, which nobody should be able to miss.
    """
    return {"sandbox_off": getattr(settings, "PORTAL_SANDBOX", "bwrap") == "off"}
