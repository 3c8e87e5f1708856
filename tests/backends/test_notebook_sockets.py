"""Where the local backend's notebook servers listen (workers/backends/processes.py): a Unix socket
in a directory of the workspace's account alone, which the portal makes and no one else may have
made first; and the HTTP client the portal reaches it with. The servers themselves, behind the
real proxy, are in tests/security/test_notebook_server.py."""

from __future__ import annotations

import os
import shutil
import socketserver
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from workers.backends.base import BackendError, RunAs
from workers.backends.processes import (
    MAX_SOCKET_PATH,
    http_get,
    prepare_socket_dir,
    server_socket,
    socket_url,
)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory short enough for a socket path under it (pytest's own may be too deep for one)."""
    path = Path(tempfile.mkdtemp(prefix="gps-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_servers_socket_is_under_the_run_directory_and_its_job_alone_decides_where(short_tmp: Path) -> None:
    run, job = short_tmp / "run", Path("/work/team-a/instance-1/notebook-1")
    sock = server_socket(run, job)
    assert sock == server_socket(run, job)  # found again by adopt(), after a restart of the portal
    assert sock.parent.parent == run / "sockets" and sock.name == "jupyter.sock"
    assert server_socket(run, Path("/work/team-b/instance-1/notebook-1")).parent != sock.parent


def test_a_run_directory_too_deep_for_a_socket_gives_way_to_the_portals_own_temporary_one() -> None:
    deep = Path("/" + "d" * 120)
    sock = server_socket(deep, Path("/work/team-a/instance-1/notebook-1"))
    assert sock.parent.parent == Path(tempfile.gettempdir()) / f"gpuportal-sockets-{os.geteuid()}"
    assert len(os.fsencode(sock)) <= MAX_SOCKET_PATH


def test_its_directory_is_made_afresh_and_closed_to_everyone_but_the_workloads_account(short_tmp: Path) -> None:
    sock = server_socket(short_tmp / "run", short_tmp / "job")
    sock.parent.mkdir(parents=True)
    (sock.parent / "left-by-the-last-server").write_text("")
    run_as = RunAs("gpw-test", 200999, 200999) if os.geteuid() == 0 else None
    prepare_socket_dir(sock, run_as)
    assert list(sock.parent.iterdir()) == []
    info, root = sock.parent.stat(), sock.parent.parent.stat()
    assert info.st_mode & 0o777 == 0o700 and root.st_mode & 0o777 == 0o700 and root.st_uid == os.geteuid()
    assert info.st_uid == (200999 if run_as else os.geteuid())


def test_a_socket_root_someone_else_made_is_refused(short_tmp: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a directory another account owns takes root")
    sock = server_socket(short_tmp / "run", short_tmp / "job")
    assert sock.parent.parent == short_tmp / "run" / "sockets"
    sock.parent.parent.mkdir(parents=True)
    os.chown(sock.parent.parent, 200998, 200998)
    with pytest.raises(BackendError, match="not a directory of the portal's own"):
        prepare_socket_dir(sock, None)
    assert not sock.parent.exists()
    sock.parent.parent.rmdir()
    sock.parent.parent.symlink_to(short_tmp)
    with pytest.raises(BackendError, match="not a directory of the portal's own"):
        prepare_socket_dir(sock, None)


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = f"{self.path} {self.headers.get('Authorization')}".encode()
        self.send_response(200 if self.path.startswith("/api") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def unix_server(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "s" / "jupyter.sock"
    path.parent.mkdir()
    server = _UnixServer(str(path), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield path
    server.shutdown()
    server.server_close()


def test_the_portal_speaks_http_over_a_servers_socket(unix_server: Path) -> None:
    url = socket_url(unix_server)
    assert url.startswith("http+unix://%2F") and "/" not in url.removeprefix("http+unix://")
    assert http_get(f"{url}/api/kernels?x=1", headers={"Authorization": "token t"}) == (
        200,
        b"/api/kernels?x=1 token t",
    )
    assert http_get(f"{url}/elsewhere")[0] == 404
    unix_server.unlink()  # the server is gone: no answer
    with pytest.raises(OSError):
        http_get(f"{url}/api")
    with pytest.raises(OSError):
        http_get("ftp://example.org/api")
