"""The API tokens page: a user sees their own tokens only, makes one with the API's own checks and
sees its text once, revokes their own (another user's is not found), and the forms need their
CSRF token."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken
from apps.audit.models import AuditEvent
from tests.personas import World, api_token
from tests.web.conftest import queries
from tests.web.test_pages import SignedIn

URL = "/tokens/"
TOKEN = re.compile(r"gpp_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")


def _with(text: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {text}")
    return client


def _token(text: str) -> ApiToken:
    return ApiToken.objects.get(key_id=text.split("_")[1])


def _named(user: Any, name: str, **options: Any) -> str:
    """A new token of the user's (tests.personas.api_token), called `name`; its text."""
    text = api_token(user, **options)
    ApiToken.objects.filter(key_id=text.split("_")[1]).update(name=name)
    return text


def test_the_page_lists_only_my_tokens_newest_first(world: World, signed_in: SignedIn) -> None:
    _named(world.bob, "bobs-laptop")
    older = _token(_named(world.alice, "old-ci", scope=ApiToken.Scope.READ, workspace=world.team_a))
    ApiToken.objects.filter(pk=older.pk).update(created_at=timezone.now() - timedelta(days=3))
    newer = _token(_named(world.alice, "laptop"))
    alice = signed_in(world.alice)

    page = alice.get(URL)

    assert page.status_code == 200
    text = page.content.decode()
    assert "bobs-laptop" not in text
    rows = re.findall(r'<tr data-token="([0-9a-f]+)">', text)
    assert rows == [newer.key_id, older.key_id]
    assert "read-only" in text and "read-write" in text and "all of yours" in text and "never" in text
    assert '<a href="/tokens/" aria-current="page">API tokens</a>' in text
    assert not TOKEN.search(text)  # a token's text is never listed
    few = queries(alice, URL)
    for n in range(3):
        _named(world.alice, f"more-{n}", workspace=world.team_a)
    assert queries(alice, URL) == few  # more rows cost no more queries


def test_the_states_are_shown_with_the_revoked_reason(world: World, signed_in: SignedIn) -> None:
    expired = _token(_named(world.alice, "expired-one"))
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    revoked = _token(_named(world.alice, "revoked-one"))
    ApiToken.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now(), revoked_reason="password changed")
    _named(world.alice, "active-one")

    text = signed_in(world.alice).get(URL).content.decode()

    for state in ("active", "expired", "revoked"):
        assert f'data-state="{state}"' in text
    assert "password changed" in text
    assert text.count(">Revoke<span") == 1  # only the active one can be revoked


def test_creating_shows_the_token_once_and_it_works(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)

    created = alice.post(URL, {"action": "create", "name": "laptop", "expires_in_days": "7", "scope": "write"})

    assert created.status_code == 302 and created["Location"] == URL
    assert not TOKEN.search(created["Location"])
    shown = alice.get(URL)
    text = shown.content.decode()
    found = TOKEN.findall(text)
    assert found, text
    token_text = found[0]
    assert set(found) == {token_text}  # in the box and the examples, and nowhere else
    assert "will not be shown again" in text
    assert f"Authorization: Token {token_text}" in text and f"export GPUPORTAL_TOKEN={token_text}" in text
    assert "no-store" in shown["Cache-Control"]
    assert "Token laptop" in text  # the success message names it, without its text
    again = alice.get(URL).content.decode()
    assert not TOKEN.search(again) and "will not be shown again" not in again
    token = _token(token_text)
    assert token.user == world.alice and token.scope == ApiToken.Scope.WRITE and token.workspace is None
    assert timedelta(days=6, hours=23) < token.expires_at - timezone.now() <= timedelta(days=7)
    me = _with(token_text).get("/api/v1/me/")
    assert me.status_code == 200 and me.json()["username"] == "alice"
    event = AuditEvent.objects.get(action="token.create", target_id=str(token.pk))
    assert event.via == AuditEvent.Via.WEB


def test_a_read_only_token_for_one_workspace(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)

    response = alice.post(URL, {"name": "ci", "expires_in_days": "30", "scope": "read", "workspace": "team-a"})

    assert response.status_code == 302
    token = ApiToken.objects.get(user=world.alice, name="ci")
    assert token.scope == ApiToken.Scope.READ and token.workspace == world.team_a
    assert "team-a" in alice.get(URL).content.decode()


@pytest.mark.parametrize(
    ("form", "field", "message"),
    [
        ({"name": ""}, "name", "This field may not be blank."),
        ({"expires_in_days": "0"}, "expires_in_days", "greater than or equal to 1"),
        (
            {"expires_in_days": str(settings.PORTAL_API_TOKEN_MAX_DAYS + 1)},
            "expires_in_days",
            f"less than or equal to {settings.PORTAL_API_TOKEN_MAX_DAYS}",
        ),
        ({"expires_in_days": "soon"}, "expires_in_days", "A valid integer is required."),
        ({"scope": "admin"}, "scope", "is not a valid choice"),
        ({"workspace": "team-b"}, "workspace", "Object with name=team-b does not exist."),
    ],
)
def test_bad_input_is_refused_next_to_its_field_and_makes_nothing(
    world: World, signed_in: SignedIn, form: dict[str, str], field: str, message: str
) -> None:
    data = {"action": "create", "name": "laptop", "expires_in_days": "90", "scope": "write", "workspace": ""}

    response = signed_in(world.alice).post(URL, {**data, **form})

    assert response.status_code == 400
    text = response.content.decode()
    errors = re.search(rf'<div id="{field}-error">(.*?)</div>', text, re.S)
    assert errors and message in errors.group(1), text
    assert f'id="id_{field}"' in text and 'aria-invalid="true"' in text
    assert not ApiToken.objects.filter(user=world.alice).exists()
    assert not TOKEN.search(text)


def test_revoking_my_token_refuses_it_at_once(world: World, signed_in: SignedIn) -> None:
    text = _named(world.alice, "laptop")
    token = _token(text)
    assert _with(text).get("/api/v1/me/").status_code == 200
    alice = signed_in(world.alice)

    response = alice.post(URL, {"action": "revoke", "token": str(token.pk)}, follow=True)

    assert response.status_code == 200
    page = response.content.decode()
    assert f"Token laptop ({token.key_id}) was revoked" in page
    assert 'data-state="revoked"' in page and "revoked by its user" in page
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert _with(text).get("/api/v1/me/").status_code == 401
    assert AuditEvent.objects.filter(action="token.revoke", target_id=str(token.pk), via=AuditEvent.Via.WEB).exists()


def test_another_users_token_is_not_found(world: World, signed_in: SignedIn) -> None:
    text = _named(world.bob, "bobs-laptop")
    token = _token(text)
    alice = signed_in(world.alice)

    assert alice.post(URL, {"action": "revoke", "token": str(token.pk)}).status_code == 404
    for nonsense in ("nope", "²", "99999999999999999999"):
        assert alice.post(URL, {"action": "revoke", "token": nonsense}).status_code == 404
    assert alice.post(URL, {"action": "revoke"}).status_code == 404

    token.refresh_from_db()
    assert token.revoked_at is None
    assert _with(text).get("/api/v1/me/").status_code == 200


def test_anonymous_visitors_are_sent_to_sign_in(world: World) -> None:
    response = Client().get(URL)
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={URL}"


def test_changes_need_the_csrf_token(world: World) -> None:
    token = _token(_named(world.alice, "laptop"))
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.alice)

    assert client.post(URL, {"action": "create", "name": "sneaky", "expires_in_days": "7"}).status_code == 403
    assert client.post(URL, {"action": "revoke", "token": str(token.pk)}).status_code == 403

    assert not ApiToken.objects.filter(name="sneaky").exists()
    token.refresh_from_db()
    assert token.revoked_at is None


def test_the_page_lists_the_workloads_whose_tokens_act_for_me_while_they_live(
    world: World, signed_in: SignedIn
) -> None:
    from apps.accounts.tokens import workload_token
    from apps.jobs.actions import check_submit_job
    from apps.jobs.models import Job

    running = check_submit_job(world.team_a, name="training", command="true", acting_user=world.bob)
    ended = check_submit_job(world.team_a, name="old-run", command="true", acting_user=world.bob)
    others = check_submit_job(world.team_a, name="alices", command="true", acting_user=world.alice)
    Job.objects.filter(pk__in=[running.pk, others.pk]).update(state=Job.State.RUNNING)
    Job.objects.filter(pk=ended.pk).update(state=Job.State.SUCCEEDED)
    page = signed_in(world.bob).get("/tokens/").content.decode()
    listed = re.findall(r'data-workload="([a-z]+-\d+)"', page)
    assert listed == [f"job-{running.pk}"]  # not the ended one, nor alice's
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {workload_token(ended)}")
    assert client.get("/api/v1/me/").status_code == 401  # what the page says: it ended, so did its token
    Job.objects.filter(pk=running.pk).update(state=Job.State.CANCELLED)
    assert "None now" in signed_in(world.bob).get("/tokens/").content.decode()
