from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from tests.personas import World


@pytest.fixture
def signed_in(world: World) -> Callable[[Any], Client]:
    """A browser-like client signed in as the user (session cookie, CSRF checks on)."""

    def make(user: Any) -> Client:
        client = Client(enforce_csrf_checks=False)
        client.force_login(user)
        return client

    return make


def queries(client: Client, url: str, **headers: str) -> int:
    """How many SQL queries one page costs (the page must answer 200)."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, headers=headers)
    assert response.status_code == 200, response.content[:500]
    return len(captured.captured_queries)


@pytest.fixture
def committed(django_capture_on_commit_callbacks: Any) -> Any:
    """Run what actions queue on commit (the inline scheduling cycle) as they would in production."""
    return lambda: django_capture_on_commit_callbacks(execute=True)
