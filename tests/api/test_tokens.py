"""Personal API tokens: shown once and stored hashed, several per user with a name, an expiry and a
scope; refused with a 401 that says why once revoked or expired; ended by a password change or a
deactivation; never another user's, and never a way out of the workspace a token is limited to."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts import device_login
from apps.accounts.actions import do_deactivate_user, do_save_user
from apps.accounts.api_tokens import LAST_USED_EVERY
from apps.accounts.models import ApiToken
from apps.accounts.tokens import workload_token
from apps.audit.models import AuditEvent
from tests.api.endpoints import running_workload
from tests.personas import PASSWORD, World, api_token


def _with(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _message(response: Any) -> str:
    return str(response.json()["error"]["message"])


def test_a_token_is_shown_once_and_stored_hashed(world: World) -> None:
    alice = world.client(world.alice)

    created = alice.post("/api/v1/tokens/", {"name": "laptop", "expires_in_days": 7}, format="json")

    assert created.status_code == 201, created.content
    text = created.json()["token"]
    assert text.startswith("gpp_") and created.json()["scope"] == "write" and created.json()["state"] == "active"
    listed = alice.get("/api/v1/tokens/").json()["results"]
    assert "laptop" in {t["name"] for t in listed} and all("token" not in t and "digest" not in t for t in listed)
    secret = text.split("_", 2)[2]
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM accounts_apitoken")
        assert not any(secret in str(value) for row in cursor.fetchall() for value in row)
    assert _with(text).get("/api/v1/me/").json()["username"] == "alice"
    assert ApiToken.objects.get(key_id=created.json()["key_id"]).last_used_at is not None
    actions = set(AuditEvent.objects.filter(target_type="accounts.apitoken").values_list("action", flat=True))
    assert "token.create" in actions


def test_a_revoked_token_is_refused_at_once_saying_so(world: World) -> None:
    text = api_token(world.alice)
    token = ApiToken.objects.get(key_id=text.split("_")[1])
    assert _with(text).get("/api/v1/me/").status_code == 200

    assert world.client(world.alice).delete(f"/api/v1/tokens/{token.pk}/").status_code == 204

    refused = _with(text).get("/api/v1/me/")
    assert refused.status_code == 401 and "revoked" in _message(refused), refused.content
    assert world.client(world.alice).get(f"/api/v1/tokens/{token.pk}/").json()["state"] == "revoked"
    assert AuditEvent.objects.filter(action="token.revoke", target_id=str(token.pk)).exists()


def test_an_expired_token_is_refused_saying_so(world: World) -> None:
    text = api_token(world.alice)
    ApiToken.objects.filter(key_id=text.split("_")[1]).update(expires_at=timezone.now() - timedelta(seconds=1))

    refused = _with(text).get("/api/v1/me/")

    assert refused.status_code == 401 and "expired" in _message(refused)


@pytest.mark.parametrize(
    "text",
    ["gpp_000000000000_" + "A" * 43, "gpp_nothex", "0123456789abcdef0123456789abcdef01234567", "garbage"],
)
def test_a_token_that_is_not_genuine_is_refused(world: World, text: str) -> None:
    genuine = api_token(world.alice)
    forged = text if not text.startswith("gpp_0") else f"gpp_{genuine.split('_')[1]}_{'A' * 43}"

    refused = _with(forged).get("/api/v1/me/")

    assert refused.status_code == 401
    if len(text) == 40:
        assert "no longer accepted" in _message(refused)  # a key of the earlier kind: say what to do


def test_a_read_only_token_reads_and_changes_nothing(world: World) -> None:
    text = api_token(world.alice, scope=ApiToken.Scope.READ)
    client = _with(text)

    assert client.get("/api/v1/jobs/").status_code == 200
    refused = client.post("/api/v1/jobs/", {"workspace": "team-a", "name": "t", "command": "true"}, format="json")

    assert refused.status_code == 403 and "read-only" in _message(refused)
    assert client.post("/api/v1/tokens/", {"name": "more"}, format="json").status_code == 403


def test_a_token_limited_to_a_workspace_reaches_nothing_else(world: World) -> None:
    text = api_token(world.alice, workspace=world.team_a)
    client = _with(text)

    assert client.get("/api/v1/me/").json()["workspaces"] == ["team-a"]
    private = client.get("/api/v1/workspaces/alice/")
    assert private.status_code == 404
    # Nor can it make itself a token without that limit.
    escalation = client.post("/api/v1/tokens/", {"name": "wider"}, format="json")
    assert escalation.status_code == 403 and ApiToken.objects.filter(user=world.alice).count() == 1


def test_a_token_cannot_be_limited_to_a_workspace_its_user_cannot_see(world: World) -> None:
    answer = world.client(world.alice).post("/api/v1/tokens/", {"name": "x", "workspace": "team-b"}, format="json")

    assert answer.status_code == 400 and "does not exist" in str(answer.json()["error"]["fields"]["workspace"])


def test_another_users_token_is_not_found(world: World) -> None:
    text = api_token(world.bob)
    token = ApiToken.objects.get(key_id=text.split("_")[1])
    alice = world.client(world.alice)
    admin = world.client(world.admin)

    for client in (alice, admin):
        assert client.get(f"/api/v1/tokens/{token.pk}/").status_code == 404
        assert client.delete(f"/api/v1/tokens/{token.pk}/").status_code == 404
        assert token.key_id not in str(client.get("/api/v1/tokens/").content)
    assert _with(text).get("/api/v1/me/").status_code == 200


def test_the_expiry_is_bounded(world: World) -> None:
    answer = world.client(world.alice).post("/api/v1/tokens/", {"name": "x", "expires_in_days": 10_000}, format="json")

    assert answer.status_code == 400 and "expires_in_days" in answer.json()["error"]["fields"]


def test_changing_the_password_ends_tokens_and_sessions(world: World) -> None:
    text = api_token(world.alice)
    browser = Client()
    assert browser.login(username="alice", password=PASSWORD)
    assert browser.get("/api/v1/me/").status_code == 200

    do_save_user(world.alice, password="another-horse-battery-staple", acting_user=world.alice)

    refused = _with(text).get("/api/v1/me/")
    assert refused.status_code == 401 and "password was changed" in _message(refused)
    assert browser.get("/api/v1/me/").status_code in (401, 403)


def test_deactivating_a_user_ends_their_tokens(world: World) -> None:
    text = api_token(world.bob)

    do_deactivate_user(world.bob, acting_user=world.admin)

    refused = _with(text).get("/api/v1/me/")
    assert refused.status_code == 401 and "deactivated" in _message(refused)


def test_signing_in_with_a_password_makes_a_personal_token(world: World, settings: Any) -> None:
    settings.PORTAL_LOGIN_TOKEN_DAYS = 3
    anonymous = APIClient()

    answer = anonymous.post("/api/v1/auth/token/", {"username": "alice", "password": PASSWORD}, format="json")

    assert answer.status_code == 200
    token = ApiToken.objects.get(key_id=answer.json()["token"].split("_")[1])
    assert token.name == "gpuportal login" and token.user == world.alice and token.workspace is None
    assert timedelta(days=2.9) < token.expires_at - timezone.now() <= timedelta(days=3)
    assert _with(answer.json()["token"]).get("/api/v1/me/").json()["username"] == "alice"


def test_the_last_use_is_written_at_most_once_a_minute(world: World) -> None:
    text = api_token(world.alice)
    token = ApiToken.objects.get(key_id=text.split("_")[1])
    client = _with(text)
    client.get("/api/v1/me/")
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    client.get("/api/v1/me/")
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now() - LAST_USED_EVERY)
    client.get("/api/v1/me/")
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first  # type: ignore[operator]


def test_a_user_makes_a_limited_number_of_tokens_an_hour(world: World, settings: Any) -> None:
    settings.PORTAL_TOKENS_PER_USER_HOUR = 3
    bob = world.client(world.bob)  # its own token, made for the test, counts as one
    for n in range(2):
        assert bob.post("/api/v1/tokens/", {"name": f"t{n}"}, format="json").status_code == 201
    refused = bob.post("/api/v1/tokens/", {"name": "one too many"}, format="json")
    assert refused.status_code == 429 and 3000 < int(refused["Retry-After"]) <= 3600
    assert "3 new tokens an hour is the most one user may make" in refused.json()["error"]["message"]
    assert not ApiToken.objects.filter(name="one too many").exists()

    page = Client()
    page.force_login(world.bob)
    answer = page.post("/tokens/", {"name": "from the page", "expires_in_days": "7", "scope": "read", "workspace": ""})
    assert answer.status_code == 400 and "3 new tokens an hour" in answer.content.decode()
    assert world.client(world.alice).post("/api/v1/tokens/", {"name": "alice's"}, format="json").status_code == 201


def test_a_workloads_token_makes_no_token_and_allows_no_cli_sign_in(world: World) -> None:
    """An owner's notebook token can neither make a personal token (one that would outlive the
    notebook and its limits) nor allow a waiting CLI sign-in, which takes a person signed in."""
    token = workload_token(running_workload(world, world.alice, "notebook")) or ""
    tokens = ApiToken.objects.count()
    made = _with(token).post("/api/v1/tokens/", {"name": "way out"}, format="json")
    assert made.status_code == 403 and _with(token).get("/api/v1/tokens/").status_code == 403
    assert ApiToken.objects.count() == tokens
    _, waiting = device_login.start("gpuportal login", address=None)
    body = {"code": waiting.user_code, "decision": "allow"}
    page = Client().post(reverse("web:cli-login"), body, HTTP_AUTHORIZATION=f"Token {token}")
    assert page.status_code == 302 and "login" in page["Location"], page
    waiting.refresh_from_db()
    assert waiting.decided_at is None and waiting.user is None
