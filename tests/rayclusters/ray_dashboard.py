"""What the Ray dashboard proxy's tests share: a real Ray head started by the local backend (in its
sandbox, with its own network, its dashboard on a Unix socket, ``RAY_AUTH_MODE=token``), the
portal's row for it, and a recording HTTP server that stands where a dashboard would, to see what
the proxy sends on.

A cluster's Ray token is derived from its row's id and creation time (``RayCluster.auth_token``),
so the row each test makes for the one head of its module has the same id and creation time, and
the head is started with that row's token: the real derivation, not a token of the test's own.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from django.test import Client

from apps.rayclusters.models import RayCluster
from apps.workspaces.models import Workspace
from workers.backends.base import Endpoint, NodeGroup, RayClusterSpec, RunAs
from workers.backends.local import LocalBackend

PUBLIC = "http://127.0.0.1:8000"
DOMAIN = "localhost"
RAY_PK = 870_001  # the row of the module's real head
CREATED = datetime(2030, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC)
START_TIMEOUT_S = 180.0
#: The workspace's account where the portal runs as root (numeric: no passwd entry is needed).
CLUSTER_ACCOUNT = RunAs("gpw-rayproxy", 200_621, 200_621)


def token_of(pk: int) -> str:
    """The Ray token of the cluster row with id ``pk``, made at ``CREATED``."""
    return RayCluster(pk=pk, created_at=CREATED).auth_token


@dataclass
class Head:
    backend: LocalBackend
    endpoint: Endpoint


@contextmanager
def ray_head() -> Iterator[Head]:
    """A Ray head alone (no worker: ~10 s to start), whose token is the row ``RAY_PK``'s."""
    root = Path(tempfile.mkdtemp(prefix="gpp-", dir="/tmp"))  # short: the socket path must fit
    root.chmod(0o755)
    backend = LocalBackend(
        run_dir=str(root / "run"), owner=str(root / "work"), teardown_grace_s=5.0, ray_start_timeout_s=START_TIMEOUT_S
    )
    spec = RayClusterSpec(
        key=f"ray-{secrets.token_hex(4)}",
        workspace="team-a",
        name="dash",
        work_dir=str(root / "work" / "team-a"),
        auth_token=token_of(RAY_PK),
        head=NodeGroup("head", 1, cpu_cores=1, memory_gb=2),
        run_as=CLUSTER_ACCOUNT if os.geteuid() == 0 else None,
    )
    try:
        yield Head(backend, backend.start(spec))
    finally:
        if backend.get_state():
            backend.stop(grace_s=0)
        shutil.rmtree(root, ignore_errors=True)


def cluster_row(
    workspace: Workspace,
    creator: Any,
    target: str,
    *,
    pk: int = RAY_PK,
    name: str = "dash",
    state: str = RayCluster.State.RUNNING,
) -> RayCluster:
    """The portal's row of a cluster that runs (as the host records it), its dashboard at ``target``."""
    RayCluster.objects.create(
        pk=pk, workspace=workspace, name=name, workers=0, created_by=creator, state=state, proxy_target=target
    )
    RayCluster.objects.filter(pk=pk).update(created_at=CREATED)
    return RayCluster.objects.get(pk=pk)


def on_host(cluster: RayCluster, **headers: str) -> dict[str, Any]:
    """Test client arguments for a request to the cluster's own host (as the proxy in front of the
    portal passes it on: the Host header is the browser's)."""
    return {"headers": {"Host": f"{cluster.host}:8000", **headers}}


class HostClient(Client):
    """Django's test client that reads each answer whole as it comes, as a browser or a script
    does (which is also what closes a proxied answer and its connection to Ray); ``body()`` has it."""

    def request(self, **request: Any) -> Any:
        response = super().request(**request)
        response.read_body = b"".join(response.streaming_content) if response.streaming else response.content
        return response


def body(response: Any) -> bytes:
    """What an answer of ``HostClient`` carried."""
    return bytes(response.read_body)


# -- a recording server --------------------------------------------------------------------------


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, list[str]]
    body: bytes
    probed: Any = None


@dataclass
class Recorder:
    url: str
    requests: list[Recorded] = field(default_factory=list)
    # Called as each request arrives (while the proxy waits for the answer); its result is kept.
    probe: Callable[[], Any] | None = None


class _Recording(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    recorder: Recorder

    def _record(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers: dict[str, list[str]] = {}
        for name, value in self.headers.items():
            headers.setdefault(name.lower(), []).append(value)
        probed = self.recorder.probe() if self.recorder.probe else None
        self.recorder.requests.append(Recorded(self.command, self.path, headers, body, probed))
        answer = json.dumps({"ok": True, "seen": len(self.recorder.requests)}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.send_header("Set-Cookie", "ray-authentication-token=leaked; Path=/")
        self.send_header("Connection", "X-Hop")
        self.send_header("X-Hop", "per-connection")
        self.send_header("Keep-Alive", "timeout=5")
        self.send_header("X-Ray-Answer", "kept")
        self.send_header("Access-Control-Allow-Origin", "http://lab-1.localhost:8000")
        self.send_header("Access-Control-Allow-Credentials", "true")
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_POST = do_PUT = do_DELETE = _record  # noqa: N815 (http.server's names)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@contextmanager
def recording_server() -> Iterator[Recorder]:
    """An HTTP server on 127.0.0.1 that records each request (method, path, headers, body) and
    answers 201 with a cookie, a grant to another origin to read it signed in, and hop-by-hop
    headers of its own, which the proxy must drop."""
    handler = type("Handler", (_Recording,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    recorder = Recorder(f"http://127.0.0.1:{server.server_address[1]}")
    handler.recorder = recorder
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
