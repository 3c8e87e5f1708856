"""The usage report pages in a real browser (Debian's Chromium through Playwright), at a desktop's
and a phone's width: styled, no sideways scrolling, and each table's cells stacked with their
labels on the phone. Each view is kept as a picture under var/screenshots/ for a person to look at."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import Client

from tests.accounting import history
from tests.personas import make_world

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(django_settings.BASE_DIR) / "var" / "screenshots"
WIDTHS = {"1280": {"width": 1280, "height": 860}, "390": {"width": 390, "height": 844}}
STYLED = "() => getComputedStyle(document.querySelector('main')).paddingTop !== '0px'"
FITS = "() => document.documentElement.scrollWidth <= window.innerWidth + 1"
# On a phone a table's rows stack: each cell shows its column's name before its value.
STACKED = "() => getComputedStyle(document.querySelector('table.list td'), '::before').content !== 'none'"


def _look(base_url: str, visits: list[tuple[str, str, str]]) -> dict[tuple[str, str], tuple[int, bool, bool, bool]]:
    """For each (session cookie, path, name): per width, its status and whether it is styled, fits
    and has stacked tables. Run in a thread of its own: Playwright's sync API leaves an event loop
    behind in the thread that runs it, which later asyncio tests in this process must not meet."""
    from playwright.sync_api import sync_playwright

    seen: dict[tuple[str, str], tuple[int, bool, bool, bool]] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
        for session, path, name in visits:
            context = browser.new_context()
            context.add_cookies([{"name": "sessionid", "value": session, "url": base_url}])
            page = context.new_page()
            response = page.goto(f"{base_url}{path}")
            for width, size in WIDTHS.items():
                page.set_viewport_size(size)
                page.wait_for_timeout(200)
                seen[name, width] = (
                    response.status if response else 0,
                    page.evaluate(STYLED),
                    page.evaluate(FITS),
                    page.evaluate(STACKED),
                )
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
            context.close()
        browser.close()
    return seen


def test_the_usage_pages_look_right_at_both_widths(transactional_db: None, live_server: Any, settings: Any) -> None:
    assert os.path.exists(CHROMIUM), "the page checks need Debian's Chromium: deploy/test.sh installs it"
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    world = make_world()
    month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    for n, (workspace, user) in enumerate([(world.team_a, world.alice), (world.team_a, world.bob)] * 3):
        history.job(workspace, user, [(month + timedelta(hours=n), month + timedelta(hours=3 * n + 1))], gpus=n + 1)
    history.instance(world, world.team_b, world.charlie, month, None, gpu_type="a100", gpus=Decimal("0.5"))
    visits = []
    for user, path, name in [
        (world.admin, "/console/usage/", "console-usage"),
        (world.alice, "/w/team-a/usage/report/", "workspace-usage"),
    ]:
        client = Client()
        client.force_login(user)
        visits.append((client.cookies["sessionid"].value, path, name))
    with ThreadPoolExecutor(max_workers=1) as pool:
        seen = pool.submit(_look, live_server.url, visits).result()
    for (name, width), (status, styled, fits, stacked) in seen.items():
        assert status == 200, name
        assert styled, f"{name}: the stylesheet is not applied"
        assert fits, f"{name} scrolls sideways at {width} px"
        assert stacked == (width == "390"), f"{name} at {width} px"
    assert len(seen) == 4
