"""Live updates: every process's state changes reach the pages' sockets, the heartbeat tells a page
that they do, and the admin console's socket hears every workspace, for platform admins only.

The first tests run the consumers on the test settings' channel layer (Redis). The last ones run the
embedded default's layer (SQLite, no Redis) across real processes: Daphne serving the web consumer,
and a separate process that sends, as the worker and the scheduler loop do."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from apps.jobs.actions import check_submit_job
from apps.workspaces.live import heartbeat
from portal.routing import websocket_urlpatterns
from tests.personas import World
from tests.proxy import ROOT, free_port


async def _open(user: Any, path: str) -> tuple[WebsocketCommunicator, bool]:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    return communicator, connected


def test_the_console_socket_hears_every_workspace(tx_world: World) -> None:
    async def scenario() -> tuple[dict[str, Any], int]:
        communicator, connected = await _open(tx_world.admin, "/ws/console/")
        assert connected
        job = await database_sync_to_async(check_submit_job)(
            tx_world.team_b, name="elsewhere", command="true", acting_user=tx_world.charlie
        )
        message = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return message, job.pk

    message, job = async_to_sync(scenario)()
    assert (message["kind"], message["id"], message["workspace_id"]) == ("job", job, tx_world.team_b.pk)


def test_only_platform_admins_may_open_the_console_socket(tx_world: World) -> None:
    from django.contrib.auth.models import AnonymousUser

    tx_world.admin.is_active = False
    tx_world.admin.save()

    async def scenario() -> list[bool]:
        # A member, a workspace's own user, someone signed out and a disabled admin.
        users = (tx_world.alice, tx_world.charlie, AnonymousUser(), tx_world.admin)
        answers = []
        for user in users:
            communicator, connected = await _open(user, "/ws/console/")
            await communicator.disconnect()  # nothing of the consumer is left running
            answers.append(connected)
        return answers

    assert async_to_sync(scenario)() == [False, False, False, False]


def test_a_heartbeat_reaches_every_open_page(tx_world: World) -> None:
    async def scenario() -> list[dict[str, Any]]:
        page, connected = await _open(tx_world.bob, "/ws/workspaces/team-a/")
        console, console_connected = await _open(tx_world.admin, "/ws/console/")
        assert connected and console_connected
        await database_sync_to_async(heartbeat)()
        messages = [await page.receive_json_from(timeout=10), await console.receive_json_from(timeout=10)]
        await page.disconnect()
        await console.disconnect()
        return messages

    assert async_to_sync(scenario)() == [{"kind": "heartbeat"}, {"kind": "heartbeat"}]


def test_a_member_removed_or_deactivated_gets_no_further_message(tx_world: World) -> None:
    """Access is checked again before each message: the next one after a removal closes the socket."""
    from apps.workspaces.models import Membership

    async def scenario() -> list[Any]:
        victor, connected = await _open(tx_world.victor, "/ws/workspaces/team-a/")  # a viewer, by his own role
        admin, admin_connected = await _open(tx_world.admin, "/ws/console/")
        assert connected and admin_connected
        await database_sync_to_async(heartbeat)()
        heard = [await victor.receive_output(timeout=10), await admin.receive_output(timeout=10)]
        await database_sync_to_async(Membership.objects.filter(user=tx_world.victor).delete)()
        tx_world.admin.is_staff = False
        await database_sync_to_async(tx_world.admin.save)()
        await asyncio.sleep(1.1)  # past the consumer's one-second memory of its last check
        await database_sync_to_async(heartbeat)()
        heard += [await victor.receive_output(timeout=10), await admin.receive_output(timeout=10)]
        await victor.disconnect()
        await admin.disconnect()
        return heard

    first_victor, first_admin, then_victor, then_admin = async_to_sync(scenario)()
    assert json.loads(first_victor["text"]) == json.loads(first_admin["text"]) == {"kind": "heartbeat"}
    assert then_victor == then_admin == {"type": "websocket.close", "code": 4403}


def test_a_password_change_ends_the_open_sockets_of_its_sessions(tx_world: World) -> None:
    from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    def session_of(user: Any) -> SessionStore:
        session = SessionStore()
        session.update({SESSION_KEY: str(user.pk), HASH_SESSION_KEY: user.get_session_auth_hash()})
        session.create()
        return session

    async def scenario() -> list[Any]:
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/ws/workspaces/team-a/")
        communicator.scope["user"] = tx_world.bob
        communicator.scope["session"] = await database_sync_to_async(session_of)(tx_world.bob)
        connected, _ = await communicator.connect()
        assert connected
        await database_sync_to_async(heartbeat)()
        heard = [await communicator.receive_output(timeout=10)]
        tx_world.bob.set_password("a-new-password-entirely-1234")
        await database_sync_to_async(tx_world.bob.save)()
        await asyncio.sleep(1.1)
        await database_sync_to_async(heartbeat)()
        heard.append(await communicator.receive_output(timeout=10))
        await communicator.disconnect()
        return heard

    before, after = async_to_sync(scenario)()
    assert json.loads(before["text"]) == {"kind": "heartbeat"}
    assert after == {"type": "websocket.close", "code": 4403}


def test_a_quiet_socket_stays_open(tx_world: World) -> None:
    """A page that hears nothing for longer than the layer's wait on Redis (5 s) still hears the next
    change: the client's read timeout outlasts the wait, or the consumer died with the socket."""

    async def scenario() -> dict[str, Any]:
        page, connected = await _open(tx_world.bob, "/ws/workspaces/team-a/")
        assert connected
        assert await page.receive_nothing(timeout=7, interval=0.5)
        await database_sync_to_async(heartbeat)()
        message = await page.receive_json_from(timeout=10)
        await page.disconnect()
        return message

    assert async_to_sync(scenario)() == {"kind": "heartbeat"}


# --- The embedded default's layer, across processes ------------------------------------------

SETUP = """
import json, django
django.setup()
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from apps.workspaces.actions import ensure_private_workspace
sessions = {}
for name, staff in (("ada", False), ("root", True)):
    user = get_user_model().objects.create_user(name, password=name + "-password-1234", is_staff=staff)
    ensure_private_workspace(user)
    session = SessionStore()
    session.update({SESSION_KEY: str(user.pk), HASH_SESSION_KEY: user.get_session_auth_hash(),
                    BACKEND_SESSION_KEY: "apps.accounts.oidc.PasswordBackend"})
    session.create()
    sessions[name] = session.session_key
print(json.dumps(sessions))
"""
# What the worker and the scheduler loop do: a state change committed in a process of their own.
SEND = """
import json, sys, time, django
django.setup()
from django.db import transaction
from apps.workspaces.live import heartbeat, notify
from apps.workspaces.models import Workspace
ada = Workspace.objects.get(name="ada")
with transaction.atomic():
    notify(ada.pk, "job", {"id": 7, "state": "RUNNING", "sent": time.time()})
heartbeat()
print(ada.pk)
"""


@dataclass
class Embedded:
    url: str
    env: dict[str, str]
    sessions: dict[str, str]  # username: session cookie


@pytest.fixture(scope="module")
def embedded_web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Embedded]:
    """The embedded default's web process (Daphne, SQLite, no Redis) with a member "ada" and an admin "root"."""
    data_dir = tmp_path_factory.mktemp("embedded-live")
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"}}
    env.update(PORTAL_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="portal.settings")
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    manage = [sys.executable, "manage.py"]
    for argv in (["migrate", "-v", "0"], ["migrate", "channels_lite", "-v", "0", "--database", "channels"]):
        subprocess.run([*manage, *argv], cwd=ROOT, env=env, check=True)
    made = subprocess.run([sys.executable, "-c", SETUP], cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    port = free_port()
    with open(data_dir / "web.log", "wb") as log:
        web = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "portal.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{url}/healthz", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert web.poll() is None and time.monotonic() < deadline, (data_dir / "web.log").read_text()
            time.sleep(0.2)
        yield Embedded(url=url, env=env, sessions=json.loads(made.stdout))
    finally:
        web.terminate()
        web.wait(timeout=15)


def _socket(site: Embedded, username: str, path: str) -> ClientConnection:
    """A WebSocket as the user's browser opens it: their session cookie, the portal's origin."""
    headers = {"Cookie": f"sessionid={site.sessions[username]}", "Origin": site.url}
    return connect(site.url.replace("http://", "ws://") + path, additional_headers=headers, open_timeout=10)


@pytest.mark.slow
def test_a_change_sent_by_another_process_reaches_the_web_process_within_a_second(embedded_web: Embedded) -> None:
    with (
        _socket(embedded_web, "ada", "/ws/workspaces/ada/") as page,
        _socket(embedded_web, "root", "/ws/console/") as console,
    ):
        time.sleep(0.5)  # the web process's poller has started for the new sockets
        sent = subprocess.run(
            [sys.executable, "-c", SEND], cwd=ROOT, env=embedded_web.env, check=True, capture_output=True, text=True
        )
        change = json.loads(page.recv(timeout=10))
        arrived = time.time()
        assert (change["kind"], change["id"], change["state"]) == ("job", 7, "RUNNING")
        assert arrived - change["sent"] < 1.0
        assert json.loads(page.recv(timeout=10)) == {"kind": "heartbeat"}
        seen = json.loads(console.recv(timeout=10))
        assert (seen["kind"], seen["id"], seen["workspace_id"]) == ("job", 7, int(sent.stdout))
        assert json.loads(console.recv(timeout=10)) == {"kind": "heartbeat"}


@pytest.mark.slow
def test_a_member_cannot_listen_to_the_console_or_another_workspace(embedded_web: Embedded) -> None:
    for path in ("/ws/console/", "/ws/workspaces/root/"):
        with pytest.raises(InvalidStatus) as refused:
            _socket(embedded_web, "ada", path)
        assert refused.value.response.status_code == 403, path


def test_every_live_part_lets_the_latest_update_win() -> None:
    """A part refreshed by live updates asks again once its request in flight is answered when a
    newer update comes meanwhile (hx-sync "this:queue last"): htmx would otherwise drop the newer
    trigger, and a state that changed twice within a request's time (Provisioning, then Running
    0.2 s later) would stay on screen as the first, stale, until a reload. Queueing rather than
    aborting keeps the browser's console free of htmx errors and the server from answering
    requests no one reads."""
    import re
    from pathlib import Path

    templates = Path(__file__).resolve().parents[2] / "templates"
    live: set[str] = set()
    for template in templates.rglob("*.html"):
        for tag in re.findall(r"<[a-z]+[^>]*hx-trigger=\"[^\"]*live-[^>]*>", template.read_text(), re.S):
            live.add(template.relative_to(templates).as_posix())
            assert 'hx-sync="this:queue last"' in tag, (template.name, tag)
    # Every kind's list and detail pages are the generic ones; the dashboards have their own.
    assert live >= {
        "web/generic/list.html",
        "web/generic/detail.html",
        "web/dashboard.html",
        "web/landing.html",
        "console/dashboard.html",
    }, live
