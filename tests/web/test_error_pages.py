"""The error pages are the portal's own: its styles, a heading that says what happened and a link
home, for signed-out visitors and members alike; under /api/ they stay JSON."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client, RequestFactory

from portal import views
from tests.personas import World

SignedIn = Callable[[Any], Client]


def assert_portal_page(html: str, heading: str) -> None:
    assert '<link rel="stylesheet" href="/static/web/portal.css">' in html  # styled, not Django's bare page
    assert f'<h1 id="error-heading">{heading}</h1>' in html
    assert '<a class="btn btn-primary" href="/">' in html  # a way back


def test_a_page_that_does_not_exist_is_the_portals_404(world: World, signed_in: SignedIn) -> None:
    for client in (Client(), signed_in(world.alice)):
        response = client.get("/no/such/page/")
        assert response.status_code == 404
        assert_portal_page(response.content.decode(), "Page not found")
    # Another tenant's workload is as absent as one that never existed, and says nothing of which it is.
    charlie = signed_in(world.charlie)
    members_only = charlie.get("/w/team-a/jobs/")
    assert members_only.status_code == 404
    assert_portal_page(members_only.content.decode(), "Page not found")
    assert members_only.content == charlie.get("/w/no-such-team/jobs/").content  # byte for byte


def test_a_refusal_is_the_portals_403_and_says_why(world: World, signed_in: SignedIn) -> None:
    response = signed_in(world.alice).get("/console/")
    assert response.status_code == 403
    html = response.content.decode()
    assert_portal_page(html, "You can't do that here")
    assert "The admin console is for platform admins." in html


def test_an_expired_form_is_explained(world: World) -> None:
    client = Client(enforce_csrf_checks=True)
    response = client.post("/login/", {"username": "alice", "password": "x"})
    assert response.status_code == 403
    assert_portal_page(response.content.decode(), "This form has expired")


@pytest.mark.django_db
def test_a_server_error_is_the_portals_500_without_the_requests_context() -> None:
    response = views.server_error(RequestFactory().get("/w/team-a/"))
    assert response.status_code == 500
    assert_portal_page(response.content.decode(), "Something went wrong on our side")
    api = views.server_error(RequestFactory().get("/api/v1/jobs/"))
    assert api.status_code == 500 and api["Content-Type"] == "application/json"


def test_the_sign_in_page_takes_the_full_width_without_a_side_navigation(world: World) -> None:
    html = Client().get("/login/").content.decode()
    assert 'class="shell shell-bare"' in html and "sidenav" not in html
