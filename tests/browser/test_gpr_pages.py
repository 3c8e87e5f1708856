"""GPU reservations in a real browser against the live portal (see conftest.py), at a desktop's and a
phone's width: alice asks for more GPUs than her workspace's policy approves by itself (the form's
estimate says so as she types), an admin approves it with fewer GPUs in the console, the approval
mail reaches her (a real SMTP server), its link opens the request's page, where the scheduler's loop
has begun the reservation, and she releases it early. The calendar shows it meanwhile.

No work runs inside the reservation here: a job sent to one is the SDK's and the scheduler's tests'.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from apps.provisioning.models import ProvisioningRequest
from tests.browser.conftest import Portal, sign_in
from tests.browser.test_rayclusters import LIVE_S, at_both_widths, watch
from tests.mail import Mailbox, body_of, smtp_server
from tests.personas import PASSWORD, World, make_world

pytestmark = pytest.mark.slow
State = ProvisioningRequest.State


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    with smtp_server() as box:
        yield box


@pytest.fixture
def portal_settings(mailbox: Mailbox) -> dict[str, str]:
    """The portal mails decisions to a real SMTP server on loopback."""
    return {"EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(mailbox.port), "EMAIL_USE_TLS": "false"}


@pytest.fixture
def people(portal: Portal) -> World:
    return make_world()


def state_becomes(page: Page, label: str, timeout_s: float = LIVE_S / 1000) -> None:
    """The request's page shows `label`, reloaded until it does (the page is not live)."""
    deadline = time.monotonic() + timeout_s
    badge = page.locator("#gpr-state [data-state]")
    while badge.inner_text() != label:
        assert time.monotonic() < deadline, f"the request stayed {badge.inner_text()}"
        page.wait_for_timeout(500)
        page.reload()


def ask_for_gpus(page: Page, portal: Portal) -> str:
    """Alice fills in the form; the estimate says when and who decides before she sends it."""
    page.goto(f"{portal.url}/w/team-a/")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="GPU reservations", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("GPU reservations")
    expect(page.get_by_role("heading", name="No open requests")).to_be_visible()
    page.get_by_role("link", name="Request GPUs").first.click()
    estimate = page.locator("#gpr-estimate")
    expect(estimate).to_contain_text("Approved at once by the workspace's policy", timeout=LIVE_S)
    page.get_by_label("GPUs", exact=True).fill("9")
    expect(page.locator('[data-estimate-error="gpus"]')).to_contain_text("could ever hold", timeout=LIVE_S)
    page.get_by_label("GPUs", exact=True).fill("6")
    page.get_by_label("Duration").fill("2")
    page.get_by_label("Unit").select_option("days")
    expect(estimate).to_contain_text("Earliest feasible start: now, 6 H100 on local", timeout=LIVE_S)
    expect(estimate).to_contain_text("Left to an admin: longer than the 24 hours")
    expect(page.locator('[data-estimate-error="gpus"]')).to_be_hidden()
    page.get_by_label("Justification").fill("Fine-tune the 70B model on the new corpus before Monday's review.")
    at_both_widths(page, "gpr-new")
    page.get_by_role("button", name="Request GPUs").click()
    expect(page.locator(".flash")).to_contain_text("it waits for an admin's decision")
    expect(page.locator("#gpr-state [data-state]")).to_have_text("Requested")
    return page.url


def approve_in_the_console(page: Page, portal: Portal, pk: int) -> None:
    """The admin sees what approving it would displace, and approves five of the six GPUs."""
    admin = page.context.browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        console = admin.new_page()
        problems: list[str] = []
        watch(console, problems)
        sign_in(console, portal.url, "admin", PASSWORD)
        console.goto(f"{portal.url}/console/gprs/")
        row = console.locator(f'[data-gpr="{pk}"]')
        expect(row).to_contain_text("6 × H100 for 2 d")
        expect(row.locator("[data-displaces]")).to_contain_text("no running work")
        expect(row).to_contain_text("Fine-tune the 70B model")
        at_both_widths(console, "gpr-console-queue")
        row.get_by_label("GPUs (fewer)").fill("5")
        row.get_by_label("Note to the requester (optional)").fill("Five are free this week; the sixth is booked.")
        row.get_by_role("button", name="Approve").click()
        expect(console.locator(".flash")).to_contain_text(f"Request {pk} was approved")
        expect(console.get_by_role("heading", name="Nothing waits for a decision")).to_be_visible()
        console.goto(f"{portal.url}/console/gprs/calendar/")
        expect(console.locator(f'[data-reservation="{pk}"]')).to_contain_text("5 × H100")
        at_both_widths(console, "gpr-console-calendar")
        assert not problems, json.dumps(problems, indent=1)
    finally:
        admin.close()


def test_a_request_is_approved_by_an_admin_mailed_and_released_early(
    page: Page, portal: Portal, people: World, mailbox: Mailbox
) -> None:
    problems: list[str] = []
    watch(page, problems)
    sign_in(page, portal.url, "alice", PASSWORD)
    request_url = ask_for_gpus(page, portal)
    gpr = ProvisioningRequest.objects.get()
    assert (gpr.state, gpr.gpus, gpr.duration_s) == (State.REQUESTED, 6, 2 * 86400)
    at_both_widths(page, "gpr-requested")

    approve_in_the_console(page, portal, gpr.pk)
    [mail] = mailbox.wait_for(1)
    assert mail["To"] == "alice@example.org" and f"GPR {gpr.pk} approved: 5 h100" in mail["Subject"]
    link = re.search(r"(http://\S+/w/team-a/gprs/\d+/)", body_of(mail))
    assert link and link.group(1).endswith(request_url.split(portal.url, 1)[1])
    assert "Five are free this week" in body_of(mail)

    page.goto(link.group(1))
    state_becomes(page, "Active")  # the scheduler's loop begins it: its start has come
    expect(page.locator("#gpr-use")).to_contain_text("0 of 5 GPUs")
    expect(page.locator("#gpr-devices tbody tr")).to_have_count(5)
    expect(page.locator("#gpr-timeline li")).to_have_count(4)  # requested, pending, approved, began
    at_both_widths(page, "gpr-active")

    page.get_by_role("navigation", name="Main").get_by_role("link", name="GPU reservations", exact=True).click()
    expect(page.locator(f'[data-gpr="{gpr.pk}"]')).to_contain_text("0 of 5")
    at_both_widths(page, "gpr-list")
    page.get_by_role("link", name="Calendar").click()
    expect(page.locator(f'[data-reservation="{gpr.pk}"]')).to_contain_text("team-a")
    at_both_widths(page, "gpr-calendar")

    page.goto(link.group(1))
    page.get_by_role("link", name="Release early…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Release reservation #{gpr.pk} early?")
    page.get_by_role("button", name="Release the GPUs").click()
    expect(page.locator(".flash")).to_contain_text("its GPUs went back to everyone")
    expect(page.locator("#gpr-state [data-state]")).to_have_text("Released early")
    expect(page.get_by_role("link", name="Release early…")).to_have_count(0)
    at_both_widths(page, "gpr-released")
    gpr.refresh_from_db()
    assert gpr.state == State.RELEASED and gpr.ended_at is not None
    assert not problems, json.dumps(problems, indent=1)
