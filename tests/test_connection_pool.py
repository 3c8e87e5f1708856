"""Under a burst of concurrent requests to Daphne on PostgreSQL, the web process answers every one
and holds no more database connections than its pool allows (persistent per-thread connections
once piled up until PostgreSQL refused new clients); when PostgreSQL drops them all, the next
requests are answered on fresh ones."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from django.db import connection

from tests.personas import World, api_token
from tests.workers.conftest import _database_url_for

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
POOL_MAX = 4
REQUESTS, CONCURRENCY = 500, 100


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _connections(database: str) -> int:
    with connection.cursor() as cursor:
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        cursor.execute(query, [database])
        return int(cursor.fetchone()[0])


def test_a_burst_of_500_requests_gets_500_answers_from_a_bounded_pool(tx_world: World) -> None:
    database = connection.settings_dict["NAME"]
    token = api_token(tx_world.alice)
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": _database_url_for(connection.settings_dict)}
    env.update(DATABASE_POOL_MAX=str(POOL_MAX), DATABASE_CONN_MAX_AGE="0")
    web = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "portal.asgi:application"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(f"{url}/healthz", timeout=2)
                break
            except requests.ConnectionError:
                assert web.poll() is None and time.monotonic() < deadline, "Daphne did not start"
                time.sleep(0.2)
        before = _connections(database)
        peak, done = [before], threading.Event()

        def watch() -> None:
            try:
                while not done.is_set():
                    peak.append(_connections(database))
                    time.sleep(0.05)
            finally:
                connection.close()  # this thread's own connection

        def fetch(n: int) -> int:
            path = "/api/v1/jobs/" if n % 2 else f"/api/v1/workspaces/{tx_world.team_a.name}/"
            return requests.get(f"{url}{path}", headers={"Authorization": f"Token {token}"}, timeout=60).status_code

        watcher = threading.Thread(target=watch)
        watcher.start()
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            statuses = list(pool.map(fetch, range(REQUESTS)))
        done.set()
        watcher.join()
        # PostgreSQL drops every connection of the web process (a restart, a failover): the pool
        # replaces them, and no request sees a dead one.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                [database],
            )
        with ThreadPoolExecutor(max_workers=20) as pool:
            after_drop = list(pool.map(fetch, range(100)))
    finally:
        web.terminate()
        web.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _connections(database) > before and time.monotonic() < deadline:  # gone with the process
            time.sleep(0.1)

    assert [s for s in statuses if s != 200] == []
    assert max(peak) - before <= POOL_MAX
    assert [s for s in after_drop if s != 200] == []
