"""The API fuzzed against its own OpenAPI schema (schemathesis) with every check on: no server
error; no status, content type, header or body outside the schema; every request the schema
forbids refused (a body value of another JSON type included: nothing is coerced); every request
it allows accepted, as a member and as an admin, with a bounded number of examples per operation,
the same ones every run (derandomized: CI does not hang on luck).

A request the schema allows may still be refused for what no schema can state: a referenced
object that does not exist or is not the caller's, a name already taken, a rule across fields or
over the portal's state (a policy, a quota), a password the password policy refuses. Such a
refusal is a 400 whose `field_codes` are all one of those (``does_not_exist``, ``unique``,
``rule``, ``password_*``): ``positive_data_acceptance`` takes 400 among its expected statuses, and
``refusals_are_for_state_or_rules`` below fails any other 400 of a schema-valid request, such as
one for a format the schema did not say."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from apps.errors import RULE
from portal.wsgi import application
from tests.personas import api_token, make_world

ACCEPTED = ["2xx", "400", "401", "403", "404", "409", "429"]
CHECKS = {"checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED}}}
# As an admin, every phase: the schema's examples, its coverage (each parameter's boundaries and
# wrong types, methods no route has) and generated cases. As a member, generated cases only: the
# coverage cases reach the same validation (or a 403 before it) as the admin's and cost a third
# of the suite's time on their own.
schema = schemathesis.openapi.from_wsgi("/api/schema/", application, config=SchemathesisConfig.from_dict(CHECKS))
member_schema = schemathesis.openapi.from_wsgi(
    "/api/schema/",
    application,
    config=SchemathesisConfig.from_dict({**CHECKS, "phases": {"coverage": {"enabled": False}}}),
)
STATE_OR_RULE = {"does_not_exist", "unique", RULE}


@schemathesis.check
def refusals_are_for_state_or_rules(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 400 to a request the schema allows names, in every field, a refusal no schema can state."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 400:
        return None
    codes = {code for codes in response.json()["error"].get("field_codes", {}).values() for code in codes}
    other = {code for code in codes if code not in STATE_OR_RULE and not code.startswith("password_")}
    if not codes or other:
        raise AssertionError(f"a schema-valid request refused for {sorted(other) or 'no field'}: {response.text[:300]}")
    return None


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
def admin_token(db: None) -> str:
    return api_token(make_world().admin)


@pytest.fixture
def member_token(db: None) -> str:
    return api_token(make_world().alice)


BOUNDED = settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@schema.parametrize()
@BOUNDED
def test_the_api_keeps_to_its_schema_for_an_admin(case: Any, admin_token: str) -> None:
    case.call_and_validate(headers={"Authorization": f"Token {admin_token}"})


@member_schema.parametrize()
@BOUNDED
def test_the_api_keeps_to_its_schema_for_a_member(case: Any, member_token: str) -> None:
    case.call_and_validate(headers={"Authorization": f"Token {member_token}"})
