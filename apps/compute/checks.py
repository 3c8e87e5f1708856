"""Deployment checks of the compute side: ``manage.py check --deploy`` names an unsandboxed portal."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register


@register(Tags.security, deploy=True)
def check_sandbox(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if settings.PORTAL_SANDBOX == "off":
        return [
            Warning(
                "PORTAL_SANDBOX=off: local workloads run unsandboxed, with the portal's own rights.",
                hint="Unset PORTAL_SANDBOX (bwrap) unless this is a single-user workstation; see docs/security.md.",
                id="gpuportal.W001",
            )
        ]
    return []


@register(Tags.security, deploy=True)
def check_resource_limits(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if settings.PORTAL_RESOURCE_LIMITS == "off":
        return [
            Warning(
                "PORTAL_RESOURCE_LIMITS=off: local workloads run without CPU, memory or process limits.",
                hint="Unset PORTAL_RESOURCE_LIMITS (cgroup) unless this is a single-user workstation; "
                "see docs/security.md.",
                id="gpuportal.W002",
            )
        ]
    return []
