"""Single sign-on against a real OpenID Connect provider on loopback (tests/idp): the full
authorization-code flow with PKCE and a nonce, the provider's groups mapped to portal groups and the
admin role at every sign-in, passwords off but for the break-glass admin, logout at the provider,
and every broken callback or token refused with a page that says so."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core.exceptions import SuspiciousOperation
from django.test import Client
from rest_framework.test import APIClient

from apps.accounts import oidc
from apps.accounts.models import ExternalIdentity
from apps.audit.models import AuditEvent
from apps.workspaces.models import Workspace
from tests.idp import CLIENT_ID, IdentityProvider, identity_provider, through_the_provider
from tests.personas import PASSWORD, World

CALLBACK = "http://testserver/sso/callback/"


@pytest.fixture
def idp(settings: Any, tmp_path: Path) -> Iterator[IdentityProvider]:
    with identity_provider(tmp_path, redirect_uris=[CALLBACK], logout_uris=["http://testserver/login/"]) as provider:
        for name, value in provider.settings().items():
            setattr(settings, name, value)
        settings.PORTAL_OIDC_ADMIN_GROUPS = ["gpu-admins"]
        settings.PORTAL_BREAK_GLASS_ADMIN = "admin"
        yield provider


def start(client: Client) -> str:
    """The portal's redirect to the provider, checked: PKCE, a nonce and a state."""
    answer = client.get("/sso/start/?next=/tokens/")
    assert answer.status_code == 302
    query = parse_qs(urlsplit(answer["Location"]).query)
    assert query["code_challenge_method"] == ["S256"] and query["code_challenge"][0]
    assert query["nonce"][0] and query["state"][0] and query["client_id"] == [CLIENT_ID]
    return str(answer["Location"])


def sign_in(client: Client, login: str) -> Any:
    back = through_the_provider(start(client), login, back_to=CALLBACK)
    return client.get(back.removeprefix("http://testserver"))


def test_a_first_sign_in_makes_the_user_their_workspace_and_roles_from_the_provider_groups(
    world: World, idp: IdentityProvider
) -> None:
    idp.person("dana", groups=["team-a", "gpu-admins", "not-a-portal-group"], given_name="Dana")
    client = Client()
    answer = sign_in(client, "dana")
    assert answer.status_code == 302 and answer["Location"] == "/tokens/"  # where she was going

    identity = ExternalIdentity.objects.get(issuer=idp.issuer, subject="dana")
    dana = identity.user
    assert (dana.username, dana.email, dana.first_name) == ("dana", "dana@example.org", "Dana")
    assert not dana.has_usable_password()
    assert sorted(dana.groups.values_list("name", flat=True)) == ["team-a"]  # only groups the portal has
    assert dana.is_staff and dana.is_superuser  # gpu-admins is an admin group
    assert Workspace.objects.filter(kind=Workspace.Kind.PRIVATE, assigned_user=dana).exists()
    assert client.get("/w/team-a/").status_code == 200  # team-a is assigned to the group team-a
    assert AuditEvent.objects.filter(action="signin.success", actor=dana).exists()


def test_a_group_removed_at_the_provider_removes_the_role_at_the_next_sign_in(
    world: World, idp: IdentityProvider
) -> None:
    idp.person("erin", groups=["team-a", "gpu-admins"])
    sign_in(Client(), "erin")
    erin = ExternalIdentity.objects.get(subject="erin").user
    assert erin.is_staff and erin.groups.filter(name="team-a").exists()

    idp.person("erin", groups=["team-b"])
    client = Client()
    assert sign_in(client, "erin").status_code == 302
    erin.refresh_from_db()
    assert not erin.is_staff and not erin.is_superuser
    assert list(erin.groups.values_list("name", flat=True)) == ["team-b"]
    assert client.get("/w/team-a/").status_code == 404  # team-a is gone for her
    assert client.get("/w/team-b/").status_code == 200
    assert ExternalIdentity.objects.filter(user=erin).count() == 1  # the same account, not a new one


def test_an_unmapped_group_gives_no_role(world: World, idp: IdentityProvider) -> None:
    idp.person("finn", groups=["admins", "Team-A", "team-a "])  # near misses are misses
    client = Client()
    sign_in(client, "finn")
    finn = ExternalIdentity.objects.get(subject="finn").user
    assert not finn.is_staff and not finn.groups.exists()
    assert client.get("/w/team-a/").status_code == 404


def test_a_provider_account_with_a_local_username_gets_its_own_account(world: World, idp: IdentityProvider) -> None:
    """Someone at the provider called "admin" (or with admin's address) is not the portal's admin."""
    idp.person("mallory", preferred_username="admin", email=world.admin.email)
    client = Client()
    sign_in(client, "mallory")
    mallory = ExternalIdentity.objects.get(subject="mallory").user
    assert mallory.pk != world.admin.pk and mallory.username == "admin-2"
    assert not mallory.is_staff and client.get("/w/team-a/").status_code == 404


def test_a_callback_with_a_state_this_browser_never_started_is_refused(world: World, idp: IdentityProvider) -> None:
    idp.person("gail")
    victim, attacker = Client(), Client()
    back = through_the_provider(start(attacker), "gail", back_to=CALLBACK)
    # The attacker's code, in the victim's browser (login CSRF): the victim's session has no such state.
    page = victim.get(back.removeprefix("http://testserver"))
    assert page.status_code == 400 and "This sign-in could not be checked" in page.content.decode()
    assert "_auth_user_id" not in victim.session

    start(victim)
    forged = back.replace("state=", "state=x")
    page = victim.get(forged.removeprefix("http://testserver"))
    assert page.status_code == 400 and "_auth_user_id" not in victim.session
    assert not ExternalIdentity.objects.filter(subject="gail").exists()


def test_a_callback_used_twice_signs_in_once(world: World, idp: IdentityProvider) -> None:
    idp.person("hank")
    client = Client()
    back = through_the_provider(start(client), "hank", back_to=CALLBACK).removeprefix("http://testserver")
    assert client.get(back).status_code == 302
    client.post("/logout/")
    start(client)  # a sign-in under way, with a state of its own
    page = client.get(back)
    assert page.status_code == 400 and "_auth_user_id" not in client.session


@pytest.mark.parametrize(
    "query",
    ["", "?code=abc", "?state=abc", "?code=%00&state=%ff", "?error=access_denied&error_description=no+thanks"],
)
def test_a_malformed_callback_gets_a_page_that_says_so(world: World, idp: IdentityProvider, query: str) -> None:
    page = Client().get(f"/sso/callback/{query}")
    assert page.status_code in (400, 403)
    text = page.content.decode()
    assert "Sign in" in text and ("sign-in" in text.lower()) and "Traceback" not in text
    if "error=" in query:
        assert "The identity provider did not sign you in: no thanks" in text


def _claims(idp: IdentityProvider, **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": idp.issuer, "sub": "ivy", "aud": CLIENT_ID, "iat": now, "exp": now + 300, "nonce": "n1", **changes}


def test_the_id_token_is_checked_against_the_provider_keys_issuer_audience_expiry_and_nonce(
    world: World, idp: IdentityProvider
) -> None:
    backend = oidc.SsoBackend()
    good = idp.sign(_claims(idp))
    assert backend.verify_token(good, nonce="n1")["sub"] == "ivy"  # the real provider's keys, over HTTP

    header, payload, signature = good.split(".")
    forged_payload = idp.sign(_claims(idp, sub="admin")).split(".")[1]
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    refused = {
        "tampered": f"{header}.{forged_payload}.{signature}",
        "another key": idp.sign(_claims(idp), key=stranger),
        "expired": idp.sign(_claims(idp, iat=now - 3600, exp=now - 600)),
        "another audience": idp.sign(_claims(idp, aud="someone-else")),
        "another issuer": idp.sign(_claims(idp, iss="http://127.0.0.1:1")),
        "issued in the future": idp.sign(_claims(idp, iat=now + 3600, exp=now + 7200)),
        "no expiry": idp.sign({k: v for k, v in _claims(idp).items() if k != "exp"}),
    }
    for why, token in refused.items():
        with pytest.raises(SuspiciousOperation):
            backend.verify_token(token, nonce="n1")
            pytest.fail(why)
    with pytest.raises(SuspiciousOperation, match="Nonce"):
        backend.verify_token(good, nonce="another-nonce")


def test_with_sso_passwords_work_only_for_the_break_glass_admin(world: World, idp: IdentityProvider) -> None:
    page = Client().post("/login/", {"username": "alice", "password": PASSWORD})
    assert page.status_code == 200 and "_auth_user_id" not in page.wsgi_request.session
    assert "Please enter a correct username and password" in page.content.decode()
    token = APIClient().post("/api/v1/auth/token/", {"username": "alice", "password": PASSWORD}, format="json")
    assert token.status_code in (401, 403)

    assert Client().post("/login/", {"username": "admin", "password": PASSWORD}).status_code == 302
    token = APIClient().post("/api/v1/auth/token/", {"username": "admin", "password": PASSWORD}, format="json")
    assert token.status_code == 200


def test_the_sign_in_page_leads_with_the_provider(world: World, idp: IdentityProvider, settings: Any) -> None:
    settings.PORTAL_OIDC_PROVIDER_NAME = "Example University"
    page = Client().get("/login/?next=/w/team-a/").content.decode()
    assert "Sign in with Example University" in page and 'href="/sso/start/?next=/w/team-a/"' in page
    assert "Administrator sign-in with a password" in page


def test_without_sso_there_is_no_provider_button_and_its_urls_are_not_found(world: World) -> None:
    page = Client().get("/login/").content.decode()
    assert "sso-sign-in" not in page and "Administrator sign-in" not in page
    assert Client().get("/sso/start/").status_code == 404
    assert Client().get("/sso/callback/?code=a&state=b").status_code == 404


def test_signing_out_ends_the_provider_session_too(world: World, idp: IdentityProvider) -> None:
    idp.person("jill")
    client = Client()
    sign_in(client, "jill")
    answer = client.post("/logout/")
    assert answer.status_code == 302 and answer["Location"].startswith(f"{idp.issuer}/session/end?")
    query = parse_qs(urlsplit(answer["Location"]).query)
    assert query["post_logout_redirect_uri"] == ["http://testserver/login/"] and query["id_token_hint"][0]
    assert "_auth_user_id" not in client.session
    provider_page = requests.get(answer["Location"], timeout=10)
    assert provider_page.status_code == 200, provider_page.text  # the provider's own sign-out page

    # A break-glass session has nothing at the provider to end.
    admin = Client()
    admin.post("/login/", {"username": "admin", "password": PASSWORD})
    assert admin.post("/logout/")["Location"] == "/login/"


def test_an_unreachable_provider_gets_a_page_that_says_so(world: World, settings: Any) -> None:
    settings.PORTAL_OIDC_ISSUER = "http://127.0.0.1:9"  # nothing listens there
    settings.PORTAL_OIDC_CLIENT_ID = "gpuportal"
    page = Client().get("/sso/start/")
    assert page.status_code == 503 and "cannot be reached just now" in page.content.decode()
    # A password sign-in never waits on the provider.
    assert Client().post("/login/", {"username": "alice", "password": PASSWORD}).status_code == 200


def test_a_deactivated_user_is_not_signed_in(world: World, idp: IdentityProvider) -> None:
    idp.person("kim")
    sign_in(Client(), "kim")
    kim = ExternalIdentity.objects.get(subject="kim").user
    kim.is_active = False
    kim.save()
    client = Client()
    page = sign_in(client, "kim")
    assert page.status_code == 403 and "deactivated" in page.content.decode()
    assert "_auth_user_id" not in client.session


def test_the_cli_signs_in_through_the_provider(world: World, idp: IdentityProvider) -> None:
    """What `gpuportal login --browser` does on a portal with single sign-on: it asks for a code, the
    person signs in through the provider on the code's page and allows it, the CLI collects a token
    that acts as that person."""
    idp.person("lena", groups=["team-b"])
    cli = APIClient()
    started = cli.post("/api/v1/auth/device/", {"name": "lena's laptop"}, format="json").json()
    browser = Client()
    page = browser.get(started["verification_uri_complete"].removeprefix("http://testserver"))
    assert page.status_code == 302 and page["Location"].startswith("/login/?next=/cli-login/")
    answer = browser.get(f"/sso/start/?next={page['Location'].split('next=', 1)[1]}")
    back = through_the_provider(answer["Location"], "lena", back_to=CALLBACK)
    answer = browser.get(back.removeprefix("http://testserver"))
    assert answer.status_code == 302 and answer["Location"].startswith("/cli-login/")
    assert "Is this the code your terminal shows?" in browser.get(answer["Location"]).content.decode()
    browser.post("/cli-login/", {"code": started["user_code"], "decision": "allow"})

    token = cli.post("/api/v1/auth/device/token/", {"device_code": started["device_code"]}, format="json")
    assert token.status_code == 200
    me = APIClient()
    me.credentials(HTTP_AUTHORIZATION=f"Token {token.json()['token']}")
    assert me.get("/api/v1/me/").json()["username"] == "lena"
    assert "team-b" in me.get("/api/v1/me/").json()["workspaces"]
