"""A session that came through the identity provider is checked with it again (prompt=none) once
it is PORTAL_OIDC_SESSION_CHECK_S old, against the real provider of tests/idp: a user it still signs
in goes on (with their groups as the provider has them now); a user it no longer signs in loses the
session and every other access (sessions elsewhere, API tokens, the credential stamp their notebooks
and workloads hold). And the personal tokens of such users live PORTAL_SSO_TOKEN_MAX_DAYS at most."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts import sso_session
from apps.accounts.api_tokens import do_create_token
from apps.accounts.models import ApiToken, ExternalIdentity
from apps.accounts.stamps import credential_stamp
from apps.audit.models import AuditEvent
from tests.idp import IdentityProvider, identity_provider, through_the_provider
from tests.personas import PASSWORD, World

CALLBACK = "http://testserver/sso/callback/"
User = get_user_model()


@pytest.fixture
def idp(settings: Any, tmp_path: Path) -> Iterator[IdentityProvider]:
    with identity_provider(tmp_path, redirect_uris=[CALLBACK], logout_uris=["http://testserver/login/"]) as provider:
        for name, value in provider.settings().items():
            setattr(settings, name, value)
        settings.PORTAL_BREAK_GLASS_ADMIN = "admin"
        yield provider


class Person:
    """Someone at a browser: the portal's cookies (a test client) and the provider's (a session)."""

    def __init__(self, login: str, idp: IdentityProvider) -> None:
        self.login, self.issuer = login, idp.issuer
        self.portal, self.at_provider = Client(), requests.Session()

    def sign_in(self) -> None:
        start = self.portal.get("/sso/start/?next=/w/team-a/")
        back = through_the_provider(start["Location"], self.login, back_to=CALLBACK, session=self.at_provider)
        assert self.portal.get(back.removeprefix("http://testserver")).status_code == 302

    def time_passes(self) -> None:
        """The session's check falls due (as PORTAL_OIDC_SESSION_CHECK_S after the last one)."""
        session = self.portal.session
        session[sso_session.EXPIRY] = 0
        session.save()

    def open(self, path: str) -> Any:
        """Open a page as a browser does, following the portal through the provider and back."""
        answer = self.portal.get(path)
        if answer.status_code == 302 and answer["Location"].startswith(f"{self.issuer}/"):
            query = parse_qs(urlsplit(answer["Location"]).query)
            assert query["prompt"] == ["none"] and query["code_challenge"][0] and query["nonce"][0]
            back = through_the_provider(answer["Location"], self.login, back_to=CALLBACK, session=self.at_provider)
            answer = self.portal.get(back.removeprefix("http://testserver"))
            if answer.status_code == 302 and answer["Location"] == path:
                answer = self.portal.get(path)
        return answer

    @property
    def user(self) -> Any:
        return ExternalIdentity.objects.get(subject=self.login).user


def _person(idp: IdentityProvider, login: str, **claims: Any) -> Person:
    idp.person(login, **claims)
    person = Person(login, idp)
    person.sign_in()
    return person


def _remove(idp: IdentityProvider, person: Person) -> None:
    """The person removed at the provider, which ends their sessions there (as Keycloak, Entra ID
    and the like do; this provider would otherwise fail on a session of someone it no longer has)."""
    idp.accounts.pop(person.login)
    idp.accounts_file.write_text(json.dumps(idp.accounts))
    person.at_provider.cookies.clear()


def _token_works(text: str) -> bool:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {text}")
    return client.get("/api/v1/me/").status_code == 200


def test_it_checks_a_session_again_and_goes_on_while_the_provider_signs_the_user_in(
    world: World, idp: IdentityProvider
) -> None:
    nina = _person(idp, "nina", groups=["team-a"])
    assert nina.portal.get("/w/team-a/").status_code == 200
    nina.time_passes()

    idp.person("nina", groups=["team-b"])  # her groups changed at the provider meanwhile
    assert nina.open("/w/team-b/").status_code == 200  # checked, invisibly, and back on the page
    assert nina.portal.get("/w/team-a/").status_code == 404  # the check took her groups anew
    assert nina.portal.session[sso_session.EXPIRY] > timezone.now().timestamp()
    assert nina.user.has_usable_password() is False
    assert not AuditEvent.objects.filter(action="user.update", data__has_key="access_ended").exists()


@pytest.mark.parametrize("why", ["signed out at the provider", "removed at the provider"])
def test_when_the_provider_no_longer_signs_the_user_in_all_their_access_ends(
    world: World, idp: IdentityProvider, why: str
) -> None:
    omar = _person(idp, "omar", groups=["team-a"])
    elsewhere = Person("omar", idp)  # a second browser of his
    elsewhere.sign_in()
    user = omar.user
    stamp, password = credential_stamp(user), user.password
    token = do_create_token(user, name="laptop", expires_in_days=7, acting_user=user)[1]
    assert _token_works(token)
    cli = APIClient()  # a CLI sign-in he allowed, whose token is not collected yet
    started = cli.post("/api/v1/auth/device/", {"name": "laptop"}, format="json").json()
    elsewhere.portal.post("/cli-login/", {"code": started["user_code"], "decision": "allow"})

    if why == "signed out at the provider":
        omar.at_provider.cookies.clear()
    else:
        _remove(idp, omar)
    omar.time_passes()
    page = omar.open("/w/team-a/")

    assert page.status_code == 403 and "no longer signs you in" in page.content.decode()
    assert "_auth_user_id" not in omar.portal.session
    user.refresh_from_db()
    assert not user.has_usable_password() and user.password != password
    assert credential_stamp(user) != stamp  # notebooks' sign-ins and workloads' tokens end with it
    assert not _token_works(token)
    assert ApiToken.objects.get(user=user).revoked_reason == "single sign-on no longer signs them in"
    assert elsewhere.portal.get("/w/team-a/").status_code == 302  # his other session is over too
    collected = cli.post("/api/v1/auth/device/token/", {"device_code": started["device_code"]}, format="json")
    assert collected.status_code == 400 and collected.json()["error"]["code"] == "access_denied"
    assert "_auth_user_id" not in elsewhere.portal.session
    event = AuditEvent.objects.get(action="user.update", data__has_key="access_ended")
    assert event.target_repr == "omar" and event.ip_address == "127.0.0.1"


def test_a_check_can_be_answered_only_by_the_provider_for_that_session(world: World, idp: IdentityProvider) -> None:
    pia = _person(idp, "pia", groups=["team-a"])
    token = do_create_token(pia.user, name="laptop", expires_in_days=7, acting_user=pia.user)[1]
    pia.time_passes()
    to_provider = pia.portal.get("/w/team-a/")
    state = parse_qs(urlsplit(to_provider["Location"]).query)["state"][0]

    for forged in ("not-the-state", ""):
        page = pia.portal.get(f"/sso/callback/?error=login_required&state={forged}")
        assert page.status_code == 403
    assert _token_works(token) and pia.user.password == User.objects.get(pk=pia.user.pk).password
    stranger = Client()  # someone else's browser, with the right state, ends nothing either
    assert stranger.get(f"/sso/callback/?error=login_required&state={state}").status_code == 403
    assert _token_works(token)


def test_a_check_that_cannot_be_made_ends_only_that_session(world: World, idp: IdentityProvider) -> None:
    uma = _person(idp, "uma", groups=["team-a"])
    token = do_create_token(uma.user, name="laptop", expires_in_days=7, acting_user=uma.user)[1]
    uma.time_passes()
    to_provider = uma.portal.get("/w/team-a/")
    back = through_the_provider(to_provider["Location"], "uma", back_to=CALLBACK, session=uma.at_provider)
    spoiled = back.removeprefix("http://testserver").replace("code=", "code=spoiled")

    page = uma.portal.get(spoiled)  # the provider refuses the code: the check could not be made
    assert page.status_code in (400, 502) and "_auth_user_id" not in uma.portal.session
    assert _token_works(token) and not uma.user.has_usable_password()
    uma.sign_in()  # and she signs in again as ever
    assert uma.portal.get("/w/team-a/").status_code == 200


def test_until_the_check_is_done_nothing_else_of_the_session_is_served(world: World, idp: IdentityProvider) -> None:
    quinn = _person(idp, "quinn", groups=["team-a"])
    quinn.time_passes()
    portal = quinn.portal

    form = portal.post("/tokens/", {"name": "x", "expires_in_days": "1"}, HTTP_REFERER="http://testserver/tokens/")
    assert form.status_code == 303 and form["Location"] == "http://testserver/tokens/"  # its page runs the check
    htmx = portal.get("/w/team-a/", HTTP_HX_REQUEST="true")
    assert htmx.status_code == 403 and htmx["HX-Refresh"] == "true"
    api = portal.get("/api/v1/me/")
    assert api.status_code == 403 and api.json()["error"]["code"] == "sign_in_check_due"
    script = portal.get("/w/team-a/", HTTP_SEC_FETCH_MODE="cors")
    assert script.status_code == 403
    assert not ApiToken.objects.filter(user=quinn.user).exists()

    assert quinn.open("/tokens/").status_code == 200  # a page opened runs the check
    assert portal.get("/api/v1/me/").status_code == 200


def test_the_break_glass_admin_and_tokens_are_never_sent_to_the_provider(world: World, idp: IdentityProvider) -> None:
    admin = Client()
    assert admin.post("/login/", {"username": "admin", "password": PASSWORD}).status_code == 302
    session = admin.session
    session[sso_session.EXPIRY] = 0
    session.save()
    assert admin.get("/w/team-a/").status_code == 200
    assert admin.post("/logout/").status_code == 302
    assert world.client(world.alice).get("/api/v1/me/").status_code == 200


def test_without_single_sign_on_nothing_is_checked(world: World) -> None:
    client = Client()
    client.post("/login/", {"username": "alice", "password": PASSWORD})
    assert client.get("/w/team-a/").status_code == 200


def test_ending_access_leaves_the_break_glass_admin_their_password(world: World, settings: Any) -> None:
    from apps.accounts.actions import do_end_sso_access

    settings.PORTAL_BREAK_GLASS_ADMIN = "admin"
    token = do_create_token(world.admin, name="ops", expires_in_days=7, acting_user=world.admin)[1]
    do_end_sso_access(world.admin, reason="test")
    world.admin.refresh_from_db()
    assert world.admin.check_password(PASSWORD)
    assert not _token_works(token)


# --- Tokens of users the provider signs in ----------------------------------------------------


def _tokens_api(person: Person) -> APIClient:
    client = APIClient()
    client.force_authenticate(person.user)
    return client


def test_a_user_of_the_provider_gets_tokens_of_limited_life(world: World, idp: IdentityProvider, settings: Any) -> None:
    settings.PORTAL_SSO_TOKEN_MAX_DAYS = 7
    rita = _person(idp, "rita")
    api = _tokens_api(rita)

    refused = api.post("/api/v1/tokens/", {"name": "ci", "expires_in_days": 30}, format="json")
    assert refused.status_code == 400
    assert refused.json()["error"]["fields"] == {
        "expires_in_days": ["At most 7 days for an account that signs in through single sign-on."]
    }
    made = api.post("/api/v1/tokens/", {"name": "ci"}, format="json")  # no expiry said: the most she may have
    assert made.status_code == 201
    assert timedelta(days=6, hours=23) < ApiToken.objects.get(name="ci").expires_at - timezone.now() <= timedelta(7)
    page = rita.portal.post("/tokens/", {"name": "laptop", "expires_in_days": "30", "scope": "write"})
    assert page.status_code == 400 and "At most 7 days" in page.content.decode()
    # Others keep the general limit.
    others = world.client(world.alice).post("/api/v1/tokens/", {"name": "ci", "expires_in_days": 30}, format="json")
    assert others.status_code == 201


def test_a_longer_token_made_before_stops_at_the_limit(world: World, idp: IdentityProvider, settings: Any) -> None:
    settings.PORTAL_SSO_TOKEN_MAX_DAYS = 30
    sam = _person(idp, "sam")
    old, text = do_create_token(sam.user, name="old", expires_in_days=30, acting_user=sam.user)
    ApiToken.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=8))
    assert _token_works(text)

    settings.PORTAL_SSO_TOKEN_MAX_DAYS = 7  # lowered since
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {text}")
    answer = client.get("/api/v1/me/")
    assert answer.status_code == 401 and "This token expired on" in answer.json()["error"]["message"]
    listed = _tokens_api(sam).get("/api/v1/tokens/").json()["results"][0]
    assert listed["state"] == "expired"
    assert listed["expires_at"].startswith((old.created_at - timedelta(days=1)).date().isoformat())
    assert "expired" in sam.open("/tokens/").content.decode()


def test_the_cli_sign_in_gives_a_user_of_the_provider_a_token_of_limited_life(
    world: World, idp: IdentityProvider, settings: Any
) -> None:
    settings.PORTAL_SSO_TOKEN_MAX_DAYS = 3
    tess = _person(idp, "tess")
    cli = APIClient()
    started = cli.post("/api/v1/auth/device/", {"name": "laptop"}, format="json").json()
    tess.portal.post("/cli-login/", {"code": started["user_code"], "decision": "allow"})
    collected = cli.post("/api/v1/auth/device/token/", {"device_code": started["device_code"]}, format="json")
    assert collected.status_code == 200
    token = ApiToken.objects.get(user=tess.user, name="laptop")
    assert abs(token.expires_at - token.created_at - timedelta(days=3)) < timedelta(minutes=1)
