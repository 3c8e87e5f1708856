"""Failed sign-ins are limited per account and per address, on the sign-in page and at the token
endpoint alike: past the limit even the right password gets 429 with Retry-After, until the window
ends; a success clears its account's count."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from django.contrib.auth.forms import AuthenticationForm
from django.test import Client, RequestFactory
from django.utils import timezone
from requests.adapters import HTTPAdapter
from rest_framework.test import APIClient

from apps.accounts import addresses, throttle
from apps.accounts.api import DeviceLoginView
from apps.accounts.models import DeviceLogin, SignInFailures
from apps.audit.models import AuditEvent
from tests.personas import PASSWORD, World
from tests.proxy import running_proxy


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
    message = api.json()["error"]["message"]  # type: ignore[attr-defined]
    assert message.startswith("Too many failed sign-ins") and "Expected available" not in message, message
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


# --- One account, however its name is typed ---------------------------------------------------

SPELLINGS = [" victor ", "victor\t", "\u00a0victor", "\uff56\uff49\uff43\uff54\uff4f\uff52", "Victor"]


def test_it_resolves_a_typed_username_as_the_sign_in_form_does(db: None) -> None:
    for typed in [*SPELLINGS, "victor", "v\u0069\u0307ctor", "\u212bngstr\u00f6m "]:
        form = AuthenticationForm(data={"username": typed, "password": "x"})
        form.is_valid()
        assert throttle.sign_in_name(typed) == form.cleaned_data["username"], typed


def test_it_counts_every_spelling_of_a_username_against_one_account(world: World) -> None:
    for n in range(throttle.PER_ACCOUNT):
        assert _web(SPELLINGS[n % len(SPELLINGS)], "wrong", address=f"10.0.3.{n}") == 200

    for n, typed in enumerate(["victor", *SPELLINGS]):
        assert _web(typed, PASSWORD, address=f"10.0.4.{n}") == 429, typed
        # The token endpoint refuses control characters outright (400); the rest, as the page does.
        expected = 400 if "\t" in typed else 429
        assert _api(typed, PASSWORD, address=f"10.0.5.{n}").status_code == expected, typed  # type: ignore[attr-defined]


def test_a_locked_account_stays_locked_under_another_spelling(world: World) -> None:
    for _ in range(throttle.PER_ACCOUNT):
        _api("victor", "wrong")

    for typed in SPELLINGS:
        page = Client().post("/login/", {"username": typed, "password": PASSWORD}, REMOTE_ADDR="10.0.6.1")
        assert page.status_code == 429 and "_auth_user_id" not in page.wsgi_request.session, typed


def test_the_token_endpoint_reads_a_username_as_the_sign_in_page_does(world: World) -> None:
    assert _api(" \uff56ictor\u3000", PASSWORD).status_code == 200  # type: ignore[attr-defined]
    assert _web(" \uff56ictor\t", PASSWORD) == 302


# --- Client addresses behind the proxy -------------------------------------------------------


def _through_proxy(username: str, password: str, forwarded_for: str) -> int:
    """A sign-in as the notebook proxy hands it on: from loopback, the client's address appended."""
    return (
        Client()
        .post(
            "/login/",
            {"username": username, "password": password},
            REMOTE_ADDR="127.0.0.1",
            HTTP_X_FORWARDED_FOR=forwarded_for,
        )
        .status_code
    )


@pytest.fixture
def behind_the_proxy(settings: Any) -> None:
    settings.PORTAL_TRUSTED_PROXIES = ["127.0.0.1", "::1"]


def test_it_counts_failures_per_client_behind_the_proxy(world: World, behind_the_proxy: None) -> None:
    for n in range(throttle.PER_ADDRESS):
        assert _through_proxy(f"nobody-{n}", "guess", "203.0.113.7") == 200

    assert _through_proxy("admin", PASSWORD, "203.0.113.7") == 429  # that client is throttled
    assert _through_proxy("admin", PASSWORD, "203.0.113.8") == 302  # admin, from elsewhere, is not
    assert _through_proxy("bob", PASSWORD, "::ffff:203.0.113.9") == 302


def test_a_client_cannot_choose_its_address_by_writing_the_header_itself(world: World, behind_the_proxy: None) -> None:
    # The proxy appends the address it was reached from; what the client wrote stays to its left.
    for n in range(throttle.PER_ADDRESS):
        _through_proxy(f"nobody-{n}", "guess", f"10.{n}.0.1, 198.51.100.{n},203.0.113.7")

    assert _through_proxy("bob", PASSWORD, "198.51.100.77,203.0.113.7") == 429
    assert _through_proxy("bob", PASSWORD, "203.0.113.7, 198.51.100.77") == 302


def test_it_ignores_a_forwarded_header_from_a_peer_that_is_not_a_trusted_proxy(
    world: World, behind_the_proxy: None
) -> None:
    for n in range(throttle.PER_ADDRESS):
        Client().post(
            "/login/", {"username": f"nobody-{n}", "password": "guess"},
            REMOTE_ADDR="198.51.100.9", HTTP_X_FORWARDED_FOR=f"203.0.113.{n}",
        )  # fmt: skip

    forged = Client().post(
        "/login/",
        {"username": "bob", "password": PASSWORD},
        REMOTE_ADDR="198.51.100.9",
        HTTP_X_FORWARDED_FOR="192.0.2.1",
    )
    assert forged.status_code == 429  # counted as 198.51.100.9, whatever it says it forwards
    assert _through_proxy("bob", PASSWORD, "198.51.100.9") == 429  # the same client, through the proxy
    assert _through_proxy("bob", PASSWORD, "192.0.2.1") == 302


def test_failures_from_the_proxy_own_machine_never_lock_anyone_out(world: World, behind_the_proxy: None) -> None:
    """Requests made on the proxy's machine (a local browser, a workload) share its address: it is
    no one client's, so only the accounts' own limits apply to them."""
    for n in range(throttle.PER_ADDRESS // 2 + 1):
        assert _through_proxy(f"nobody-{n}", "guess", "127.0.0.1") == 200
        assert _web(f"nobody-{n}", "guess", address="127.0.0.1") == 200  # no header at all

    assert _through_proxy("admin", PASSWORD, "127.0.0.1") == 302
    assert _web("admin", PASSWORD, address="127.0.0.1") == 302
    assert _api("bob", PASSWORD, address="127.0.0.1").status_code == 200  # type: ignore[attr-defined]


def test_failures_through_a_real_proxy_throttle_only_their_client(
    tx_world: World, live_server: Any, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """configurable-http-proxy in front of the portal, as the embedded portal runs it, reached from
    two clients on two loopback addresses (the proxy trusted at 127.0.0.1 only)."""
    settings.PORTAL_TRUSTED_PROXIES = ["127.0.0.1"]
    monkeypatch.setattr(throttle, "PER_ADDRESS", 5)  # what is counted matters here, not how many
    with running_proxy(live_server.url, tmp_path / "proxy.log", x_forward=True) as proxy:
        attacker, admin = _client_from("127.0.0.2"), _client_from("127.0.0.3")
        url = f"{proxy.url}/api/v1/auth/token/"
        for n in range(throttle.PER_ADDRESS):
            answer = attacker.post(url, json={"username": f"nobody-{n}", "password": "guess"}, timeout=10)
            assert answer.status_code == 401, answer.text

        for forged in ("", "127.0.0.3", "127.0.0.1"):
            headers = {"X-Forwarded-For": forged} if forged else {}
            answer = attacker.post(url, json={"username": "admin", "password": PASSWORD}, headers=headers, timeout=10)
            assert answer.status_code == 429, (forged, answer.text)
        answer = admin.post(url, json={"username": "admin", "password": PASSWORD}, timeout=10)
        assert answer.status_code == 200, answer.text
    assert AuditEvent.objects.filter(action="signin.failure").count() == throttle.PER_ADDRESS


class _FromAddress(HTTPAdapter):
    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["source_address"] = (self.address, 0)
        super().init_poolmanager(*args, **kwargs)


def _client_from(address: str) -> requests.Session:
    session = requests.Session()
    session.mount("http://", _FromAddress(address))
    return session


def test_waiting_cli_sign_ins_are_counted_per_client_behind_the_proxy(world: World, behind_the_proxy: None) -> None:
    def start(forwarded_for: str | None) -> Any:
        extra = {"HTTP_X_FORWARDED_FOR": forwarded_for} if forwarded_for else {}
        return APIClient().post("/api/v1/auth/device/", {}, format="json", REMOTE_ADDR="127.0.0.1", **extra)

    for _ in range(DeviceLoginView.PER_ADDRESS):
        assert start("203.0.113.7").status_code == 201
    assert start("203.0.113.7").status_code == 429
    assert start("203.0.113.8").status_code == 201  # another client, through the same proxy
    assert DeviceLogin.objects.filter(address="203.0.113.8").count() == 1  # shown on the page as theirs
    for _ in range(DeviceLoginView.PER_ADDRESS + 1):  # the proxy's own machine: no one client
        assert start(None).status_code == 201


@pytest.mark.parametrize(
    ("peer", "forwarded", "client", "distinct"),
    [
        ("127.0.0.1", "203.0.113.7", "203.0.113.7", True),
        ("::ffff:127.0.0.1", "::ffff:203.0.113.7", "203.0.113.7", True),  # a dual-stack socket's view
        ("127.0.0.1", "[2001:db8::1]:4711, 127.0.0.1", "2001:db8::1", True),
        ("127.0.0.1", "203.0.113.7:4711,::1", "203.0.113.7", True),
        ("127.0.0.1", "", "127.0.0.1", False),  # made on the proxy's machine: shared
        ("127.0.0.1", "127.0.0.1,::1", "127.0.0.1", False),
        ("127.0.0.1", "203.0.113.7,not-an-address", None, False),  # cannot be told
        ("198.51.100.9", "203.0.113.7", "198.51.100.9", True),  # not from a trusted proxy
        ("", "203.0.113.7", None, False),
    ],
)
def test_it_reads_the_client_address_as_proxies_write_it(
    behind_the_proxy: None, peer: str, forwarded: str, client: str | None, distinct: bool
) -> None:
    request = RequestFactory().get("/", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=forwarded)
    assert addresses.client_address(request) == client
    assert addresses.distinct_client_address(request) == (client if distinct else None)
