"""Failed sign-ins are limited per account and per address, on the sign-in page and at the token
endpoint alike: past the limit even the right password gets 429 with Retry-After, until the window
ends; a success clears its account's count."""

from __future__ import annotations

from datetime import timedelta

from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts import throttle
from apps.accounts.models import SignInFailures
from apps.audit.models import AuditEvent
from tests.personas import PASSWORD, World


def _web(username: str, password: str, address: str = "10.0.0.1") -> int:
    return Client().post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address).status_code


def _api(username: str, password: str, address: str = "10.0.0.1") -> object:
    return APIClient().post(
        "/api/v1/auth/token/", {"username": username, "password": password}, format="json", REMOTE_ADDR=address
    )


def test_past_the_limit_even_the_right_password_is_refused_with_429(world: World) -> None:
    for n in range(throttle.PER_ACCOUNT):
        assert _web("alice", f"wrong-{n}", address=f"10.0.1.{n}") == 200  # the form again, with its error

    page = Client().post("/login/", {"username": "alice", "password": PASSWORD}, REMOTE_ADDR="10.0.2.1")
    assert page.status_code == 429 and int(page["Retry-After"]) > 0
    assert "Too many failed sign-ins" in page.content.decode()
    assert "_auth_user_id" not in page.wsgi_request.session
    api = _api("alice", PASSWORD, address="10.0.2.2")
    assert api.status_code == 429 and int(api["Retry-After"]) > 0  # type: ignore[attr-defined]
    assert "Too many failed sign-ins" in api.json()["error"]["message"]  # type: ignore[attr-defined]
    assert _web("bob", PASSWORD) == 302  # another account signs in


def test_failures_count_across_the_page_and_the_token_endpoint(world: World) -> None:
    for _ in range(throttle.PER_ACCOUNT // 2):
        assert _web("alice", "wrong") == 200
        assert _api("alice", "wrong").status_code in (401, 403)  # type: ignore[attr-defined]

    assert _api("alice", PASSWORD).status_code == 429  # type: ignore[attr-defined]


def test_the_limit_ends_with_its_window(world: World) -> None:
    for _ in range(throttle.PER_ACCOUNT):
        _web("alice", "wrong")
    assert _web("alice", PASSWORD) == 429

    SignInFailures.objects.update(since=timezone.now() - throttle.WINDOW - timedelta(seconds=1))

    assert _web("alice", PASSWORD) == 302


def test_a_success_clears_its_accounts_count(world: World) -> None:
    for _ in range(throttle.PER_ACCOUNT - 1):
        _web("alice", "wrong")
    assert _api("alice", PASSWORD).status_code == 200  # type: ignore[attr-defined]
    for _ in range(throttle.PER_ACCOUNT - 1):
        _web("alice", "wrong")

    assert _web("alice", PASSWORD) == 302


def test_one_address_guessing_many_accounts_is_stopped(world: World) -> None:
    for n in range(throttle.PER_ADDRESS):
        _api(f"nobody-{n}", "guess", address="10.9.9.9")

    assert _api("bob", PASSWORD, address="10.9.9.9").status_code == 429  # type: ignore[attr-defined]
    assert _api("bob", PASSWORD, address="10.9.9.10").status_code == 200  # type: ignore[attr-defined]


def test_what_was_typed_as_a_username_is_not_kept(world: World) -> None:
    _web("my-secret-password", "oops")

    assert not SignInFailures.objects.filter(key__contains="secret").exists()
    assert SignInFailures.objects.count() == 2  # the account's count and the address's, as hashes


def test_every_sign_in_is_in_the_audit_log_with_its_address(world: World) -> None:
    _web("alice", "wrong", address="10.1.1.1")
    _web("alice", PASSWORD, address="10.1.1.2")
    _api("alice", PASSWORD, address="10.1.1.3")
    _api("nobody", "guess", address="10.1.1.4")

    events = list(
        AuditEvent.objects.filter(action__startswith="signin.")
        .order_by("id")
        .values_list("action", "target_repr", "via", "ip_address", "actor_name")
    )
    assert events == [
        ("signin.failure", "alice", "web", "10.1.1.1", ""),
        ("signin.success", "alice", "web", "10.1.1.2", "alice"),
        ("signin.success", "alice", "api", "10.1.1.3", "alice"),
        ("signin.failure", "nobody", "api", "10.1.1.4", ""),
    ]
    # alice sees her own sign-ins; the failures, which no one is known to have made, only admins see.
    seen = {
        e["action"]
        for e in world.client(world.alice).get("/api/v1/audit-events/?action__startswith=signin.").json()["results"]
    }
    assert seen == {"signin.success"}
    everything = world.client(world.admin).get("/api/v1/audit-events/?action=signin.failure").json()["results"]
    assert {e["target_repr"] for e in everything} == {"alice", "nobody"}
