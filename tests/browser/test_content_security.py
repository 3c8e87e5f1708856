"""The pages under their Content-Security-Policy in a real browser: every page a user and an admin
open works, live updates included, and Chromium reports no violation of the policy. The portal runs
with PORTAL_SANDBOX=off here, so every page also shows the warning that says so."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import Portal, screenshot
from tests.personas import PASSWORD, World, make_world

pytestmark = pytest.mark.slow
LIVE_S = 30_000  # ms: a worker start and a scheduling cycle

# Runs in every document before its own scripts (Playwright's init scripts are not subject to the
# page's policy): each violation becomes a console error the test reads.
REPORT_VIOLATIONS = """document.addEventListener("securitypolicyviolation", (e) => console.error("CSP violation " +
  JSON.stringify({directive: e.effectiveDirective, blocked: e.blockedURI, source: e.sourceFile})));"""
# A script written into the page: the policy must refuse it.
INLINE_SCRIPT = """() => {
  const script = document.createElement("script");
  script.text = "window.ran = 1";
  document.body.append(script);
}"""


def expected(url: str, violation: dict[str, str]) -> bool:
    """Redoc's bundle writes perfect-scrollbar's style before Redoc can hand its style elements the
    nonce, and shows its vendor's logo from the vendor's site: the policy refuses both, harmlessly
    (a native scrollbar, no logo, no request to a third party)."""
    if urlsplit(url).path != "/api/redoc/":
        return False
    scrollbar = violation["directive"] == "style-src-elem" and "/redoc.standalone." in violation["source"]
    logo = violation["directive"] == "img-src" and violation["blocked"].startswith("https://cdn.redoc.ly/")
    return scrollbar or logo


def watch(page: Page, problems: list[str]) -> None:
    """Collect what the policy refuses on the page, and any script error (htmx's included)."""
    page.add_init_script(REPORT_VIOLATIONS)

    def on_console(message: Any) -> None:
        if message.type != "error":
            return
        if message.text.startswith("CSP violation "):
            violation = json.loads(message.text.removeprefix("CSP violation "))
            if not expected(page.url, violation):
                problems.append(f"{page.url}: {violation}")
        elif "htmx" in message.text:
            problems.append(f"{page.url}: {message.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(f"{page.url}: {error}"))


@pytest.fixture
def unsandboxed(transactional_db: None, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Portal:
    """The live portal, started with the sandbox's opt-out."""
    monkeypatch.setenv("PORTAL_SANDBOX", "off")
    portal: Portal = request.getfixturevalue("portal")
    return portal


def sign_in(page: Page, portal: Portal, username: str) -> None:
    page.goto(f"{portal.url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Welcome")


def open_page(page: Page, portal: Portal, path: str, heading: str) -> None:
    page.goto(f"{portal.url}{path}")
    expect(page.get_by_role("heading", level=1)).to_contain_text(heading)
    assert page.evaluate("document.querySelectorAll('style').length") == 0, f"{path}: a <style> was injected"


def test_the_pages_work_under_their_policy_and_warn_that_workloads_run_unsandboxed(
    page: Page, browser: Browser, unsandboxed: Portal
) -> None:
    portal = unsandboxed
    world: World = make_world()
    problems: list[str] = []
    watch(page, problems)

    sign_in(page, portal, "alice")
    # The watch sees what the policy refuses: here, a script written into the page.
    page.evaluate(INLINE_SCRIPT)
    for _ in range(50):  # the violation's event comes a moment later
        if problems:
            break
        page.wait_for_timeout(100)
    assert page.evaluate("window.ran") is None
    assert len(problems) == 1 and "'directive': 'script-src-elem'" in problems[0], problems
    problems.clear()
    expect(page.get_by_role("alert")).to_contain_text("Workloads are not sandboxed")
    expect(page.locator("#live-status")).to_have_text("Live", timeout=LIVE_S)  # ws: of the same host is 'self'
    page.get_by_label("Workspace").select_option("team-a")  # live.js submits the switcher
    expect(page).to_have_url(f"{portal.url}/w/team-a/")
    expect(page.locator("[data-chart-url]")).to_have_attribute("data-loaded", re.compile(r"\d+"))
    meter = page.get_by_role("meter", name="h100 GPUs in use")
    expect(meter).to_be_visible()
    # Styled to its row's width (a live update may swap the dashboard's body in meanwhile: measure again).
    page.wait_for_function(
        "() => [...document.querySelectorAll('meter')].some((m) => m.getBoundingClientRect().width > 100)"
    )

    # A job's page follows it live: its part of the page listens for the job's own event.
    page.goto(f"{portal.url}/w/team-a/jobs/new/")
    page.get_by_label("Name").fill("strict-page")
    page.get_by_label("Command").fill("echo hello from a strict page; echo PROGRESS 0.5; sleep 1")
    page.get_by_label("GPUs per replica").fill("1")
    page.get_by_role("button", name="Submit").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("strict-page")
    page.evaluate("window.__not_reloaded = true")
    expect(page.locator("#job-state [data-state]")).to_have_text("Succeeded", timeout=LIVE_S)
    assert page.evaluate("window.__not_reloaded") is True
    expect(page.locator("#job-log")).to_contain_text("hello from a strict page", timeout=LIVE_S)
    screenshot(page, "csp-job-unsandboxed")

    for path, heading in [
        ("/", "Welcome"),
        ("/w/team-a/jobs/", "Jobs"),
        ("/w/team-a/jobs/?tab=queue", "Jobs"),
        ("/w/team-a/instances/", "Instances"),
        ("/w/team-a/notebooks/", "Notebooks"),
    ]:
        open_page(page, portal, path, heading)
    open_page(page, portal, "/w/team-a/instances/new/", "Launch an instance")
    page.get_by_label("Name").fill("box")
    page.get_by_role("button", name="Next").click()
    expect(page.locator('[data-profile="gpu-1"]')).to_be_visible()

    # The API docs: Swagger UI (its set-up runs with the response's nonce) and Redoc.
    page.goto(f"{portal.url}/api/docs/")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("GPU Portal API", timeout=LIVE_S)
    expect(page.locator(".opblock").first).to_be_visible()
    screenshot(page, "csp-api-docs")
    page.goto(f"{portal.url}/api/redoc/")
    expect(page.get_by_role("heading", level=1)).to_contain_text("GPU Portal API", timeout=LIVE_S)
    screenshot(page, "csp-redoc")

    # The admin console and Django's admin.
    page.goto(f"{portal.url}/")
    page.locator(".usermenu summary").click()
    page.get_by_role("button", name="Sign out").click()
    sign_in(page, portal, "admin")
    open_page(page, portal, "/console/", "Cluster dashboard")
    expect(page.locator("[data-chart-url]")).to_have_attribute("data-loaded", re.compile(r"\d+"))
    expect(page.get_by_role("alert")).to_contain_text("PORTAL_SANDBOX=bwrap")
    screenshot(page, "csp-console-unsandboxed")
    for path, heading in [
        ("/console/profiles/", "Profiles"),
        ("/console/workspaces/team-a/", "team-a"),
        ("/console/inventory/", "GPU inventory"),
        ("/console/people/", "Users and groups"),
    ]:
        open_page(page, portal, path, heading)
    page.goto(f"{portal.url}/admin/auth/user/")
    expect(page.locator("#result_list")).to_contain_text("alice")

    # At a phone's width the warning wraps and nothing scrolls sideways.
    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True).new_page()
    watch(phone, problems)
    sign_in(phone, portal, world.charlie.username)
    expect(phone.get_by_role("alert")).to_contain_text("Workloads are not sandboxed")
    assert phone.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    screenshot(phone, "csp-landing-phone-unsandboxed")

    assert not problems, "\n".join(problems)
