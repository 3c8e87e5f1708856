"""The production web process (gunicorn with uvicorn workers, portal/gunicorn_conf.py) serves the
API and the live-update WebSocket from several processes on PostgreSQL and Redis, replaces a
worker that dies, and holds no more database connections than its workers' pools allow."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.personas import World, api_token
from tests.workers.conftest import _database_url_for

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
WORKERS, POOL_MAX = 2, 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _children(pid: int) -> set[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(p) for p in path.read_text().split()} if path.exists() else set()


@contextmanager
def production_web(log: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The web process as docs/operations.md starts it, on the test database and Redis."""
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": _database_url_for(connection.settings_dict)}
    env.update(WEB_CONCURRENCY=str(WORKERS), DATABASE_POOL_MAX=str(POOL_MAX))
    env.update(PORTAL_SCHEDULER_TRIGGER="off", PORTAL_WORKLOAD_TRIGGER="off")  # no tasks for this test
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "python:portal.gunicorn_conf", "-b", f"127.0.0.1:{port}",
         "portal.asgi:application"],
        cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while len(_children(web.pid)) < WORKERS or not _answers(f"{url}/healthz"):
            assert web.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield url, web
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        try:
            web.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(web.pid, signal.SIGKILL)
            web.wait()


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def _session_cookie(user: object) -> str:
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)  # type: ignore[attr-defined]
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()  # type: ignore[attr-defined]
    session.save()
    return str(session.session_key)


def _connections(database: str) -> int:
    with connection.cursor() as cursor:
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        cursor.execute(query, [database])
        return int(cursor.fetchone()[0])


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="the production web process needs Redis")
def test_several_web_workers_serve_the_api_and_live_updates_and_heal(tx_world: World, tmp_path: Path) -> None:
    database = connection.settings_dict["NAME"]
    token = api_token(tx_world.alice)
    api = {"Authorization": f"Token {token}"}
    team = tx_world.team_a.name
    before = _connections(database)
    with production_web(tmp_path / "web.log") as (url, web):
        workers = _children(web.pid)
        assert len(workers) == WORKERS

        # A browser's live-update socket, on one worker; a submission, answered by any, reaches it
        # through the channel layer.
        host = url.removeprefix("http://")
        cookie = f"{settings.SESSION_COOKIE_NAME}={_session_cookie(tx_world.alice)}"
        with connect(f"ws://{host}/ws/workspaces/{team}/", additional_headers={"Cookie": cookie, "Origin": url}) as ws:
            body = {"workspace": team, "name": "live", "command": "true"}
            job = requests.post(f"{url}/api/v1/jobs/", json=body, headers=api, timeout=30)
            assert job.status_code == 201, job.text
            event = json.loads(ws.recv(timeout=30))
            assert (event["kind"], event["id"]) == ("job", job.json()["id"])

        # Another tenant's socket is refused before it opens.
        other = f"ws://{host}/ws/workspaces/{tx_world.team_b.name}/"
        with pytest.raises(InvalidStatus, match="HTTP 403"):
            connect(other, additional_headers={"Cookie": cookie, "Origin": url})

        # A burst spreads over the workers; every request is answered, within the pools.
        with ThreadPoolExecutor(max_workers=50) as pool:
            fetch = lambda n: requests.get(f"{url}/api/v1/jobs/", headers=api, timeout=60).status_code  # noqa: E731
            statuses = list(pool.map(fetch, range(300)))
        assert [s for s in statuses if s != 200] == []
        assert _connections(database) - before <= WORKERS * POOL_MAX

        # A worker dies: gunicorn starts another, and the portal keeps answering.
        victim = sorted(workers)[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while victim in _children(web.pid) or len(_children(web.pid)) < WORKERS:
            assert time.monotonic() < deadline, (tmp_path / "web.log").read_text()
            time.sleep(0.2)
        with ThreadPoolExecutor(max_workers=10) as pool:
            fetch = lambda n: requests.get(f"{url}/api/v1/jobs/", headers=api, timeout=60).status_code  # noqa: E731
            assert set(pool.map(fetch, range(40))) == {200}
