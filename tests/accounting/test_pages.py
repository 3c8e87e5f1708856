"""The usage report pages: the admin console's, for every workspace, and a workspace's own, for its
owners."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.workspaces.models import Workspace
from tests.accounting import history
from tests.personas import World

NOV = datetime(2026, 11, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)
CONSOLE = "/console/usage/"
OWNER = "/w/team-a/usage/report/"


@pytest.fixture
def usage(world: World) -> World:
    """In November: alice 2 H100-hours and bob 2 A100-hours in team-a, charlie 0.5 H100-hours in
    team-b (and 1.5 more in December)."""
    history.job(world.team_a, world.alice, [(NOV + timedelta(days=3), NOV + timedelta(days=3, hours=2))])
    history.instance(
        world, world.team_a, world.bob, NOV + timedelta(days=9), NOV + timedelta(days=9, hours=4),
        gpu_type="a100", gpus=Decimal("0.5"), notebooks=2,
    )  # fmt: skip
    history.job(world.team_b, world.charlie, [(DEC - timedelta(minutes=15), DEC + timedelta(minutes=45))], gpus=2)
    return world


def browser(user: Any | None = None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def _text(response: Any) -> str:
    return re.sub(r"\s+", " ", response.content.decode())


def _row(text: str, name: str) -> list[str]:
    """The cells of the table row named `name`, as text."""
    match = re.search(rf'<tr data-row="{re.escape(name)}">(.*?)</tr>', text)
    assert match, name
    return re.sub(r"<[^>]+>", " ", match.group(1)).split()


class TestConsolePage:
    def test_it_is_for_platform_admins_only(self, usage: World) -> None:
        assert browser(usage.alice).get(CONSOLE).status_code == 403
        anonymous = browser().get(CONSOLE)
        assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
        assert browser(usage.admin).get(CONSOLE).status_code == 200

    def test_it_shows_a_month_by_workspace_and_gpu_type_with_totals(self, usage: World) -> None:
        response = browser(usage.admin).get(CONSOLE, {"month": "2026-11"})
        text = _text(response)
        assert 'aria-current="page">GPU usage</a>' in text
        assert '<option value="2026-11" selected>Nov 2026</option>' in text
        # Columns: a100, h100, total.
        assert _row(text, "team-a") == ["team-a", "2.00", "2.00", "4.00"]
        assert _row(text, "team-b") == ["team-b", "0.00", "0.50", "0.50"]
        assert _row(text, "total") == ["Total", "2.00", "2.50", "4.50"]
        for label in ("Workspace", "a100", "h100", "Total", "User", "GPU type", "GPU-hours"):
            assert f'data-label="{label}"' in text
        assert '<td data-label="User">bob</td>' in text
        assert 'href="/api/v1/usage/?month=2026-11&amp;format=csv"' in text
        assert 'href="?month=2026-10"' in text
        # The month after it is offered once it has begun, never before.
        assert ('href="?month=2026-12"' in text) == (timezone.now() >= datetime(2026, 12, 1, tzinfo=UTC))

    def test_its_csv_link_downloads_the_same_month(self, usage: World) -> None:
        admin = browser(usage.admin)
        response = admin.get("/api/v1/usage/", {"month": "2026-12", "format": "csv"})
        assert response.status_code == 200
        assert response.content.decode().splitlines()[1:] == ["2026-12,team-b,charlie,h100,1.500000,5400.000000000,"]

    def test_it_says_when_a_month_had_no_use(self, usage: World) -> None:
        text = _text(browser(usage.admin).get(CONSOLE, {"month": "2025-01"}))
        assert "No GPU use in 2025-01" in text

    @pytest.mark.parametrize("month", ["2026-13", "november", "0999-01"])
    def test_it_refuses_a_month_that_is_not_one(self, usage: World, month: str) -> None:
        response = browser(usage.admin).get(CONSOLE, {"month": month})
        assert response.status_code == 400
        assert "Give a month as YYYY-MM" in _text(response)

    def test_it_costs_the_same_queries_for_many_workspaces(self, usage: World) -> None:
        admin = browser(usage.admin)
        few = _queries(admin, CONSOLE + "?month=2026-11")
        for n in range(25):
            workspace = Workspace.objects.create(name=f"lab-{n}")
            history.job(workspace, usage.alice, [(NOV + timedelta(hours=n), NOV + timedelta(hours=n + 1))])
            history.instance(usage, workspace, usage.bob, NOV, DEC, gpu_type="l4", notebooks=1)
        assert _queries(admin, CONSOLE + "?month=2026-11") == few


class TestOwnerPage:
    def test_an_owner_sees_their_workspace_only(self, usage: World) -> None:
        response = browser(usage.alice).get(OWNER, {"month": "2026-11"})
        assert response.status_code == 200
        text = _text(response)
        assert _row(text, "alice") == ["alice", "0.00", "2.00", "2.00"]
        assert _row(text, "bob") == ["bob", "2.00", "0.00", "2.00"]
        assert _row(text, "total") == ["Total", "2.00", "2.00", "4.00"]
        assert "charlie" not in text and "0.50" not in text
        assert 'href="/api/v1/usage/?month=2026-11&amp;workspace=team-a&amp;format=csv"' in text

    def test_it_costs_the_same_queries_for_much_work(self, usage: World) -> None:
        alice = browser(usage.alice)
        few = _queries(alice, OWNER + "?month=2026-11")
        for n in range(25):
            history.job(usage.team_a, usage.bob, [(NOV + timedelta(hours=n), NOV + timedelta(hours=n + 1))], gpus=n)
            history.instance(usage, usage.team_a, usage.alice, NOV, DEC, gpu_type=f"t{n}", notebooks=1)
        assert _queries(alice, OWNER + "?month=2026-11") == few

    def test_its_csv_link_gives_their_workspace_only(self, usage: World) -> None:
        alice = browser(usage.alice)
        text = alice.get("/api/v1/usage/", {"month": "2026-11", "workspace": "team-a", "format": "csv"})
        assert [line.split(",")[1] for line in text.content.decode().splitlines()[1:]] == ["team-a", "team-a"]

    def test_a_platform_admin_may_look(self, usage: World) -> None:
        assert browser(usage.admin).get(OWNER).status_code == 200

    @pytest.mark.parametrize("persona", ["bob", "victor"])
    def test_members_and_viewers_are_refused(self, usage: World, persona: str) -> None:
        assert browser(getattr(usage, persona)).get(OWNER).status_code == 403

    def test_another_tenant_finds_nothing(self, usage: World) -> None:
        assert browser(usage.charlie).get(OWNER).status_code == 404
        assert browser(usage.alice).get("/w/team-b/usage/report/").status_code == 404

    def test_it_asks_who_you_are(self, usage: World) -> None:
        response = browser().get(OWNER)
        assert response.status_code == 302 and response["Location"].startswith("/login/")

    def test_it_refuses_a_month_that_is_not_one(self, usage: World) -> None:
        response = browser(usage.alice).get(OWNER, {"month": "2026-13"})
        assert response.status_code == 400
        assert 'aria-invalid="true"' in _text(response)


def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured.captured_queries)


def test_the_dashboard_leads_owners_alone_to_the_report(world: World) -> None:
    for user, shown in ((world.alice, True), (world.bob, False), (world.victor, False)):
        client = Client()
        client.force_login(user)
        page = client.get("/w/team-a/").content.decode()
        assert ("/w/team-a/usage/report/" in page) is shown, user
