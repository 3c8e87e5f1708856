"""Single sign-on against the real provider on loopback (tests/idp), from the plain sign-in page (no
`next`): where a sign-in lands, and what a refused ID token or a provider that does not match the
portal's settings tells the person signing in."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core.exceptions import SuspiciousOperation
from django.test import Client
from django.urls import reverse

from apps.accounts import oidc
from tests.idp import CLIENT_ID, IdentityProvider, identity_provider, through_the_provider
from tests.personas import PASSWORD, World

CALLBACK = "http://testserver/sso/callback/"
ANOTHER_BROWSER = "started in another browser or tab"


@pytest.fixture
def idp(settings: Any, tmp_path: Path) -> Iterator[IdentityProvider]:
    with identity_provider(tmp_path, redirect_uris=[CALLBACK], logout_uris=["http://testserver/login/"]) as provider:
        for name, value in provider.settings().items():
            setattr(settings, name, value)
        settings.PORTAL_BREAK_GLASS_ADMIN = "admin"
        yield provider


def from_the_sign_in_page(client: Client, login: str) -> Any:
    """What a person does: open /login/, press the provider's button, sign in there, come back."""
    page = client.get("/login/").content.decode()
    button = re.search(r'id="sso-sign-in" href="([^"]+)"', page)
    assert button, page
    assert button.group(1) == "/sso/start/"  # no `next`: nothing named where to go
    to_provider = client.get(button.group(1))
    assert to_provider.status_code == 302
    back = through_the_provider(str(to_provider["Location"]), login, back_to=CALLBACK)
    return client.get(back.removeprefix("http://testserver"))


def test_a_sign_in_from_the_sign_in_page_lands_on_the_overview_and_again_after_signing_out(
    world: World, idp: IdentityProvider
) -> None:
    idp.person("nora")
    client = Client()
    overview = reverse("web:landing")
    answer = from_the_sign_in_page(client, "nora")
    assert answer.status_code == 302 and answer["Location"] == overview
    assert client.get(answer["Location"]).status_code == 200

    signed_out = client.post("/logout/")  # through the provider's logout, back to /login/
    assert signed_out.status_code == 302 and "_auth_user_id" not in client.session
    answer = from_the_sign_in_page(client, "nora")
    assert answer.status_code == 302 and answer["Location"] == overview
    assert client.get(overview).status_code == 200

    # The password form (the break-glass admin's) lands on the same page.
    admin = Client().post("/login/", {"username": "admin", "password": PASSWORD})
    assert admin.status_code == 302 and admin["Location"] == overview


class _ClockAhead(datetime):
    """The portal's clock an hour ahead of the provider's, as PyJWT reads it."""

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return datetime.now(tz) + timedelta(hours=1)


def test_an_expired_id_token_says_the_clocks_disagree(
    world: World, idp: IdentityProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    idp.person("otto")
    monkeypatch.setattr(jwt.api_jwt, "datetime", _ClockAhead)
    client = Client()
    page = from_the_sign_in_page(client, "otto")
    text = page.content.decode()
    assert page.status_code == 400 and "_auth_user_id" not in client.session
    assert "the clocks of the portal and of the identity provider disagree" in text
    assert "took too long" in text and "administrator" in text
    assert ANOTHER_BROWSER not in text


def _explicit_endpoints(idp: IdentityProvider, settings: Any) -> None:
    document = requests.get(f"{idp.issuer}/.well-known/openid-configuration", timeout=10).json()
    settings.PORTAL_OIDC_AUTHORIZATION_ENDPOINT = document["authorization_endpoint"]
    settings.PORTAL_OIDC_TOKEN_ENDPOINT = document["token_endpoint"]
    settings.PORTAL_OIDC_USERINFO_ENDPOINT = document["userinfo_endpoint"]
    settings.PORTAL_OIDC_JWKS_URI = document["jwks_uri"]
    settings.PORTAL_OIDC_END_SESSION_ENDPOINT = document["end_session_endpoint"]


def test_an_id_token_from_another_issuer_says_to_tell_the_administrator(
    world: World, idp: IdentityProvider, settings: Any
) -> None:
    idp.person("pia")
    _explicit_endpoints(idp, settings)  # no discovery: the first check of the issuer is the ID token's
    settings.PORTAL_OIDC_ISSUER = idp.issuer.replace("127.0.0.1", "localhost")
    client = Client()
    page = from_the_sign_in_page(client, "pia")
    text = page.content.decode()
    assert page.status_code == 400 and "_auth_user_id" not in client.session
    assert "does not match the portal&#x27;s settings for it (it comes from another issuer than" in text
    assert "Tell the portal&#x27;s administrator" in text
    assert ANOTHER_BROWSER not in text


def test_a_discovery_document_of_another_issuer_says_to_tell_the_administrator(
    world: World, idp: IdentityProvider, settings: Any
) -> None:
    settings.PORTAL_OIDC_ISSUER = idp.issuer.replace("127.0.0.1", "localhost")  # the same provider, named otherwise
    page = Client().get("/sso/start/")
    text = page.content.decode()
    assert page.status_code == 503
    assert f"the identity provider calls itself {idp.issuer}" in text and "set up wrongly" in text
    assert "Tell the portal&#x27;s administrator" in text
    assert "cannot be reached just now" not in text


def _claims(idp: IdentityProvider, **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": idp.issuer, "sub": "ivy", "aud": CLIENT_ID, "iat": now, "exp": now + 300, "nonce": "n1", **changes}


def test_each_refused_id_token_says_what_is_wrong(world: World, idp: IdentityProvider) -> None:
    backend = oidc.SsoBackend()
    now = int(time.time())
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    clocks = "the clocks of the portal and of the identity provider disagree"
    expected = {
        "expired": (idp.sign(_claims(idp, iat=now - 3600, exp=now - 600)), clocks),
        "issued in the future": (idp.sign(_claims(idp, iat=now + 3600, exp=now + 7200)), clocks),
        "not yet valid": (idp.sign(_claims(idp, nbf=now + 3600)), clocks),
        "another issuer": (idp.sign(_claims(idp, iss="http://127.0.0.1:1")), "another issuer than"),
        "another audience": (idp.sign(_claims(idp, aud="someone-else")), f"another client than {CLIENT_ID}"),
        "another key": (idp.sign(_claims(idp), key=stranger), "signature does not match the provider"),
        "no expiry": (idp.sign({k: v for k, v in _claims(idp).items() if k != "exp"}), "no 'exp' claim"),
    }
    for why, (token, says) in expected.items():
        with pytest.raises(oidc.TokenRefused) as refused:
            backend.verify_token(token, nonce="n1")
        assert says in refused.value.explain, why
        if says != clocks:
            assert "Tell the portal's administrator" in refused.value.explain, why
    # A nonce of another sign-in is about this browser's session, not the provider's settings.
    with pytest.raises(SuspiciousOperation, match="Nonce") as refused:
        backend.verify_token(idp.sign(_claims(idp)), nonce="another-nonce")
    assert not isinstance(refused.value, oidc.TokenRefused)
