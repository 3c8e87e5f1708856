"""Pages in a real browser (Debian's Chromium through Playwright), at a desktop's and a phone's
width: styled, no sideways scrolling, and each table's cells stacked with their labels on the phone.
Each view is kept as a picture under var/screenshots/ for a person to look at."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from django.conf import settings as django_settings
from django.test import Client

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(django_settings.BASE_DIR) / "var" / "screenshots"
WIDTHS = {"1280": {"width": 1280, "height": 860}, "390": {"width": 390, "height": 844}}
STYLED = "() => getComputedStyle(document.querySelector('main')).paddingTop !== '0px'"
FITS = "() => document.documentElement.scrollWidth <= window.innerWidth + 1"
# On a phone a table's rows stack: each cell shows its column's name before its value (None: no table).
STACKED = (
    "() => { const td = document.querySelector('table.list td');"
    " return td ? getComputedStyle(td, '::before').content !== 'none' : null; }"
)


def look(
    base_url: str, visits: list[tuple[str, str, str]]
) -> dict[tuple[str, str], tuple[int, bool, bool, bool | None]]:
    """For each (session cookie, path, name): per width, its status and whether it is styled, fits
    and has stacked tables. Run in a thread of its own: Playwright's sync API leaves an event loop
    behind in the thread that runs it, which later asyncio tests in this process must not meet."""
    from playwright.sync_api import sync_playwright

    seen: dict[tuple[str, str], tuple[int, bool, bool, bool | None]] = {}
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
                    _fits(page),
                    page.evaluate(STACKED),
                )
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
            context.close()
        browser.close()
    return seen


def _fits(page: Any, tries: int = 20) -> bool:
    """Whether the page fits its width; asked again for a few seconds, as charts redraw for a new
    width a moment later (longer on a busy machine: up to ten seconds here)."""
    for _ in range(tries - 1):
        if page.evaluate(FITS):
            return True
        page.wait_for_timeout(500)
    return bool(page.evaluate(FITS))


def look_at(
    base_url: str, pages: list[tuple[Any, str, str]]
) -> dict[tuple[str, str], tuple[int, bool, bool, bool | None]]:
    """`look` at each (user, path, name), signed in as the user; in a thread of its own."""
    assert os.path.exists(CHROMIUM), "the page checks need Debian's Chromium: deploy/test.sh installs it"
    visits = []
    for user, path, name in pages:
        client = Client()
        client.force_login(user)
        visits.append((client.cookies["sessionid"].value, path, name))
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(look, base_url, visits).result()
