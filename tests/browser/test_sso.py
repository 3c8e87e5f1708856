"""Single sign-on in a real browser, against a real OpenID Connect provider on loopback (tests/idp):
a person goes to a workspace page, is sent to sign in, signs in at the provider, lands on the page
they asked for with the workspaces their provider groups give; signing out ends the provider's
session too (its logout page, then back to the portal's sign-in); a group removed at the provider
takes the workspace away at the next sign-in."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Portal, screenshot
from tests.idp import identity_provider
from tests.personas import make_world
from tests.proxy import free_port

pytestmark = pytest.mark.slow
PROVIDER = "Example University"


@pytest.fixture
def idp_port() -> int:
    return free_port()


@pytest.fixture
def portal_settings(idp_port: int) -> dict[str, str]:
    from tests.idp import CLIENT_ID, CLIENT_SECRET

    return {
        "PORTAL_OIDC_ISSUER": f"http://127.0.0.1:{idp_port}",
        "PORTAL_OIDC_CLIENT_ID": CLIENT_ID,
        "PORTAL_OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "PORTAL_OIDC_SCOPES": "openid email profile groups",
        "PORTAL_OIDC_PROVIDER_NAME": PROVIDER,
        "PORTAL_BREAK_GLASS_ADMIN": "admin",
    }


def at_the_provider(page: Page, login: str) -> None:
    page.get_by_role("link", name=f"Sign in with {PROVIDER}").click()
    page.locator("input[name=login]").fill(login)  # the provider's own form
    page.locator("input[name=password]").fill("any password")
    page.get_by_role("button", name="Sign-in").click()


def test_a_person_signs_in_and_out_through_the_provider(
    page: Page, portal: Portal, idp_port: int, tmp_path: Path
) -> None:
    make_world()
    with identity_provider(
        tmp_path, port=idp_port, redirect_uris=[f"{portal.url}/sso/callback/"], logout_uris=[f"{portal.url}/login/"]
    ) as idp:
        idp.person("nora", groups=["team-a"], given_name="Nora")
        page.goto(f"{portal.url}/w/team-a/")
        expect(page.get_by_role("link", name=f"Sign in with {PROVIDER}")).to_be_visible()
        screenshot(page, "sso-sign-in", live=False)
        page.set_viewport_size({"width": 390, "height": 844})
        screenshot(page, "sso-sign-in-phone", live=False)
        page.set_viewport_size({"width": 1280, "height": 860})

        at_the_provider(page, "nora")
        expect(page).to_have_url(f"{portal.url}/w/team-a/")  # where she was going
        expect(page.get_by_role("heading", level=1)).to_have_text("Dashboard")
        expect(page.locator(".crumbs")).to_contain_text("team-a")
        screenshot(page, "sso-signed-in")

        page.locator(".usermenu summary").click()
        page.get_by_role("button", name="Sign out").click()
        page.get_by_role("button", name="Yes, sign me out").click()  # the provider's logout page
        expect(page).to_have_url(f"{portal.url}/login/")
        page.goto(f"{portal.url}/w/team-a/")
        expect(page.get_by_role("link", name=f"Sign in with {PROVIDER}")).to_be_visible()  # signed out here

        idp.person("nora", groups=[])  # out of team-a at the provider
        at_the_provider(page, "nora")  # the provider asks again: its session ended too
        expect(page.get_by_role("heading", level=1)).to_have_text("Page not found")
