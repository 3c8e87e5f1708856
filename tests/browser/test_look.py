"""What a person sees first, at a desktop's and a phone's width, in the embedded default started as
`deploy/run.sh` starts it and in the production setup (PostgreSQL, Redis): the sign-in page, the
overview, the launch wizard, a job, the notebooks, the admin console and the error pages. Each page
is styled, fits the width (no sideways scrolling), and is kept as a picture (see
tests/browser/conftest.py SCREENSHOTS) for a person to look at."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import screenshot, sign_in
from tests.personas import PASSWORD, make_world

pytestmark = pytest.mark.slow
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
LIVE_S = 60_000

# True when the portal's stylesheet is applied to the page (main is padded only by it).
STYLED = "() => getComputedStyle(document.querySelector('main')).paddingTop !== '0px'"
FITS = "() => document.documentElement.scrollWidth <= window.innerWidth + 1"


def at_both_widths(page: Page, name: str) -> None:
    """The page as it is now, styled and fitting at 1280 px and at 390 px, kept as two pictures."""
    live = page.locator("#live-status")
    if live.count():
        expect(live).to_have_text("Live", timeout=LIVE_S)  # as a person sees it a moment after it loads
    for width, size in (("1280", DESKTOP), ("390", PHONE)):
        page.set_viewport_size(size)
        page.wait_for_timeout(500)  # charts follow the new width on their next frame
        assert page.evaluate(STYLED), f"{name}: the portal's stylesheet is not applied"
        assert page.evaluate(FITS), f"{name} scrolls sideways at {width} px"
        screenshot(page, f"{name}-{width}")
    page.set_viewport_size(DESKTOP)


@dataclass
class Site:
    name: str  # which setup: the pictures are kept under its name
    url: str
    admin: tuple[str, str]  # a platform admin, whose private workspace has the same name
    user: tuple[str, str]  # a user who is not an admin


@pytest.fixture(params=["embedded", "redis"])
def site(request: pytest.FixtureRequest, transactional_db: None) -> Site:
    if request.param == "embedded":
        embedded = request.getfixturevalue("embedded_portal")
        return Site("embedded", embedded.url, ("admin", embedded.password), ("demo", embedded.demo_password))
    portal = request.getfixturevalue("portal")
    request.getfixturevalue("_like_the_portal")  # passwords hashed as the portal checks them
    make_world()
    return Site("redis", portal.url, ("admin", PASSWORD), ("alice", PASSWORD))


def test_every_first_page_looks_right_at_desktop_and_phone_widths(page: Page, browser: Browser, site: Site) -> None:
    page.set_viewport_size(DESKTOP)
    admin, workspace = site.admin, site.admin[0]

    # Sign-in: the card stands in the middle of the page, not squeezed into a sidebar's column.
    page.goto(f"{site.url}/")
    card = page.locator(".login")
    box = card.bounding_box()
    assert box is not None and box["width"] >= 320, box
    assert abs((box["x"] + box["width"] / 2) - DESKTOP["width"] / 2) < 40, box  # centred
    at_both_widths(page, f"{site.name}-sign-in")

    # A signed-out visitor's 404 is the portal's, with a way back.
    page.goto(f"{site.url}/no/such/page/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Page not found")
    expect(page.get_by_role("link", name="Back to your workspaces")).to_be_visible()
    at_both_widths(page, f"{site.name}-error-404")

    sign_in(page, site.url, *admin)
    at_both_widths(page, f"{site.name}-overview")

    # The launch wizard at its size step.
    page.goto(f"{site.url}/w/{workspace}/instances/new/")
    page.get_by_label("Name").fill("box")
    page.get_by_label("Name").press("Enter")
    expect(page.locator('.steps li[aria-current="step"]')).to_have_text("Size")
    at_both_widths(page, f"{site.name}-wizard")

    # A job, from its form to Succeeded; its page is finished: no cancelling a job that ended.
    page.goto(f"{site.url}/w/{workspace}/jobs/new/")
    page.get_by_label("Name").fill("hello")
    page.get_by_label("Command").fill("for p in 0.5 0.9; do echo PROGRESS $p; sleep 1; done; echo done")
    page.get_by_role("button", name="Submit").click()
    expect(page.locator("#job-state [data-state]")).to_have_text("Succeeded", timeout=LIVE_S)
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
    expect(page.locator("#job-progress")).to_contain_text("100")
    at_both_widths(page, f"{site.name}-job")

    page.goto(f"{site.url}/w/{workspace}/notebooks/")
    at_both_widths(page, f"{site.name}-notebooks")

    page.goto(f"{site.url}/console/")
    expect(page.locator("#live-status")).to_have_text("Live", timeout=LIVE_S)
    at_both_widths(page, f"{site.name}-console")

    # A signed-in user's 404 is the same page (it tells nobody what exists elsewhere); a user who is
    # not an admin is told why the console is closed.
    page.goto(f"{site.url}/w/{workspace}/jobs/999999/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Page not found")
    expect(page.get_by_role("link", name="Back to your workspaces")).to_be_visible()
    other = browser.new_context(viewport=DESKTOP).new_page()
    sign_in(other, site.url, *site.user)
    response = other.goto(f"{site.url}/console/")
    assert response is not None and response.status == 403
    expect(other.get_by_role("heading", level=1)).to_have_text("You can't do that here")
    expect(other.locator(".error-page")).to_contain_text("The admin console is for platform admins.")
    at_both_widths(other, f"{site.name}-error-403")
