"""A real OpenID Connect provider on loopback (tests/idp/provider.mjs, the npm `oidc-provider`), and
a person's way through its sign-in form without a browser."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import jwt
import requests
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("provider.mjs")
CLIENT_ID = "gpuportal"
CLIENT_SECRET = "test-client-secret-not-used-anywhere-else"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class IdentityProvider:
    issuer: str
    accounts_file: Path
    private_key: rsa.RSAPrivateKey
    kid: str
    accounts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def person(self, login: str, *, groups: list[str] | None = None, **claims: Any) -> None:
        """Add or change a person; read by the provider at their next sign-in."""
        self.accounts[login] = {
            "email": f"{login}@example.org",
            "email_verified": True,
            "preferred_username": login,
            "name": login.title(),
            "groups": groups or [],
            **claims,
        }
        self.accounts_file.write_text(json.dumps(self.accounts))

    def sign(self, claims: dict[str, Any], *, key: rsa.RSAPrivateKey | None = None) -> str:
        """An ID token signed with the provider's own key (or another one)."""
        return jwt.encode(claims, key or self.private_key, algorithm="RS256", headers={"kid": self.kid})

    def settings(self) -> dict[str, Any]:
        """The portal's settings for this provider, as its environment variables would set them."""
        return {
            "PORTAL_OIDC_ISSUER": self.issuer,
            "PORTAL_OIDC_CLIENT_ID": CLIENT_ID,
            "PORTAL_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "PORTAL_OIDC_SCOPES": "openid email profile groups",
        }

    def env(self) -> dict[str, str]:
        return {key: str(value) for key, value in self.settings().items()}


@contextmanager
def identity_provider(
    tmp: Path, *, redirect_uris: list[str], logout_uris: list[str], port: int | None = None
) -> Iterator[IdentityProvider]:
    """The provider, started for a portal whose sign-in ends at `redirect_uris` (on `port`, if given:
    a portal reads the provider's configuration when first needed, so it may start first)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    kid = "test-key-1"
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
    jwk.pop("key_ops", None)  # PyJWT marks a private key "sign" only; the provider verifies with it too
    jwk.update(kid=kid, use="sig", alg="RS256")
    port = port or free_port()
    idp = IdentityProvider(
        issuer=f"http://127.0.0.1:{port}", accounts_file=tmp / "idp-accounts.json", private_key=key, kid=kid
    )
    idp.accounts_file.write_text("{}")
    client = {
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "redirect_uris": redirect_uris,
        "post_logout_redirect_uris": logout_uris,
    }
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "NODE_PATH": str(ROOT / "node_modules"),
        "IDP_PORT": str(port),
        "IDP_CLIENT": json.dumps(client),
        "IDP_JWKS": json.dumps({"keys": [jwk]}),
        "IDP_ACCOUNTS": str(idp.accounts_file),
    }
    log = (tmp / "idp.log").open("wb")
    process = subprocess.Popen(["node", str(SCRIPT)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{idp.issuer}/.well-known/openid-configuration", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert process.poll() is None, (tmp / "idp.log").read_text()
            assert time.monotonic() < deadline, "the identity provider did not start"
            time.sleep(0.1)
        yield idp
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def through_the_provider(
    authorize_url: str, login: str, *, back_to: str, session: requests.Session | None = None
) -> str:
    """Follow an authorization request through the provider's sign-in form as `login`, to the
    address it sends the browser back to (under `back_to`), which is returned, not followed."""
    browser = session or requests.Session()
    url = authorize_url
    for _ in range(10):
        if url.startswith(back_to):
            return url
        answer = browser.get(url, allow_redirects=False, timeout=10)
        if answer.is_redirect:
            url = urljoin(url, answer.headers["Location"])
            continue
        form = re.search(r'<form[^>]*action="([^"]+)"', answer.text)
        assert answer.status_code == 200 and form, (answer.status_code, answer.text[:2000])
        submitted = browser.post(
            urljoin(url, form.group(1)),
            data={"prompt": "login", "login": login, "password": "any"},
            allow_redirects=False,
            timeout=10,
        )
        assert submitted.is_redirect, (submitted.status_code, submitted.text[:2000])
        url = urljoin(url, submitted.headers["Location"])
    raise AssertionError(f"no way back to {back_to} from {authorize_url}")
