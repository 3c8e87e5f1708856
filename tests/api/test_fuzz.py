"""The API fuzzed against its own OpenAPI schema (schemathesis): no server error, and no status,
content type, header or body outside the schema, as a member and as an admin, with a bounded
number of examples per operation, the same ones every run (derandomized: CI does not hang on luck).

Two of schemathesis's checks are left out, and why: ``positive_data_acceptance`` counts a 400 for
a request the schema allows as a failure, but the API refuses such requests for reasons a schema
cannot state (a workspace that does not exist, a quota); ``negative_data_rejection`` counts the
serializers' coercions (``0`` accepted for the string ``"0"``) as failures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from rest_framework.authtoken.models import Token
from schemathesis.specs.openapi import checks

from portal.wsgi import application
from tests.personas import make_world

schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
EXCLUDED = [checks.positive_data_acceptance, checks.negative_data_rejection]


@pytest.fixture(autouse=True)
def _one_connection() -> Iterator[None]:
    """Requests go through the WSGI application in the test's transaction, as Django's test client
    sends them: without closing the connection at each request's start and end."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def token(db: None, request: Any) -> str:
    world = make_world()
    user = world.admin if request.param == "admin" else world.alice
    return Token.objects.create(user=user).key


@pytest.mark.parametrize("token", ["member", "admin"], indirect=True)
@schema.parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_the_api_keeps_to_its_schema(case: Any, token: str) -> None:
    case.call_and_validate(headers={"Authorization": f"Token {token}"}, excluded_checks=EXCLUDED)
