"""A notebook kernel of team-a attacks the portal, the shared environment and team-b's notebook,
for real: Jupyter servers in their sandboxes behind the real proxy. Sandboxed, it reaches nothing;
with ``PORTAL_SANDBOX=off`` the same code reaches what the sandbox hides (the control)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import websocket
from django.conf import settings as django_settings

from apps.compute.models import Instance, Notebook
from tests.personas import World
from tests.proxy import Proxy, browser_session, loopback_ws_options
from tests.security.test_hostile_workloads import ATTACK, leaks_in, sandboxed
from workers.backends.pyenv import ensure_env

# The job's attack, plus what only a neighbour on the machine can try: another notebook's server
# (on its Unix socket) and the proxy's API (on loopback), without their credentials.
NOTEBOOK_ATTACK = (
    ATTACK
    + r"""
import http.client, socket, urllib.request
extra = []
for name, url in t["urls"].items():
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            if answer.status == 200:
                extra.append("loopback:" + name)
    except Exception:
        pass
class UnixConnection(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(5)
        self.sock.connect(self.socket_path)
for name, (path, target) in t["sockets"].items():
    try:
        connection = UnixConnection("localhost")
        connection.socket_path = path
        connection.request("GET", target)
        if connection.getresponse().status == 200:
            extra.append("socket:" + name)
    except Exception:
        pass
print("LEAKS=" + json.dumps(sorted(set(leaks + extra))))
"""
)


def launch(world: World, user: Any, workspace: str) -> Notebook:
    client = world.client(user)
    body = {"workspace": workspace, "name": "box", "profile": "cpu-small"}
    response = client.post("/api/v1/instances/", body, format="json")
    assert response.status_code == 201, response.content
    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == Instance.State.RUNNING, instance.failure_reason
    body = {"workspace": workspace, "name": "lab", "instance": instance.pk, "profile": "kernel-only"}
    response = client.post("/api/v1/notebooks/", body, format="json")
    assert response.status_code == 201, response.content
    notebook = Notebook.objects.get(pk=response.json()["id"])
    assert notebook.state == Notebook.State.READY, notebook.failure_reason
    return notebook


def server_socket(notebook: Notebook) -> str:
    """Where the server itself listens (its route's target): a Unix socket's path."""
    target = urlsplit(notebook.proxy_target)
    assert target.scheme == "http+unix", notebook.proxy_target
    return unquote(target.netloc)


def run_in_kernel(notebook: Notebook, code: str) -> str:
    """Run ``code`` in a new kernel of ``notebook`` (through the proxy, with the server's own token)
    and return its output."""
    headers = {"Authorization": f"token {notebook.access_token}"}
    kernel = browser_session().post(f"{notebook.url}api/kernels", headers=headers, json={"name": "python3"}, timeout=30)
    assert kernel.status_code == 201, kernel.text
    address, options = loopback_ws_options(
        notebook.url.replace("http://", "ws://") + f"api/kernels/{kernel.json()['id']}/channels"
    )
    sock = websocket.create_connection(address, header=[f"{k}: {v}" for k, v in headers.items()], timeout=60, **options)
    msg_id, output, replied, idle = uuid.uuid4().hex, [], False, False
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": msg_id, "version": "5.3"}
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
    request = {"header": header, "parent_header": {}, "metadata": {}, "channel": "shell", "content": content}
    sock.send(json.dumps(request))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = json.loads(sock.recv())
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "stream":
                output.append(message["content"]["text"])
            elif message["msg_type"] == "error":
                raise AssertionError(message["content"])
            elif message["msg_type"] == "execute_reply":
                replied = True
            elif message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                idle = True  # after every output of the cell (the reply may come first)
            if replied and idle:
                return "".join(output)
        raise AssertionError("the cell did not finish within 60 s")
    finally:
        sock.close()


def attack(tx_world: World, proxy: Proxy, tmp_path: Path, settings: Any) -> set[str]:
    data = tmp_path / "data"
    data.mkdir()
    (data / "portal.sqlite3").write_text("every API token of the portal")
    settings.PORTAL_WORK_DIR = data / "work"
    settings.PORTAL_RUN_DIR = data / "run"
    from apps.catalog.models import NotebookProfile

    NotebookProfile.objects.get_or_create(name="kernel-only", image="quay.io/jupyter/base-notebook", published=True)
    victim = launch(tx_world, tx_world.charlie, "team-b")
    attacker = launch(tx_world, tx_world.alice, "team-a")
    victim_run = victim.backend_state
    env = ensure_env([], Path(django_settings.PORTAL_NOTEBOOK_ENV_DIR))
    static = next(env.glob("lib/python3*/site-packages/jupyter_server/static"))
    targets = {
        "read": {
            "database": str(data / "portal.sqlite3"),
            "team-b-log": victim_run["replicas"][0]["log"],
            "team-b-dir": str(Path(victim_run["job_dir"]).parent),
        },
        "write": {"shared-environment": str(static / "takeover.html"), "team-b-dir": f"{victim_run['job_dir']}/x"},
        "secrets": {"proxy-token": proxy.token, "team-b-notebook-token": victim.access_token},
        "signal": {"team-b-notebook": sandboxed(victim_run["replicas"][0]["pid"])[0]},
        "urls": {"proxy-api": f"{proxy.api_url}/api/routes"},
        "sockets": {"team-b-notebook": (server_socket(victim), "/api/contents")},
    }
    code = f"import sys\nsys.argv = ['attack', {json.dumps(json.dumps(targets))}]\nexec({NOTEBOOK_ATTACK!r})"
    try:
        return leaks_in(run_in_kernel(attacker, code))
    finally:
        (static / "takeover.html").unlink(missing_ok=True)


def test_a_sandboxed_kernel_reaches_nothing_of_the_portal_the_environment_or_another_notebook(
    proxy: Proxy, tx_world: World, tmp_path: Path, settings: Any
) -> None:
    assert attack(tx_world, proxy, tmp_path, settings) == set()


@pytest.mark.parametrize("expected", [{"read:database", "read:team-b-log", "write:shared-environment",
                                       "environ:proxy-token", "environ:team-b-notebook-token"}])  # fmt: skip
def test_without_the_sandbox_the_same_kernel_reaches_it(
    proxy: Proxy, tx_world: World, tmp_path: Path, settings: Any, expected: set[str]
) -> None:
    settings.PORTAL_SANDBOX = "off"
    leaks = attack(tx_world, proxy, tmp_path, settings)
    assert leaks >= expected
    assert "socket:team-b-notebook" not in leaks and "loopback:proxy-api" not in leaks  # their own auth holds
