"""Instances and notebooks launched through the API run for real on the local backend, and each
notebook is reached on its own host name through the real proxy (routing by host), signed in by
the portal's handoff: a real Jupyter server, a real configurable-http-proxy, the live portal.

A browser resolves ``<name>-<id>.localhost`` to loopback; these tests' client does the same
(tests/proxy.py), and otherwise goes where a browser goes: redirects across hosts, each host's
own cookies only."""

from __future__ import annotations

import ast
import json
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import websocket
from django.conf import settings as django_settings
from django.utils import timezone

from apps.catalog.models import NotebookProfile
from apps.compute.hosting import instance_dir
from apps.compute.models import Instance, Notebook, NotebookAuthCode
from apps.inventory.models import Allocation
from apps.workloads.host import reconcile
from apps.workspaces.actions import do_remove_membership
from apps.workspaces.models import Membership, Role
from tests.personas import PASSWORD, World, api_token
from tests.proxy import Proxy, browser_session, loopback_ws_options
from tests.proxy import sign_in as portal_sign_in

SESSION_COOKIE = "gpuportal-notebook"
# Headers that differ between any two answers, whoever sends them.
PER_ANSWER = {"date", "connection", "keep-alive", "etag"}


@pytest.fixture
def jupyter_profile(tx_world: World) -> NotebookProfile:
    """A profile of just the Jupyter server and a kernel (the environment is built once, cached)."""
    return NotebookProfile.objects.create(name="kernel-only", image="quay.io/jupyter/base-notebook", published=True)


def _token(user: Any) -> str:
    return api_token(user)


def _pids(row: Instance | Notebook) -> list[int]:
    return [r["pid"] for r in (row.backend_state or {}).get("replicas", [])]


def _kill(row: Instance | Notebook) -> None:
    """SIGKILL every process group of the row's replicas, and wait until they are gone: a signal
    is delivered when its process next runs, not when kill() returns."""
    pids = _pids(row)
    for pid in pids:
        os.killpg(pid, 9)
    deadline = time.monotonic() + 15
    while _alive(pids):
        assert time.monotonic() < deadline, f"{_alive(pids)} still alive after SIGKILL"
        time.sleep(0.05)


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0] != "Z":
                alive.append(pid)
        except OSError:
            continue
    return alive


def _launch_instance(world: World) -> Instance:
    body = {"workspace": "team-a", "name": "box", "profile": "gpu-1"}
    response = world.client(world.alice).post("/api/v1/instances/", body, format="json")
    assert response.status_code == 201, response.content
    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == Instance.State.RUNNING, instance.failure_reason
    return instance


def _launch_notebook(world: World, instance: Instance, profile: NotebookProfile, name: str = "lab") -> Notebook:
    body = {"workspace": "team-a", "name": name, "instance": instance.pk, "profile": profile.name}
    response = world.client(world.alice).post("/api/v1/notebooks/", body, format="json")
    assert response.status_code == 201, response.content
    notebook = Notebook.objects.get(pk=response.json()["id"])
    assert notebook.state == Notebook.State.READY, notebook.failure_reason
    return notebook


def _launch(world: World, profile: NotebookProfile) -> tuple[Instance, Notebook]:
    instance = _launch_instance(world)
    return instance, _launch_notebook(world, instance, profile)


def sign_in(proxy: Proxy, username: str) -> requests.Session:
    return portal_sign_in(proxy.url, username, PASSWORD)


def _xsrf_headers(browser: requests.Session, notebook: Notebook) -> dict[str, str]:
    """What Jupyter's own pages send with a request that changes something (its XSRF cookie)."""
    return {"X-XSRFToken": browser.cookies.get("_xsrf", domain=notebook.host) or ""}


def run_cell(browser: requests.Session, notebook: Notebook, code: str, headers: dict[str, str]) -> str:
    """Start a kernel and run ``code`` in it over its WebSocket, as Jupyter's page does."""
    kernel = browser.post(f"{notebook.url}api/kernels", headers=headers, json={"name": "python3"}, timeout=30)
    assert kernel.status_code == 201, kernel.text
    ws_url = notebook.url.replace("http://", "ws://") + f"api/kernels/{kernel.json()['id']}/channels"
    address, options = loopback_ws_options(ws_url)
    cookie = "; ".join(f"{c.name}={c.value}" for c in browser.cookies if c.domain == notebook.host)
    header = [f"{k}: {v}" for k, v in headers.items()]
    sock = websocket.create_connection(address, header=header, cookie=cookie or None, timeout=30, **options)
    try:
        msg_id = uuid.uuid4().hex
        header_ = {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": msg_id, "version": "5.3"}
        content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
        sock.send(json.dumps({"header": header_, "parent_header": {}, "metadata": {}, "channel": "shell",
                              "buffers": [], "content": content}))  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = json.loads(sock.recv())
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "execute_result":
                return str(message["content"]["data"]["text/plain"])
            if message["msg_type"] == "error":
                raise AssertionError(message["content"])
        raise AssertionError("no execute_result within 30 s")
    finally:
        sock.close()


# Run in a kernel: how it talks to its server, and who may enter the directory of its sockets.
KERNEL_SOCKETS = (
    "import ipykernel.connect, os; info = ipykernel.connect.get_connection_info(unpack=True); "
    "(info['transport'], os.stat(os.path.dirname(info['ip'])).st_mode & 0o777)"
)


def server_logs() -> str:
    """The last lines the notebook servers logged, for a failing assertion's message."""
    logs = sorted(Path(django_settings.PORTAL_RUN_DIR).rglob("*.log"))
    return "\n".join(f"== {log}\n{log.read_text(errors='replace')[-2000:]}" for log in logs)


def _answer(response: requests.Response, label: str) -> tuple[Any, ...]:
    """What a client can tell of an answer: status, where it points (the label written generically),
    body, and its headers' names and values."""
    headers = {
        k.lower(): v.replace(label, "<label>") for k, v in response.headers.items() if k.lower() not in PER_ANSWER
    }
    return response.status_code, response.content.replace(label.encode(), b"<label>"), sorted(headers.items())


def _code_for(browser: requests.Session, notebook: Notebook) -> str:
    """The portal's one-time code for ``browser``'s user, as its authorize page hands it out."""
    answer = browser.get(f"{notebook.url}api/status", allow_redirects=False, timeout=10)
    authorize = browser.get(answer.headers["Location"], allow_redirects=False, timeout=10)
    assert authorize.status_code == 302, authorize.text[:300]
    return parse_qs(urlsplit(authorize.headers["Location"]).query)["code"][0]


def _callback(notebook: Notebook, code: str, next_path: str = "/api/status") -> requests.Response:
    return browser_session().get(
        f"{notebook.url}portal-auth/callback", params={"code": code, "next": next_path}, timeout=10
    )


def test_a_member_signs_in_through_the_portal_and_runs_a_kernel_on_the_notebooks_own_host(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    instance, notebook = _launch(tx_world, jupyter_profile)
    # The instance holds exactly its GPU, and its notebook server runs with it.
    devices = [str(i) for i in Allocation.objects.filter(workload=instance).values_list("gpu__index", flat=True)]
    assert len(devices) == 1
    assert instance.backend_state["replicas"][0]["devices"] == devices
    assert notebook.backend_state["replicas"][0]["devices"] == devices
    port = urlsplit(proxy.url).port
    assert notebook.url == f"http://lab-{notebook.pk}.localhost:{port}/"
    assert proxy.routes()[f"/lab-{notebook.pk}.localhost"]["portal_notebook"] == notebook.pk

    # bob, a member, opens it: the notebook's host sends him to the portal, which hands him back
    # with a one-time code; the server redeems it and sets a session of its own.
    bob = sign_in(proxy, "bob")
    page = bob.get(notebook.url, timeout=30)
    hops = [(r.status_code, urlsplit(r.url).hostname, urlsplit(r.url).path) for r in page.history]
    # The notebook's own link opens JupyterLab (not the server's bare "A Jupyter Server is running").
    assert page.status_code == 200 and "<title>JupyterLab</title>" in page.text, (hops, page.text[:300])
    assert page.url == f"{notebook.url}lab"
    assert hops == [
        (302, notebook.host, "/"),
        (302, "127.0.0.1", f"/notebooks/authorize/{notebook.host_label}/"),
        (302, notebook.host, "/portal-auth/callback"),
        (302, notebook.host, "/"),  # then the server's root sends it on to JupyterLab
    ]
    # The portal's session and CSRF cookies never went to the notebook's host: they are host-only.
    for response in [*page.history, page]:
        if urlsplit(response.url).hostname == notebook.host:
            sent = response.request.headers.get("Cookie", "")
            assert "sessionid" not in sent and "csrftoken" not in sent, sent
    session = next(c for c in bob.cookies if c.name == SESSION_COOKIE)
    assert session.domain == notebook.host and not session.domain_specified and session.path == "/"
    assert session.has_nonstandard_attr("HttpOnly") and session.get_nonstandard_attr("SameSite") == "Lax"
    assert NotebookAuthCode.objects.get(user=tx_world.bob).used_at is not None

    # With that session (and Jupyter's XSRF cookie, as its pages send it) a kernel runs a cell.
    assert run_cell(bob, notebook, "6*7", _xsrf_headers(bob, notebook)) == "42"
    # Its kernel listens on no loopback port any process could reach (or another server pick):
    # it talks to its server over Unix sockets in a directory only the notebook's account enters.
    where = run_cell(bob, notebook, KERNEL_SOCKETS, _xsrf_headers(bob, notebook))
    transport, mode = ast.literal_eval(where)
    assert (transport, mode) == ("ipc", 0o700), where

    # The server's own token still opens it, for IDEs and scripts, in a header or the URL.
    token = {"Authorization": f"token {notebook.access_token}"}
    assert browser_session().get(f"{notebook.url}api/status", headers=token, timeout=10).status_code == 200
    assert run_cell(browser_session(), notebook, "6*7", token) == "42"
    with_token = browser_session()
    by_url = with_token.get(f"{notebook.url}api/status", params={"token": notebook.access_token}, timeout=10)
    assert by_url.status_code == 200 and not by_url.history
    # ...and a browser that came with it in the URL stays signed in, as with Jupyter.
    assert with_token.get(f"{notebook.url}api/contents", allow_redirects=False, timeout=10).status_code == 200
    wrong = browser_session().get(f"{notebook.url}api/status", params={"token": "nope"}, allow_redirects=False)
    assert wrong.status_code == 302

    # The old path on the portal's own host serves nothing of the notebook.
    old = browser_session().get(f"{proxy.url}/notebooks/team-a/lab/api/status", headers=token, timeout=10)
    assert old.status_code == 404 and "application/json" not in old.headers.get("Content-Type", "")

    # Deleting the notebook removes its route and its process: its host answers like any other.
    server_pids = _pids(notebook)
    assert _alive(server_pids)
    response = tx_world.client(tx_world.alice).delete(f"/api/v1/notebooks/{notebook.pk}/")
    assert response.status_code in (200, 204), response.content
    notebook.refresh_from_db()
    assert notebook.state == Notebook.State.STOPPED
    assert not _alive(server_pids)
    assert not any("portal_notebook" in route for route in proxy.routes().values())
    gone = bob.get(f"{notebook.url}api/status", headers=token, allow_redirects=False, timeout=10)
    assert gone.status_code == 302 and "/notebooks/authorize/" in gone.headers["Location"]

    # Deleting the instance stops its processes and frees its GPU.
    holder_pids = _pids(instance)
    assert _alive(holder_pids)
    response = tx_world.client(tx_world.alice).delete(f"/api/v1/instances/{instance.pk}/")
    assert response.status_code in (200, 204), response.content
    instance.refresh_from_db()
    assert instance.state == Instance.State.DELETED
    assert not _alive(holder_pids)
    assert not Allocation.objects.filter(workload=instance).exists()


def test_nothing_of_a_notebook_answers_without_access_and_a_missing_one_answers_alike(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    instance, notebook = _launch(tx_world, jupyter_profile)
    (Path(instance_dir(instance)) / "notes.txt").write_text("private")
    ghost_label = f"lab-{notebook.pk + 1000}"
    ghost_url = notebook.url.replace(notebook.host_label, ghost_label)
    paths = ["/", "/static/favicons/favicon.ico", "/api", "/api/status", "/api/contents", "/api/kernels",
             "/api/kernelspecs/", "/files/notes.txt", "/metrics", "/robots.txt", "/login", "/tree?x=1"]  # fmt: skip
    token = {"Authorization": f"token {notebook.access_token}"}
    # What the gate hides is there: with the server's token, these answer.
    for path in ("/static/favicons/favicon.ico", "/api/contents", "/files/notes.txt"):
        assert browser_session().get(notebook.url + path[1:], headers=token, timeout=10).status_code == 200, path

    anonymous = browser_session()
    for path in paths:
        for method in ("GET", "POST"):
            existing = anonymous.request(method, notebook.url + path[1:], allow_redirects=False, timeout=10)
            assert existing.status_code == 302, (method, path, existing.status_code)
            if path.startswith("/static/"):
                # pytest-django's live server answers /static/ itself, before the portal's middleware
                # sees the host; the portal proper does not (test_notebook_handoff, tests/browser).
                path = "/static-elsewhere"
                existing = anonymous.request(method, notebook.url + path[1:], allow_redirects=False, timeout=10)
            missing = anonymous.request(method, ghost_url + path[1:], allow_redirects=False, timeout=10)
            assert _answer(existing, notebook.host_label) == _answer(missing, ghost_label), (method, path)
            assert existing.headers["Location"].startswith(f"{proxy.url}/notebooks/authorize/{notebook.host_label}/")
    refused = [_callback(n, "not-a-code") for n in (notebook, Notebook(pk=notebook.pk + 1000, name="lab"))]
    assert refused[0].status_code == 403
    assert _answer(refused[0], notebook.host_label) == _answer(refused[1], ghost_label)
    # A kernel's WebSocket is refused before it opens, alike.
    for url in (notebook.url, ghost_url):
        address, options = loopback_ws_options(url.replace("http://", "ws://") + "api/kernels/x/channels")
        with pytest.raises(websocket.WebSocketBadStatusException) as refused_ws:
            websocket.create_connection(address, timeout=10, **options)
        assert refused_ws.value.status_code == 403

    # Someone of another workspace, signed in to the portal, ends on the same 404 for both; a
    # viewer is told no; a member's portal API token is no key to the notebook (the server passes
    # no portal credential on).
    charlie = sign_in(proxy, "charlie")
    for path in ("/", "/api/contents", "/static/favicons/favicon.ico"):
        existing = charlie.get(notebook.url + path[1:], timeout=10)
        missing = charlie.get(ghost_url + path[1:], timeout=10)
        assert existing.status_code == missing.status_code == 404, path
        assert existing.content == missing.content
    victor = sign_in(proxy, "victor")
    assert victor.get(notebook.url, timeout=10).status_code == 403
    portal_token = {"Authorization": f"Token {_token(tx_world.bob)}"}
    with_portal_token = anonymous.get(f"{notebook.url}api/status", headers=portal_token, allow_redirects=False)
    assert with_portal_token.status_code == 302
    assert not NotebookAuthCode.objects.exists()


def test_a_sign_in_code_is_refused_when_reused_expired_or_another_notebooks(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    instance = _launch_instance(tx_world)
    notebook = _launch_notebook(tx_world, instance, jupyter_profile)
    other = _launch_notebook(tx_world, instance, jupyter_profile, name="other")
    bob = sign_in(proxy, "bob")

    # Another notebook's server cannot redeem it (and leaves it to its own).
    code = _code_for(bob, notebook)
    foreign = _callback(other, code)
    assert foreign.status_code == 403 and SESSION_COOKIE not in foreign.cookies
    first = _callback(notebook, code)
    assert first.status_code == 200 and first.json().get("started")
    assert [urlsplit(r.url).path for r in first.history] == ["/portal-auth/callback"]
    # Spent: a second use is refused.
    reused = _callback(notebook, code)
    assert reused.status_code == 403 and not reused.history
    # Expired: refused.
    code = _code_for(bob, notebook)
    NotebookAuthCode.objects.filter(used_at__isnull=True).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert _callback(notebook, code).status_code == 403
    # Where it sends the browser next is a path on the notebook's host, nothing else.
    code = _code_for(bob, notebook)
    elsewhere = browser_session().get(
        f"{notebook.url}portal-auth/callback",
        params={"code": code, "next": "https://evil.example/"},
        allow_redirects=False,
        timeout=10,
    )
    assert (elsewhere.status_code, elsewhere.headers["Location"]) == (302, "/")


def test_removing_a_members_access_ends_their_notebook_session_at_the_next_request(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    _, notebook = _launch(tx_world, jupyter_profile)
    dora = type(tx_world.alice).objects.create_user("dora", "dora@example.org", PASSWORD)
    membership = Membership.objects.create(workspace=tx_world.team_a, user=dora, role=Role.MEMBER)
    browser = sign_in(proxy, "dora")
    assert browser.get(f"{notebook.url}api/status", timeout=30).status_code == 200
    assert browser.get(f"{notebook.url}api/contents", allow_redirects=False, timeout=10).status_code == 200

    do_remove_membership(membership, acting_user=tx_world.alice)
    time.sleep(1.1)  # the server reuses the portal's answer for at most a second
    refused = browser.get(f"{notebook.url}api/contents", allow_redirects=False, timeout=10)
    assert refused.status_code == 302 and "/notebooks/authorize/" in refused.headers["Location"]
    assert browser.get(f"{notebook.url}api/contents", timeout=10).status_code == 404  # the portal: not hers to see
    assert not any(c.name == SESSION_COOKIE for c in browser.cookies)  # the server dropped her session


def test_deleting_an_instance_stops_its_notebooks(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    instance, notebook = _launch(tx_world, jupyter_profile)
    pids = _pids(instance) + _pids(notebook)
    response = tx_world.client(tx_world.alice).delete(f"/api/v1/instances/{instance.pk}/")
    assert response.status_code in (200, 204)
    notebook.refresh_from_db()
    instance.refresh_from_db()
    assert (instance.state, notebook.state) == (Instance.State.DELETED, Notebook.State.STOPPED)
    assert not _alive(pids)
    assert proxy.routes() == {} or all("portal_notebook" not in r for r in proxy.routes().values())


def test_reconcile_restarts_dead_servers_drops_stale_routes_and_restores_lost_ones(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile, settings: Any
) -> None:
    instance, notebook = _launch(tx_world, jupyter_profile)
    token = {"Authorization": f"token {notebook.access_token}"}
    # The server dies (a crash, the machine's OOM killer): reconcile starts it again.
    _kill(notebook)
    reconcile()
    notebook.refresh_from_db()
    assert notebook.state == Notebook.State.READY
    assert notebook.restarts == 1
    assert _alive(_pids(notebook))
    assert browser_session().get(f"{notebook.url}api/status", headers=token, timeout=10).ok

    # A route nobody owns any more (left by a crash between stop and record) is removed, and the
    # route of a ready notebook that the proxy lost (a proxy restart) comes back.
    api = {"Authorization": f"token {proxy.token}"}
    requests.post(
        f"{proxy.api_url}/api/routes/ghost-999999.localhost",
        headers=api,
        json={"target": "http://127.0.0.1:9", "portal_notebook": 999999},
        timeout=5,
    ).raise_for_status()
    requests.delete(f"{proxy.api_url}/api/routes/{notebook.host}", headers=api, timeout=5).raise_for_status()
    counts = reconcile()
    assert (counts["routes_removed"], counts["routes_added"]) == (1, 1)
    assert "/ghost-999999.localhost" not in proxy.routes()
    assert browser_session().get(f"{notebook.url}api/status", headers=token, timeout=10).ok
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING

    # Past the restart limit it fails, saying how its processes ended the last time.
    settings.PORTAL_RESTART_LIMIT = 1
    _kill(Notebook.objects.get(pk=notebook.pk))
    reconcile()
    notebook.refresh_from_db()
    assert notebook.state == Notebook.State.FAILED
    assert notebook.failure_reason.startswith("its processes ended 2 times, the last time exited with code"), (
        notebook.failure_reason
    )
