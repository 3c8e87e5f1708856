"""The usage report pages in a real browser (tests/look.py), at a desktop's and a phone's width."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from tests.accounting import history
from tests.look import look_at
from tests.personas import make_world

pytestmark = pytest.mark.slow


def test_the_usage_pages_look_right_at_both_widths(transactional_db: None, live_server: Any, settings: Any) -> None:
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    world = make_world()
    month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    for n, (workspace, user) in enumerate([(world.team_a, world.alice), (world.team_a, world.bob)] * 3):
        history.job(workspace, user, [(month + timedelta(hours=n), month + timedelta(hours=3 * n + 1))], gpus=n + 1)
    history.instance(world, world.team_b, world.charlie, month, None, gpu_type="a100", gpus=Decimal("0.5"))
    seen = look_at(
        live_server.url,
        [
            (world.admin, "/console/usage/", "console-usage"),
            (world.alice, "/w/team-a/usage/report/", "workspace-usage"),
        ],
    )
    for (name, width), (status, styled, fits, stacked) in seen.items():
        assert status == 200, name
        assert styled, f"{name}: the stylesheet is not applied"
        assert fits, f"{name} scrolls sideways at {width} px"
        assert stacked == (width == "390"), f"{name} at {width} px"
    assert len(seen) == 4
