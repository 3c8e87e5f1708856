"""The admin console's What-if replay page in a real browser, against the portal as it runs in
production (web, Celery worker, scheduler loop; PostgreSQL and Redis): an admin asks what more quota
for team-b would do, the worker replays the recorded history in the background, and the page shows
the figures side by side and hands out the CSV. Kept as pictures at 1280 and 390 px."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Portal, off_the_loop, sign_in
from tests.browser.test_look import at_both_widths
from tests.personas import PASSWORD, make_world
from tests.scheduling.test_whatif import contended_day

pytestmark = pytest.mark.slow


def test_an_admin_compares_more_quota_with_today_on_the_what_if_page(page: Page, portal: Portal, settings: Any) -> None:
    # The history is recorded by the test's own cycles: the portal's worker leaves it alone.
    settings.PORTAL_SCHEDULER_TRIGGER = settings.PORTAL_WORKLOAD_TRIGGER = "off"
    world = off_the_loop(make_world)
    off_the_loop(contended_day, world)
    settings.PORTAL_WORKLOAD_TRIGGER = "task"  # the replay goes to the portal's worker, as in production

    sign_in(page, portal.url, "admin", PASSWORD)
    page.goto(f"{portal.url}/console/")
    page.get_by_role("link", name="What-if replay").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("What-if replay")
    page.get_by_label("Submitted from").fill("2026-11-02 09:00")
    page.get_by_label("Until").fill("2026-11-03 09:00")
    page.get_by_label("Quota changes").fill("team-b=lots")
    page.get_by_role("button", name="Run replay").click()
    expect(page.get_by_text("the quota must be +N, -N or N whole GPUs")).to_be_visible()
    at_both_widths(page, "console-whatif-form")

    page.get_by_label("Quota changes").fill("team-b=+4")
    page.get_by_role("button", name="Run replay").click()
    table = page.get_by_role("table").filter(has_text="Mean wait")
    expect(table).to_be_visible(timeout=60_000)  # the page refreshes itself until the worker is done
    team_b = table.get_by_role("row").filter(has_text="team-b")
    expect(team_b.get_by_role("cell").nth(3)).to_contain_text("1 h")  # what-if mean wait: an hour
    expect(team_b.get_by_role("cell").nth(3)).to_contain_text("today 1 h 30 min")
    expect(page.get_by_text("quota of team-b: +4 GPUs")).to_be_visible()
    at_both_widths(page, "console-whatif-result")

    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV").click()
    text = Path(download.value.path()).read_text()
    assert text.startswith("workspace,jobs_baseline,jobs_whatif,")
    assert "\nteam-b,4,4,0,0,5400," in text  # four jobs in both; 1 h 30 min of mean wait today
