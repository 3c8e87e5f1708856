"""A real configurable-http-proxy in front of a test server, as deploy/run.sh puts one in front
of the portal, routing by host: for tests that reach notebooks the way a browser does, each on
its own host name under ``localhost``.

Chromium resolves every ``*.localhost`` name to loopback; Python's resolver here does not, so
``browser_session()`` does it the browser's way (one narrow point: the address it connects to)."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from requests.adapters import HTTPAdapter

ROOT = Path(__file__).resolve().parent.parent
CHP = ROOT / "node_modules" / ".bin" / "configurable-http-proxy"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Proxy:
    url: str  # the public side, where browsers go
    api_url: str
    token: str
    process: subprocess.Popen[bytes]

    def routes(self) -> dict[str, dict[str, object]]:
        request = urllib.request.Request(f"{self.api_url}/api/routes", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return dict(json.loads(response.read()))


@contextmanager
def running_proxy(default_target: str, log: Path, *, x_forward: bool = False) -> Iterator[Proxy]:
    """The proxy; with `x_forward`, adding X-Forwarded-For and the like as the embedded portal's does."""
    if not CHP.exists():
        raise RuntimeError(f"{CHP} is missing: run deploy/test.sh, which installs the pinned Node packages")
    port, api_port, token = free_port(), free_port(), secrets.token_hex(16)
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [str(CHP), "--ip", "127.0.0.1", "--port", str(port), "--api-ip", "127.0.0.1", "--api-port", str(api_port),
             "--default-target", default_target, "--host-routing", "--log-level", "warn",
             *([] if x_forward else ["--no-x-forward"])],
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "CONFIGPROXY_AUTH_TOKEN": token},
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    proxy = Proxy(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{api_port}", token, process)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                proxy.routes()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"configurable-http-proxy did not start; see {log}") from None
                time.sleep(0.1)
        yield proxy
    finally:
        process.terminate()
        process.wait(timeout=10)


class LoopbackNames(HTTPAdapter):
    """Connects to 127.0.0.1 for a ``*.localhost`` URL, with the name in the Host header, as a
    browser does; cookies, redirects and everything else see the name."""

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        parts = urlsplit(request.url or "")
        if not (parts.hostname or "").endswith(".localhost"):
            return super().send(request, **kwargs)
        routed = request.copy()
        routed.url = urlunsplit(parts._replace(netloc=f"127.0.0.1:{parts.port or 80}"))
        routed.headers["Host"] = parts.netloc
        response = super().send(routed, **kwargs)
        response.request, response.url = request, request.url or ""
        return response


def browser_session() -> requests.Session:
    """A client that goes where a browser goes: ``*.localhost`` is loopback, redirects are followed
    across hosts, and each host gets only its own cookies."""
    session = requests.Session()
    session.mount("http://", LoopbackNames())
    return session


def loopback_ws_options(url: str) -> tuple[str, dict[str, Any]]:
    """``websocket.create_connection`` arguments for a ``ws://<name>.localhost:<port>/...`` URL."""
    parts = urlsplit(url)
    address = urlunsplit(parts._replace(netloc=f"127.0.0.1:{parts.port or 80}"))
    return address, {"host": parts.netloc, "origin": f"http://{parts.netloc}"}


def sign_in(portal_url: str, username: str, password: str) -> requests.Session:
    """A browser signed in to the portal through its sign-in page (its cookies on the portal's host)."""
    browser = browser_session()
    login = f"{portal_url}/login/"
    browser.get(login, timeout=10).raise_for_status()
    form = {"username": username, "password": password, "csrfmiddlewaretoken": browser.cookies["csrftoken"]}
    response = browser.post(login, data=form, timeout=10)
    if not (response.ok and "sessionid" in browser.cookies):
        raise AssertionError(f"{username} could not sign in: {response.status_code} {response.text[:300]}")
    return browser
