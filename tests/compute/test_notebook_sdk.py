"""A data scientist's first cell works: in a notebook of the embedded portal (started as
deploy/run.sh starts it), a kernel submits a job through the SDK and waits for it to succeed,
with nothing set up by hand. The job, in turn, has the SDK and CLI too. Each acts with its own
credential, scoped to its workspace, which ends with it and is in no log or command line."""

from __future__ import annotations

import ast
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
import websocket

from tests.proxy import browser_session, loopback_ws_options
from tests.test_embedded import EmbeddedPortal

# The first cell: the SDK from the environment, configured by it; the job uses the CLI and the SDK.
FIRST_CELL = """
import os, shutil
from gpuportal import Client
portal = Client.from_env()
command = "gpuportal whoami && python -c 'import gpuportal; print(gpuportal.__version__)'"
job = portal.jobs.submit(name="from-a-notebook", command=command)
job.wait(timeout=120)
try:
    portal.request("GET", "users/")
    admin = "reached"
except Exception as exc:
    admin = type(exc).__name__
{"state": job.state, "log": job.logs(), "workspaces": [w.name for w in portal.workspaces.list()],
 "admin": admin, "cli": shutil.which("gpuportal"), "token": os.environ["GPUPORTAL_TOKEN"]}
"""


def _wait(read: Any, done: Any, what: str, timeout_s: float = 180) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {value}"
        time.sleep(0.3)


def run_in_kernel(notebook_url: str, token: str, code: str, timeout_s: float = 150) -> Any:
    """Run ``code`` in a new kernel of the notebook's server, over Jupyter's REST and kernel
    WebSocket APIs with the server's own token (as an IDE does); return its result's value."""
    headers = {"Authorization": f"token {token}"}
    kernel = browser_session().post(f"{notebook_url}api/kernels", json={"name": "python3"}, headers=headers, timeout=30)
    assert kernel.status_code == 201, kernel.text
    address, options = loopback_ws_options(
        f"{notebook_url.replace('http://', 'ws://')}api/kernels/{kernel.json()['id']}/channels"
    )
    sock = websocket.create_connection(address, header=[f"Authorization: token {token}"], timeout=timeout_s, **options)
    try:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": msg_id, "version": "5.3"}
        content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
        sock.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "channel": "shell",
                              "buffers": [], "content": content}))  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = json.loads(sock.recv())
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "execute_result":
                return ast.literal_eval(message["content"]["data"]["text/plain"])
            if message["msg_type"] == "error":
                raise AssertionError("\n".join(message["content"]["traceback"]))
        raise AssertionError(f"no result within {timeout_s} s")
    finally:
        sock.close()


def _cmdlines() -> bytes:
    found = b""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found += (entry / "cmdline").read_bytes() + b"\n"
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_a_notebooks_first_cell_submits_a_job_through_the_sdk_and_waits_for_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "portal-data"
    portal = EmbeddedPortal(data_dir)
    try:
        url = portal.wait_ready()
        api = requests.Session()
        api.headers.update(portal.admin_headers(url))

        def read(kind: str, pk: int) -> Any:
            return lambda: api.get(f"{url}/api/v1/{kind}/{pk}/", timeout=10).json()

        profile = {"name": "kernel-only", "image": "quay.io/jupyter/base-notebook", "published": True}
        assert api.post(f"{url}/api/v1/notebook-profiles/", json=profile, timeout=10).status_code == 201
        box = api.post(f"{url}/api/v1/instances/", json={"workspace": "admin", "name": "box", "profile": "cpu-small"})
        assert box.status_code == 201, box.text
        _wait(read("instances", box.json()["id"]), lambda r: r["state"] == "RUNNING", "the instance")
        body = {"workspace": "admin", "name": "lab", "instance": box.json()["id"], "profile": "kernel-only"}
        created = api.post(f"{url}/api/v1/notebooks/", json=body, timeout=10)
        assert created.status_code == 201, created.text
        notebook = _wait(read("notebooks", created.json()["id"]), lambda r: r["state"] in ("READY", "FAILED"), "it")
        assert notebook["state"] == "READY", notebook

        result = run_in_kernel(notebook["url"], notebook["access_token"], FIRST_CELL)

        # The job ran with the SDK and CLI of its own environment, acting in the notebook's workspace.
        assert result["state"] == "SUCCEEDED", result["log"]
        assert "0.1.0" in result["log"] and "admin" in result["log"], result["log"]
        assert result["cli"] and result["cli"].endswith("/bin/gpuportal")
        # The notebook's credential: its workspace only, no admin endpoint (its launcher is an admin).
        assert result["workspaces"] == ["admin"] and result["admin"] == "PermissionDenied"
        token = result["token"]
        assert token.startswith("gpw_notebook_")
        assert token.encode() not in _cmdlines()
        me = f"{url}/api/v1/me/"
        assert requests.get(me, headers={"Authorization": f"Token {token}"}, timeout=10).status_code == 200

        # Deleting the notebook ends its credential.
        assert api.delete(f"{url}/api/v1/notebooks/{notebook['id']}/", timeout=10).status_code in (200, 202, 204)
        _wait(read("notebooks", notebook["id"]), lambda r: r["state"] == "STOPPED", "the notebook to stop")
        assert requests.get(me, headers={"Authorization": f"Token {token}"}, timeout=10).status_code == 401
    finally:
        assert portal.stop() == 0, "".join(portal.output)
    # No log of the portal's holds the credential.
    for log in (data_dir / "logs").rglob("*"):
        if log.is_file():
            assert token.encode() not in log.read_bytes(), log
    assert token not in "".join(portal.output)
