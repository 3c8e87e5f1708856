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
