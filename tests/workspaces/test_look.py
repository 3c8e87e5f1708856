"""The workspace's page with its disk panel, and the console's workspace form with the disk quota, in
a real browser (tests/look.py), at a desktop's and a phone's width."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from apps.workspaces.models import GIB, Workspace, WorkspaceDisk
from tests.look import look_at
from tests.personas import make_world

pytestmark = pytest.mark.slow


def test_the_workspace_disk_looks_right_at_both_widths(transactional_db: None, live_server: Any, settings: Any) -> None:
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    world = make_world()
    Workspace.objects.filter(pk=world.team_a.pk).update(disk_gb=40)  # lowered while its disk is in use
    largest = [("job-1842", 31 * GIB), ("instance-17", 9 * GIB + (300 << 20)), ("datasets", 2 * GIB)]
    largest.append(("job-1790", 41 << 20))
    WorkspaceDisk.objects.create(
        workspace=world.team_a,
        size_bytes=49 * GIB + (800 << 20),
        used_bytes=45 * GIB,
        largest=[{"name": name, "bytes": size} for name, size in largest],
        note="stays 50 GB until no workload uses it, then shrinks to 40 GB if its files fit",
        measured_at=timezone.now(),
    )
    seen = look_at(
        live_server.url,
        [
            (world.alice, "/w/team-a/", "workspace-disk"),
            (world.admin, "/console/workspaces/team-a/", "console-workspace-disk"),
        ],
    )
    for (name, width), (status, styled, fits, stacked) in seen.items():
        assert status == 200, name
        assert styled, f"{name}: the stylesheet is not applied"
        assert fits, f"{name} scrolls sideways at {width} px"
        assert stacked in (width == "390", None), f"{name} at {width} px"
    assert len(seen) == 4
