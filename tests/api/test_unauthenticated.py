"""Requests without valid credentials get 401 and a challenge (RFC 9110), never a bare 403."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.personas import World


@pytest.mark.parametrize("header", [None, "Token not-a-token", "Token "])
def test_it_answers_401_with_a_challenge_without_valid_credentials(world: World, header: str | None) -> None:
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get("/api/v1/jobs/")

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    assert response.json()["error"]["code"] in ("not_authenticated", "authentication_failed")


def test_a_signed_in_browser_still_gets_in_with_its_session(world: World) -> None:
    client = APIClient()
    client.force_login(world.alice)
    assert client.get("/api/v1/jobs/").status_code == 200


def test_a_path_no_route_matches_answers_in_the_apis_error_shape(world: World) -> None:
    client = APIClient()
    client.force_login(world.alice)

    response = client.get("/api/v1/jobs/not-a-number/")

    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "not_found"
    assert client.get("/no-such-page/").status_code == 404  # pages keep theirs


@pytest.mark.parametrize("size", ["0", "501", "ten", "null"])
def test_a_bad_page_size_is_a_400_naming_it(world: World, size: str) -> None:
    client = APIClient()
    client.force_login(world.alice)

    response = client.get("/api/v1/jobs/", {"page_size": size})

    assert response.status_code == 400
    assert "page_size" in response.json()["error"]["fields"]
    assert client.get("/api/v1/jobs/", {"page_size": "500"}).status_code == 200
