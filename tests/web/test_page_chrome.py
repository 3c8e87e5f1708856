"""What every page carries around its content: the icon browsers ask for, and the live indicator
of the pages that update themselves (and of none other)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.contrib.staticfiles import finders
from django.test import Client
from django.utils import timezone

from apps.accounting.queries import Month
from tests.personas import World

SignedIn = Callable[[Any], Client]
LIVE_DOT = 'id="live-status"'


def test_favicon_ico_leads_to_the_icon_every_page_links(world: World, signed_in: SignedIn) -> None:
    response = Client().get("/favicon.ico")  # browsers ask for it signed in or not
    assert response.status_code == 302
    assert response["Location"] == "/static/web/favicon.svg"
    icon = finders.find("web/favicon.svg")
    assert icon and Path(icon).read_text(encoding="utf-8").startswith("<svg")
    for page in (Client().get("/login/"), signed_in(world.alice).get("/w/team-a/")):
        assert '<link rel="icon" href="/static/web/favicon.svg" type="image/svg+xml">' in page.content.decode()


def test_only_pages_that_update_themselves_show_the_live_indicator(world: World, signed_in: SignedIn) -> None:
    """A page of no workspace's work (the API tokens) has nothing to be live about: no indicator,
    rather than one that says "Not live" as if something were broken."""
    alice = signed_in(world.alice)
    tokens = alice.get("/tokens/").content.decode()
    assert 'data-live-workspaces=""' in tokens and LIVE_DOT not in tokens
    for url in ("/", "/w/team-a/", "/w/team-a/jobs/"):
        assert LIVE_DOT in alice.get(url).content.decode(), url
    # The console hears the whole cluster, with no workspace named.
    assert LIVE_DOT in signed_in(world.admin).get("/console/").content.decode()


def test_the_usage_reports_offer_no_month_to_come(world: World, signed_in: SignedIn) -> None:
    """This month's report links the month before and not the next, which has not begun; a past
    month's links both."""
    this = Month.of(timezone.now())
    pages = ((signed_in(world.admin), "/console/usage/"), (signed_in(world.alice), "/w/team-a/usage/report/"))
    for client, url in pages:
        now = client.get(url).content.decode()
        assert f'href="?month={this.shifted(-1).label}" rel="prev"' in now, url
        assert 'rel="next"' not in now and f"?month={this.shifted(1).label}" not in now, url
        before = client.get(url, {"month": this.shifted(-2).label}).content.decode()
        assert f'href="?month={this.shifted(-1).label}" rel="next"' in before, url
