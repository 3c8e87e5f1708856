"""The portal's side of the notebook sign-in handoff, and what it answers on a notebook's host.

The notebook's server side, for real behind the proxy, is in test_local_notebooks.py."""

from __future__ import annotations

import json
import os
import socketserver
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client
from django.utils import timezone

from apps.accounts.stamps import credential_stamp
from apps.audit.models import AuditEvent
from apps.compute import hosts
from apps.compute.actions import record_notebook_end
from apps.compute.models import Instance, Notebook, NotebookAuthCode
from apps.workspaces.actions import do_remove_membership
from apps.workspaces.models import Membership, Role
from tests.personas import PASSWORD, World
from tests.proxy import ROOT
from workers.backends.processes import socket_url

PUBLIC = "http://127.0.0.1:8000"
# Where the ready notebooks here are routed: a server that answers what the authorize page asks of
# a notebook's server before it issues a code (its /api), as a live Jupyter server does.
SERVER: dict[str, str] = {}


class _Api(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        found = self.path == "/api"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"version": "2.21.1"}' if found else b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        return None


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture(scope="module", autouse=True)
def _server_answers() -> Iterator[None]:
    with tempfile.TemporaryDirectory() as directory:
        server = _UnixServer(str(Path(directory) / "jupyter.sock"), _Api)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        SERVER["target"] = socket_url(server.server_address)
        try:
            yield
        finally:
            server.shutdown()
            server.server_close()


@pytest.fixture(autouse=True)
def _origins(settings: Any) -> None:
    settings.PORTAL_PUBLIC_URL = PUBLIC
    settings.PORTAL_NOTEBOOK_DOMAIN = "localhost"


def _notebook(world: World, name: str = "lab", state: str = Notebook.State.READY) -> Notebook:
    instance = Instance.objects.create(
        workspace=world.team_a, name=f"box-{name}", profile=world.cpu_small, state=Instance.State.RUNNING
    )
    target = SERVER["target"] if state == Notebook.State.READY else ""
    return Notebook.objects.create(
        workspace=world.team_a, instance=instance, name=name, profile=world.minimal, state=state, proxy_target=target
    )


def _browser(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _authorize(client: Client, label: str, next_path: str = "/") -> Any:
    return client.get(f"/notebooks/authorize/{label}/", {"next": next_path})


def _code_of(response: Any) -> str:
    return parse_qs(urlsplit(response["Location"]).query)["code"][0]


def _redeem(client: Client, notebook: Notebook, code: str, secret: str | None) -> Any:
    headers = {"Authorization": f"Bearer {secret}"} if secret is not None else {}
    return client.post(
        f"/internal/notebooks/{notebook.pk}/code/", json.dumps({"code": code}), "application/json", headers=headers
    )


# -- names and URLs -------------------------------------------------------------------------------


def test_it_gives_each_notebook_a_label_of_its_own_that_only_its_id_decides() -> None:
    assert hosts.host_label("lab", 42) == "lab-42"
    # Names may end in digits or hold '--': the id, last, decides; the name only has to match.
    assert hosts.host_label("lab-4", 2) == "lab-4-2" and hosts.pk_of_label("lab-4-2") == 2
    long_name = "a" * 60 + "-b1"
    assert len(hosts.host_label(long_name, 123456)) == 63 and hosts.pk_of_label(hosts.host_label(long_name, 123456))
    assert hosts.host_label("xn--abc", 7) == "nb-7"  # never read as an international name
    for nonsense in ("lab", "lab-", "-7", "lab-07", "lab-x", "a" * 70 + "-1"):
        assert hosts.pk_of_label(nonsense) is None


def test_its_url_is_the_root_of_its_own_host_with_the_portals_scheme_and_port(world: World, settings: Any) -> None:
    notebook = _notebook(world)
    assert notebook.url == f"http://lab-{notebook.pk}.localhost:8000/"
    settings.PORTAL_PUBLIC_URL = "https://portal.example.org"
    settings.PORTAL_NOTEBOOK_DOMAIN = "nb.example.org"
    assert notebook.url == f"https://lab-{notebook.pk}.nb.example.org/"
    assert world.client(world.alice).get(f"/api/v1/notebooks/{notebook.pk}/").json()["url"] == notebook.url


# -- the authorize page ---------------------------------------------------------------------------


def test_it_sends_a_visitor_who_is_not_signed_in_to_sign_in_first(world: World) -> None:
    notebook = _notebook(world)
    response = _authorize(Client(), notebook.host_label, "/lab")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=/notebooks/authorize/")


def test_it_answers_404_alike_for_a_missing_notebook_and_one_the_user_cannot_see(world: World) -> None:
    notebook = _notebook(world)
    charlie = _browser(world.charlie)
    hidden = _authorize(charlie, notebook.host_label)
    missing = _authorize(charlie, f"lab-{notebook.pk + 1000}")
    wrong_name = _authorize(_browser(world.alice), f"other-{notebook.pk}")
    assert hidden.status_code == missing.status_code == wrong_name.status_code == 404
    assert hidden.content == missing.content
    assert not NotebookAuthCode.objects.exists()


def test_it_refuses_a_viewer_and_issues_nothing(world: World) -> None:
    notebook = _notebook(world)
    response = _authorize(_browser(world.victor), notebook.host_label)
    assert response.status_code == 403
    assert not NotebookAuthCode.objects.exists()


def test_it_hands_a_member_a_code_for_the_notebooks_own_host(world: World) -> None:
    notebook = _notebook(world)
    response = _authorize(_browser(world.bob), notebook.host_label, "/lab/tree?x=1")
    assert response.status_code == 302
    location = urlsplit(response["Location"])
    assert (location.scheme, location.netloc, location.path) == (
        "http",
        f"lab-{notebook.pk}.localhost:8000",
        "/portal-auth/callback",
    )
    query = parse_qs(location.query)
    assert query["next"] == ["/lab/tree?x=1"]
    code = query["code"][0]
    row = NotebookAuthCode.objects.get()
    assert (row.notebook, row.user, row.used_at) == (notebook, world.bob, None)
    assert code not in row.code_hash and len(row.code_hash) == 64  # only its hash is kept
    assert timedelta(0) < row.expires_at - timezone.now() <= timedelta(seconds=60)
    assert AuditEvent.objects.filter(action="notebook.open", actor=world.bob, target_id=str(notebook.pk)).exists()


@pytest.mark.parametrize("next_path", ["//evil.example/", "https://evil.example/", "/\\evil.example", "lab", "/a\nb"])
def test_it_never_sends_the_browser_anywhere_but_a_path_on_the_notebooks_host(world: World, next_path: str) -> None:
    notebook = _notebook(world)
    response = _authorize(_browser(world.bob), notebook.host_label, next_path)
    assert parse_qs(urlsplit(response["Location"]).query)["next"] == ["/"]


def test_it_shows_a_waiting_page_for_a_starting_notebook_and_nothing_to_open_for_a_stopped_one(world: World) -> None:
    starting = _notebook(world, "starting", Notebook.State.STARTING)
    stopped = _notebook(world, "stopped", Notebook.State.STOPPED)
    bob = _browser(world.bob)
    waiting = _authorize(bob, starting.host_label)
    assert waiting.status_code == 503 and waiting["Retry-After"] == "3"
    assert b"Jupyter is starting" in waiting.content
    assert _authorize(bob, stopped.host_label).status_code == 404
    assert not NotebookAuthCode.objects.exists()


def test_it_issues_no_code_for_a_ready_notebook_whose_server_does_not_answer(world: World, tmp_path: Path) -> None:
    notebook = _notebook(world)
    bob = _browser(world.bob)
    assert _authorize(bob, notebook.host_label).status_code == 302  # its server answers: a code
    NotebookAuthCode.objects.all().delete()
    # Its server died: nothing listens on its socket any more (the host has not noticed yet).
    Notebook.objects.filter(pk=notebook.pk).update(proxy_target=socket_url(tmp_path / "jupyter.sock"))
    waiting = _authorize(bob, notebook.host_label)
    assert waiting.status_code == 503 and waiting["Retry-After"] == "3"
    assert b"being started again" in waiting.content
    assert not NotebookAuthCode.objects.exists()


def test_the_codes_of_a_notebook_that_ended_are_void(world: World) -> None:
    notebook = _notebook(world)
    code = _code_of(_authorize(_browser(world.bob), notebook.host_label))
    record_notebook_end(notebook, Notebook.State.FAILED, "its processes ended 4 times")
    assert not NotebookAuthCode.objects.exists()
    assert _redeem(Client(), notebook, code, notebook.access_token).status_code == 403


# -- what the notebook's server asks, with its secret -------------------------------------------------


def test_a_code_is_redeemed_once_by_its_notebooks_server_for_the_user_it_was_issued_to(world: World) -> None:
    notebook = _notebook(world)
    code = _code_of(_authorize(_browser(world.bob), notebook.host_label))
    server = Client()
    first = _redeem(server, notebook, code, notebook.access_token)
    assert (first.status_code, first.json()) == (200, {"username": "bob", "stamp": credential_stamp(world.bob)})
    again = _redeem(server, notebook, code, notebook.access_token)
    assert again.status_code == 403  # reused


def test_a_code_is_refused_without_the_notebooks_secret_and_stays_unspent(world: World) -> None:
    notebook, other = _notebook(world), _notebook(world, "other")
    code = _code_of(_authorize(_browser(world.bob), notebook.host_label))
    server = Client()
    for secret in (None, "", "not-the-secret", other.access_token):
        assert _redeem(server, notebook, code, secret).status_code == 403, secret
    assert _redeem(server, notebook, code, notebook.access_token).json()["username"] == "bob"


def test_a_code_is_refused_by_another_notebooks_server(world: World) -> None:
    notebook, other = _notebook(world), _notebook(world, "other")
    code = _code_of(_authorize(_browser(world.bob), notebook.host_label))
    assert _redeem(Client(), other, code, other.access_token).status_code == 403
    assert _redeem(Client(), notebook, code, notebook.access_token).status_code == 200  # still its own


def test_an_expired_code_is_refused(world: World) -> None:
    notebook = _notebook(world)
    code = _code_of(_authorize(_browser(world.bob), notebook.host_label))
    NotebookAuthCode.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert _redeem(Client(), notebook, code, notebook.access_token).status_code == 403


def test_a_code_of_someone_who_lost_access_since_is_refused(world: World) -> None:
    notebook = _notebook(world)
    dora = type(world.alice).objects.create_user("dora", "dora@example.org", "x")
    membership = Membership.objects.create(workspace=world.team_a, user=dora, role=Role.MEMBER)
    code = _code_of(_authorize(_browser(dora), notebook.host_label))
    do_remove_membership(membership, acting_user=world.alice)
    assert _redeem(Client(), notebook, code, notebook.access_token).status_code == 403


def test_the_server_asks_whether_a_user_may_still_use_it(world: World) -> None:
    notebook = _notebook(world)
    server = Client(headers={"Authorization": f"Bearer {notebook.access_token}"})
    url = f"/internal/notebooks/{notebook.pk}/users/"
    stamps = {user.username: credential_stamp(user) for user in (world.bob, world.victor, world.charlie)}
    assert server.get(f"{url}bob/", {"stamp": stamps["bob"]}).json() == {"username": "bob"}
    for refused in ("victor", "charlie"):
        assert server.get(f"{url}{refused}/", {"stamp": stamps[refused]}).status_code == 403, refused
    assert server.get(f"{url}nobody/", {"stamp": stamps["bob"]}).status_code == 403
    assert Client().get(f"{url}bob/", {"stamp": stamps["bob"]}).status_code == 403  # without the notebook's secret
    config = server.get(f"/internal/notebooks/{notebook.pk}/").json()
    assert config == {"authorize_url": f"{PUBLIC}/notebooks/authorize/lab-{notebook.pk}/", "label": notebook.host_label}


@pytest.mark.parametrize("change", ["password", "deactivated", "unusable password"])
def test_a_users_session_on_a_notebook_ends_with_a_change_of_their_credentials(world: World, change: str) -> None:
    notebook = _notebook(world)
    code = _code_of(_authorize(_browser(world.bob), notebook.host_label))
    stamp = _redeem(Client(), notebook, code, notebook.access_token).json()["stamp"]
    server = Client(headers={"Authorization": f"Bearer {notebook.access_token}"})
    url = f"/internal/notebooks/{notebook.pk}/users/bob/"
    assert server.get(url, {"stamp": stamp}).status_code == 200
    for wrong in ({}, {"stamp": ""}, {"stamp": "0" * 32}, {"stamp": stamp + "0"}, {"stamp": "x" * 5000}):
        assert server.get(url, wrong).status_code == 403, wrong
    bob = world.bob
    if change == "password":
        bob.set_password("a new password")
    elif change == "deactivated":
        bob.is_active = False
    else:  # single sign-on ended it
        bob.set_unusable_password()
    bob.save()
    assert server.get(url, {"stamp": stamp}).status_code == 403


# -- the portal on a notebook's host ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/api/v1/workspaces/", "/login/", "/admin/", "/static/web/portal.css", "/x?y=1"])
def test_a_notebook_host_gets_the_sign_in_redirect_and_nothing_of_the_portal(world: World, path: str) -> None:
    bob = _browser(world.bob)  # even with the portal's session (which a browser would never send there)
    response = bob.get(path, headers={"Host": "lab-999999.localhost:8000"})
    assert response.status_code == 302
    assert response["Location"] == hosts.unauthenticated_redirect(
        f"{PUBLIC}/notebooks/authorize/lab-999999/", *path.partition("?")[::2]
    )
    assert response.content == b"" and not response.cookies
    refused = bob.get("/portal-auth/callback", {"code": "x"}, headers={"Host": "lab-999999.localhost:8000"})
    assert refused.status_code == 403 and b"invalid or has expired" in refused.content


def test_the_portal_answers_on_its_own_hosts_as_ever(world: World) -> None:
    for host in ("127.0.0.1:8000", "localhost:8000"):  # the domain itself is no notebook's host
        assert Client().get("/login/", headers={"Host": host}).status_code == 200


def test_the_portals_cookies_are_host_only(world: World) -> None:
    client = Client()
    page = client.get("/login/")
    form = {"username": "bob", "password": PASSWORD, "csrfmiddlewaretoken": page.cookies["csrftoken"].value}
    response = client.post("/login/", form)
    assert response.status_code == 302
    assert response.cookies["sessionid"]["domain"] == "" and page.cookies["csrftoken"]["domain"] == ""


# -- settings ------------------------------------------------------------------------------------


def _check(**env: str) -> subprocess.CompletedProcess[str]:
    """``manage.py check`` with these settings in the environment (and none of the runner's)."""
    drop = {"SECRET_KEY", "ALLOWED_HOSTS", "PORTAL_ENV", "PORTAL_NOTEBOOK_DOMAIN", "PORTAL_PUBLIC_URL"}
    base = {k: v for k, v in os.environ.items() if k not in drop}
    command = [sys.executable, "manage.py", "check"]
    return subprocess.run(command, cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ALLOWED_HOSTS": "127.0.0.1,.localhost"}, "must lie outside PORTAL_NOTEBOOK_DOMAIN"),
        ({"ALLOWED_HOSTS": "*"}, "must lie outside PORTAL_NOTEBOOK_DOMAIN"),
        ({"PORTAL_PUBLIC_URL": "http://portal.localhost:8000"}, "must lie outside PORTAL_NOTEBOOK_DOMAIN"),
        ({"PORTAL_PUBLIC_URL": "http://127.0.0.1:8000/portal"}, "must be http(s)://host[:port], no path"),
        ({"PORTAL_NOTEBOOK_DOMAIN": "nb_example.org"}, "is not a DNS name"),
        (
            {"PORTAL_ENV": "production", "SECRET_KEY": "k" * 60, "ALLOWED_HOSTS": "portal.example.org"},
            "PORTAL_NOTEBOOK_DOMAIN must name the notebooks' wildcard domain in production",
        ),
    ],
)
def test_the_portal_refuses_to_start_where_its_hosts_and_the_notebooks_would_mix(
    env: dict[str, str], message: str
) -> None:
    result = _check(**env)
    assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]
