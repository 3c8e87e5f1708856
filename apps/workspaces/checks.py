"""Deployment checks of the workspaces: ``manage.py check --deploy`` names a portal whose
workspaces write without a disk quota."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register


@register(Tags.security, deploy=True)
def check_disk_quota(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if settings.PORTAL_DISK_QUOTA == "off":
        return [
            Warning(
                "PORTAL_DISK_QUOTA=off: local workloads write without a disk quota; one can fill the machine's disk.",
                hint="Unset PORTAL_DISK_QUOTA (on) and run the portal as root; see docs/security.md.",
                id="gpuportal.W003",
            )
        ]
    return []
