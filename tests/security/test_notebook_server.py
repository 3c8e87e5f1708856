"""A notebook's server holds out against its own workspace and against its neighbours, for real:
Jupyter servers in their sandboxes on the local backend, behind the real proxy, signed in through
the live portal.

- What the workspace writes (its files, its home directory) is never imported or run by the
  server before the portal's own code: not a ``portal_identity.py`` of its own, not a Jupyter
  configuration file, not a ``usercustomize.py``.
- Its kernels cannot read the server's memory or environment.
- The proxy reaches it through a Unix socket that no other account can take, even once it died;
  then its route and its sign-in codes go, and no code is issued for it.
- An open kernel WebSocket is closed within about a second of its user losing access: removed
  from the workspace, or their password changed.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import struct
import subprocess
import sysconfig
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import requests
import websocket
from django.db import connection

from apps.catalog.models import NotebookProfile
from apps.compute.hosting import instance_dir
from apps.compute.models import Notebook, NotebookAuthCode
from apps.workloads.host import reconcile
from apps.workspaces.actions import do_remove_membership
from apps.workspaces.models import Membership, Role
from apps.workspaces.unix import run_as_for
from tests.compute.test_local_notebooks import (
    _alive,
    _callback,
    _code_for,
    _launch,
    _pids,
    _xsrf_headers,
    run_cell,
    server_logs,
    sign_in,
)
from tests.personas import PASSWORD, World
from tests.proxy import Proxy, browser_session, loopback_ws_options

POLICY_VIOLATION = 1008


@pytest.fixture
def jupyter_profile(tx_world: World) -> NotebookProfile:
    """A profile of just the Jupyter server and a kernel (the environment is built once, cached)."""
    return NotebookProfile.objects.create(name="kernel-only", image="quay.io/jupyter/base-notebook", published=True)


# A sign-in check that lets everyone in, as the workspace could write it where the server looks.
PLANTED_IDENTITY = """
import pathlib
pathlib.Path({marker!r}).write_text("planted portal_identity.py ran")
from jupyter_server.auth.identity import IdentityProvider, User

class PortalIdentityProvider(IdentityProvider):
    portal_url = __import__("traitlets").Unicode("", config=True)

    async def get_user(self, handler):
        return User(username="anyone")
"""
# A Jupyter configuration file is Python the server runs: this one replaces the sign-in check.
PLANTED_CONFIG = """
import pathlib
pathlib.Path({marker!r}).write_text("planted jupyter_server_config.py ran")
import portal_identity
from jupyter_server.auth.identity import User

async def anyone(self, handler):
    return User(username="anyone")

portal_identity.PortalIdentityProvider.get_user = anyone
"""
PLANTED_CUSTOMIZE = 'import pathlib\npathlib.Path({marker!r}).write_text("planted usercustomize.py ran")\n'

# Run in a kernel: which of its server's /proc files (its parent's) it can read; its own environ
# always, as a control.
READ_SERVER = """
import os
parent, read = os.getppid(), []
for name in ("environ", "mem", "maps", "auxv"):
    try:
        with open(f"/proc/{parent}/{name}", "rb") as f:
            f.read(1)
        read.append(name)
    except OSError:
        pass
with open("/proc/self/environ", "rb") as f:
    own = len(f.read()) > 0
with open(f"/proc/{parent}/cmdline", "rb") as f:
    server = b"portal_identity" in f.read()
(read, own, server)
"""


def _kill_server(notebook: Notebook) -> None:
    """Kill the notebook's server (a crash, the machine's OOM killer) and wait until it is gone."""
    pids = _pids(notebook)
    for pid in pids:
        os.killpg(pid, 9)
    deadline = time.monotonic() + 10
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pids)


def _restart(notebook: Notebook) -> Notebook:
    """Kill the notebook's server; the reconcile loop starts it again in place."""
    _kill_server(notebook)
    reconcile()
    notebook.refresh_from_db()
    assert notebook.state == Notebook.State.READY, (notebook.failure_reason, server_logs())
    return notebook


def test_it_runs_nothing_the_workspace_wrote_before_the_portals_own_sign_in_check(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    instance, notebook = _launch(tx_world, jupyter_profile)
    home = Path(notebook.backend_state["job_dir"])  # the server's home directory, and where it started
    markers = home / "markers"
    markers.mkdir()
    for directory in (home, Path(instance_dir(instance))):
        (directory / "portal_identity.py").write_text(PLANTED_IDENTITY.format(marker=str(markers / "identity")))
    config = home / ".jupyter" / "jupyter_server_config.py"
    config.parent.mkdir(exist_ok=True)
    config.write_text(PLANTED_CONFIG.format(marker=str(markers / "config")))
    version = sysconfig.get_python_version()
    user_site = home / ".local" / "lib" / f"python{version}" / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text(PLANTED_CUSTOMIZE.format(marker=str(markers / "customize")))
    account = home.stat()
    for path in [markers, *home.rglob("*.py"), *(p for p in home.rglob("*") if p.is_dir())]:
        os.chown(path, account.st_uid, account.st_gid)  # the workspace's own files

    notebook = _restart(notebook)
    anonymous = browser_session().get(f"{notebook.url}api/contents", allow_redirects=False, timeout=10)
    assert anonymous.status_code == 302 and "/notebooks/authorize/" in anonymous.headers["Location"]
    assert sorted(p.name for p in markers.iterdir()) == [], server_logs()
    # The workspace's own settings of JupyterLab (JSON, never run) still live in its home directory.
    token = {"Authorization": f"token {notebook.access_token}"}
    settings_url = f"{notebook.url}lab/api/settings/@jupyterlab/apputils-extension:themes"
    theme = {"raw": '{"theme": "JupyterLab Dark"}'}
    saved = browser_session().put(settings_url, headers=token, json=theme, timeout=10)
    assert saved.status_code == 204, saved.text
    assert (home / ".jupyter/lab/user-settings/@jupyterlab/apputils-extension/themes.jupyterlab-settings").exists()
    # ...and so does the notebooks' trust database, which saving a notebook writes.
    created = browser_session().post(
        f"{notebook.url}api/contents", headers=token, json={"type": "notebook"}, timeout=10
    )
    assert created.status_code == 201, created.text
    assert (home / ".local/share/jupyter/nbsignatures.db").exists()


def test_a_kernel_cannot_read_its_servers_memory_or_environment(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    _, notebook = _launch(tx_world, jupyter_profile)
    token = {"Authorization": f"token {notebook.access_token}"}
    read, own, server = ast.literal_eval(run_cell(browser_session(), notebook, READ_SERVER, token))
    assert server and own  # its parent is the server; its own files it reads (the check can succeed)
    assert read == [], f"a kernel read its server's /proc files: {read}"


def _socket_of(proxy: Proxy, notebook: Notebook) -> Path:
    target = proxy.routes()[f"/{notebook.host}"]["target"]
    assert target == notebook.proxy_target
    parts = urlsplit(str(target))
    assert parts.scheme == "http+unix", target  # no TCP port to take
    return Path(unquote(parts.netloc))


def _tcp_listeners(uid: int) -> list[str]:
    """The TCP sockets listening on this machine that belong to ``uid`` (state 0A is LISTEN)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[7]) == uid:
                found.append(fields[1])
    return found


# Run as another workspace's account: listen where the proxy sends the notebook's requests.
TAKE_OVER = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.bind(sys.argv[1])
except OSError as exc:
    print(type(exc).__name__)
else:
    print("bound")
"""


def test_the_proxy_reaches_a_notebook_through_a_socket_no_other_account_can_take(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    if os.geteuid() != 0:
        pytest.skip("workspaces have accounts of their own only where the portal runs as root")
    instance, notebook = _launch(tx_world, jupyter_profile)
    owner = run_as_for(tx_world.team_a, instance.cluster)
    neighbour = run_as_for(tx_world.team_b, instance.cluster)
    assert owner is not None and neighbour is not None
    sock = _socket_of(proxy, notebook)
    info = sock.parent.stat()
    assert (info.st_uid, info.st_mode & 0o777) == (owner.uid, 0o700)
    assert not sock.parent.is_relative_to(Path(instance_dir(instance)).parent)  # outside the workspace
    assert _tcp_listeners(owner.uid) == []  # the server listens on no port any process could take
    token = {"Authorization": f"token {notebook.access_token}"}
    assert browser_session().get(f"{notebook.url}api/status", headers=token, timeout=10).ok

    _kill_server(notebook)
    system_python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")  # not one under /root
    assert system_python is not None
    as_neighbour = ["setpriv", f"--reuid={neighbour.uid}", f"--regid={neighbour.gid}", "--clear-groups"]
    for path in (sock, sock.parent / "other.sock"):
        done = subprocess.run(
            [*as_neighbour, system_python, "-c", TAKE_OVER, str(path)], capture_output=True, text=True, timeout=30
        )
        assert done.stdout.strip() == "PermissionError", (path, done.stdout, done.stderr)


def test_a_dead_servers_route_and_codes_go_and_no_code_is_issued_for_it(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    _, notebook = _launch(tx_world, jupyter_profile)
    bob = sign_in(proxy, "bob")
    issued = _code_for(bob, notebook)  # not redeemed yet
    _kill_server(notebook)

    # Before the host notices, the portal issues no code for a server that is not there.
    authorize = f"{proxy.url}/notebooks/authorize/{notebook.host_label}/"
    waiting = bob.get(authorize, allow_redirects=False, timeout=10)
    assert waiting.status_code == 503
    assert NotebookAuthCode.objects.filter(notebook=notebook).count() == 1

    # The host finds it dead: its route goes before it is started again, and so does the code.
    routes_seen: list[bool] = []

    def converge() -> None:
        try:
            reconcile()
        finally:
            connection.close()

    thread = threading.Thread(target=converge)
    thread.start()
    while thread.is_alive():
        routes_seen.append(f"/{notebook.host}" in proxy.routes())
        time.sleep(0.05)
    thread.join()
    notebook.refresh_from_db()
    assert (notebook.state, notebook.restarts) == (Notebook.State.READY, 1), server_logs()
    assert False in routes_seen, "the dead server's route stayed until it was started again"
    assert not NotebookAuthCode.objects.filter(notebook=notebook, used_at__isnull=True).exists()
    refused = _callback(notebook, issued)
    assert refused.status_code == 403
    assert bob.get(f"{notebook.url}api/status", timeout=30).ok  # a new code, for the new server


def _open_kernel_socket(browser: requests.Session, notebook: Notebook) -> websocket.WebSocket:
    """A kernel's WebSocket through the proxy, with the browser's session on the notebook's host."""
    headers = _xsrf_headers(browser, notebook)
    kernel = browser.post(f"{notebook.url}api/kernels", headers=headers, json={"name": "python3"}, timeout=30)
    assert kernel.status_code == 201, kernel.text
    ws_url = notebook.url.replace("http://", "ws://") + f"api/kernels/{kernel.json()['id']}/channels"
    address, options = loopback_ws_options(ws_url)
    cookie = "; ".join(f"{c.name}={c.value}" for c in browser.cookies if c.domain == notebook.host)
    header = [f"{k}: {v}" for k, v in headers.items()]
    return websocket.create_connection(address, header=header, cookie=cookie, timeout=30, **options)


def _execute(sock: websocket.WebSocket, code: str) -> str:
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": msg_id, "version": "5.3"}
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
    sock.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "channel": "shell",
                          "buffers": [], "content": content}))  # fmt: skip
    return msg_id


def _result(sock: websocket.WebSocket, msg_id: str) -> str:
    while True:
        message = json.loads(sock.recv())
        if message.get("parent_header", {}).get("msg_id") == msg_id and message["msg_type"] == "execute_result":
            return str(message["content"]["data"]["text/plain"])


def _closed_within(sock: websocket.WebSocket, timeout_s: float) -> tuple[float, int | None]:
    """Seconds until the server sent ``sock`` its close (reading what comes meanwhile), and its
    close code. The client does not answer the close, as one that means to go on would not."""
    started = time.monotonic()
    sock.settimeout(timeout_s)
    while time.monotonic() - started < timeout_s:
        try:
            frame = sock.recv_frame()  # raw: no close sent back
        except websocket.WebSocketTimeoutException:
            break
        except websocket.WebSocketConnectionClosedException:
            return time.monotonic() - started, None
        if frame.opcode == websocket.ABNF.OPCODE_CLOSE:
            code = struct.unpack(">H", frame.data[:2])[0] if len(frame.data) >= 2 else None
            return time.monotonic() - started, code
    raise AssertionError(f"the socket was still open after {timeout_s:g} s")


def _signed_in_to(proxy: Proxy, username: str, notebook: Notebook) -> requests.Session:
    browser = sign_in(proxy, username)
    page = browser.get(notebook.url, timeout=30)  # JupyterLab's page, which sets its XSRF cookie
    assert page.status_code == 200 and "<title>JupyterLab</title>" in page.text
    return browser


def test_removing_a_member_closes_her_open_kernel_socket_within_a_second_or_so(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    _, notebook = _launch(tx_world, jupyter_profile)
    dora = type(tx_world.alice).objects.create_user("dora", "dora@example.org", PASSWORD)
    membership = Membership.objects.create(workspace=tx_world.team_a, user=dora, role=Role.MEMBER)
    sock = _open_kernel_socket(_signed_in_to(proxy, "dora", notebook), notebook)
    assert _result(sock, _execute(sock, "6*7")) == "42"  # it runs her code

    do_remove_membership(membership, acting_user=tx_world.alice)
    elapsed, code = _closed_within(sock, 10)
    assert elapsed < 2.5 and code == POLICY_VIOLATION, (elapsed, code)
    # A client that ignores the close and sends on has nothing run while the close handshake lasts.
    marker = Path(notebook.backend_state["job_dir"]) / "ran-after-close"
    _execute(sock, f"open({str(marker)!r}, 'w').write('ran')")
    time.sleep(2)
    assert not marker.exists()


def test_a_password_change_ends_the_notebook_session_and_closes_its_sockets(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile
) -> None:
    _, notebook = _launch(tx_world, jupyter_profile)
    browser = _signed_in_to(proxy, "bob", notebook)
    sock = _open_kernel_socket(browser, notebook)
    # bob's password is changed (by him elsewhere, or by an administrator who suspects a leak).
    bob = tx_world.bob
    bob.set_password("a brand new password")
    bob.save()
    changed = time.monotonic()
    elapsed, code = _closed_within(sock, 10)
    assert elapsed < 2.5 and code == POLICY_VIOLATION, (elapsed, code)
    time.sleep(max(0.0, 1.1 - (time.monotonic() - changed)))  # an answer of the portal lasts a second
    refused = browser.get(f"{notebook.url}api/contents", allow_redirects=False, timeout=10)
    assert refused.status_code == 302 and "/notebooks/authorize/" in refused.headers["Location"]
