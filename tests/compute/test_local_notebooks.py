"""Instances and notebooks launched through the API run for real on the local backend, and a
notebook is reached through the real proxy with the portal's own auth, kernels included."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
import websocket
from django.test import Client
from rest_framework.authtoken.models import Token

from apps.catalog.models import NotebookProfile
from apps.compute.models import Instance, Notebook
from apps.compute.running import reconcile_compute
from apps.inventory.models import Allocation
from tests.personas import World
from tests.proxy import Proxy


@pytest.fixture
def jupyter_profile(tx_world: World) -> NotebookProfile:
    """A profile of just the Jupyter server and a kernel (the environment is built once, cached)."""
    return NotebookProfile.objects.create(name="kernel-only", image="quay.io/jupyter/base-notebook", published=True)


def _token(user: Any) -> str:
    return Token.objects.get_or_create(user=user)[0].key


def _pids(row: Instance | Notebook) -> list[int]:
    return [r["pid"] for r in row.backend_state.get("run", {}).get("replicas", [])]


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0] != "Z":
                alive.append(pid)
        except OSError:
            continue
    return alive


def _launch(world: World, profile: NotebookProfile) -> tuple[Instance, Notebook]:
    client = world.client(world.alice)
    response = client.post(
        "/api/v1/instances/", {"workspace": "team-a", "name": "box", "profile": "gpu-1"}, format="json"
    )
    assert response.status_code == 201, response.content
    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == Instance.State.RUNNING, instance.failure_reason
    response = client.post(
        "/api/v1/notebooks/",
        {"workspace": "team-a", "name": "lab", "instance": instance.pk, "profile": profile.name},
        format="json",
    )
    assert response.status_code == 201, response.content
    notebook = Notebook.objects.get(pk=response.json()["id"])
    assert notebook.state == Notebook.State.READY, notebook.failure_reason
    return instance, notebook


def _run_cell(proxy: Proxy, notebook: Notebook, headers: dict[str, str], code: str) -> str:
    base = f"{proxy.url}{notebook.url}"
    kernel = requests.post(f"{base}api/kernels", headers=headers, json={"name": "python3"}, timeout=30)
    assert kernel.status_code == 201, kernel.text
    ws_url = base.replace("http://", "ws://") + f"api/kernels/{kernel.json()['id']}/channels"
    sock = websocket.create_connection(ws_url, header=[f"{k}: {v}" for k, v in headers.items()], timeout=30)
    try:
        msg_id = uuid.uuid4().hex
        sock.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "msg_type": "execute_request",
                        "username": "",
                        "session": msg_id,
                        "version": "5.3",
                        "date": "",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "channel": "shell",
                    "buffers": [],
                    "content": {
                        "code": code,
                        "silent": False,
                        "store_history": False,
                        "user_expressions": {},
                        "allow_stdin": False,
                        "stop_on_error": True,
                    },
                }  # fmt: skip
            )
        )
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


def test_notebook_runs_a_kernel_through_the_proxy_for_members_only(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    instance, notebook = _launch(tx_world, jupyter_profile)
    # The instance holds exactly its GPU, and its notebook server runs with it.
    devices = [str(i) for i in Allocation.objects.filter(instance=instance).values_list("gpu__index", flat=True)]
    assert len(devices) == 1
    assert instance.backend_state["run"]["replicas"][0]["devices"] == devices
    assert notebook.backend_state["run"]["replicas"][0]["devices"] == devices
    assert notebook.url in proxy.routes() or notebook.url.rstrip("/") in proxy.routes()

    alice = {"Authorization": f"Token {_token(tx_world.alice)}"}
    assert _run_cell(proxy, notebook, alice, "6*7") == "42"

    status = f"{proxy.url}{notebook.url}api/status"
    # A member of the workspace gets in with their own token, or their browser session.
    assert requests.get(status, headers={"Authorization": f"Token {_token(tx_world.bob)}"}, timeout=10).ok
    browser = Client()
    browser.force_login(tx_world.bob)
    cookie = {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"}
    assert requests.get(status, headers=cookie, timeout=10).status_code == 200
    # Someone of another workspace, a viewer, a stranger with a made-up token, nobody: refused.
    for headers in (
        {"Authorization": f"Token {_token(tx_world.charlie)}"},
        {"Authorization": f"Token {_token(tx_world.victor)}"},
        {"Authorization": "Token not-a-real-token"},
        {},
    ):
        refused = requests.get(status, headers=headers, timeout=10)
        assert refused.status_code == 403, (headers, refused.status_code)
        kernel = requests.post(f"{proxy.url}{notebook.url}api/kernels", headers=headers, json={}, timeout=10)
        assert kernel.status_code == 403
    # The server's own token (shown to members by the API) works too, for tools that take one.
    assert requests.get(status, params={"token": notebook.access_token}, timeout=10).ok

    # Deleting the notebook removes its route and its process.
    server_pids = _pids(notebook)
    assert _alive(server_pids)
    response = tx_world.client(tx_world.alice).delete(f"/api/v1/notebooks/{notebook.pk}/")
    assert response.status_code in (200, 204), response.content
    notebook.refresh_from_db()
    assert notebook.state == Notebook.State.STOPPED
    assert not _alive(server_pids)
    assert not any(prefix.startswith(notebook.url.rstrip("/")) for prefix in proxy.routes())
    gone = requests.get(status, headers=alice, timeout=10)
    assert gone.status_code == 404  # now the portal's own answer: no such page

    # Deleting the instance stops its processes and frees its GPU.
    holder_pids = _pids(instance)
    assert _alive(holder_pids)
    response = tx_world.client(tx_world.alice).delete(f"/api/v1/instances/{instance.pk}/")
    assert response.status_code in (200, 204), response.content
    instance.refresh_from_db()
    assert instance.state == Instance.State.DELETED
    assert not _alive(holder_pids)
    assert not Allocation.objects.filter(instance=instance).exists()


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


def test_reconcile_restarts_dead_servers_and_drops_stale_routes(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    instance, notebook = _launch(tx_world, jupyter_profile)
    # The server dies (a crash, the machine's OOM killer): reconcile starts it again.
    for pid in _pids(notebook):
        os.killpg(pid, 9)
    reconcile_compute()
    notebook.refresh_from_db()
    assert notebook.state == Notebook.State.READY
    assert notebook.backend_state["restarts"] == 1
    assert _alive(_pids(notebook))
    headers = {"Authorization": f"Token {_token(tx_world.alice)}"}
    assert requests.get(f"{proxy.url}{notebook.url}api/status", headers=headers, timeout=10).ok

    # A route nobody owns any more (left by a crash between stop and record) is removed.
    requests.post(
        f"{proxy.api_url}/api/routes/notebooks/team-a/ghost",
        headers={"Authorization": f"token {proxy.token}"},
        json={"target": "http://127.0.0.1:9", "portal_notebook": 999999},
        timeout=5,
    ).raise_for_status()
    assert reconcile_compute()["routes_removed"] == 1
    assert "/notebooks/team-a/ghost" not in proxy.routes()
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING
