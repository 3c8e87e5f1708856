"""A Redis restart under a production worker: the worker rides it out and takes tasks again, with
nothing to restart by hand."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from django.db import connection

from tests.workers.conftest import ROOT, _database_url_for
from workers.tasks import ping


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _redis(port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)


@pytest.fixture
def redis_port() -> Iterator[int]:
    if subprocess.run(["which", "redis-server"], capture_output=True).returncode != 0:
        pytest.fail("redis-server is not installed: deploy/test.sh installs it")
    yield _free_port()


def _ping(app: Celery, queue: str, timeout_s: float) -> Any:
    return app.send_task(ping.name, queue=queue).get(timeout=timeout_s)


def test_the_worker_takes_tasks_again_after_redis_restarts(transactional_db: None, redis_port: int) -> None:
    url = f"redis://127.0.0.1:{redis_port}/0"
    server = _redis(redis_port)
    queue = f"restart-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DATABASE_URL": _database_url_for(connection.settings_dict), "REDIS_URL": url,
           "CELERY_BROKER_URL": url, "PORTAL_SCHEDULER_TRIGGER": "off"}  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "portal", "worker", "--pool=solo", "-Q", queue, "-n", f"{queue}@%h",
         "--without-mingle", "--without-gossip", "--loglevel=WARNING"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    app = Celery("restart-test", broker=url, backend=url)
    app.conf.broker_connection_retry_on_startup = True
    try:
        assert _ping(app, queue, 60)["pong"] is True

        server.kill()  # Redis dies, and comes back on the same address a moment later
        server.wait()
        time.sleep(1)
        server = _redis(redis_port)

        # Each try from a new client: a client's own result subscription does not outlive the
        # restart, and what is under test is the worker's recovery, not this test's.
        deadline = time.monotonic() + 90
        while True:
            client = Celery("restart-test", broker=url, backend=url)
            try:
                assert _ping(client, queue, 5)["pong"] is True
                break
            except Exception:
                assert time.monotonic() < deadline, "the worker took no task within 90 s of Redis's restart"
            finally:
                client.close()
        assert worker.poll() is None  # the same worker, never restarted
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        server.kill()
        server.wait()
        app.close()
