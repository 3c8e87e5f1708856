from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _database_url_for(settings_dict: dict[str, Any]) -> str:
    user = settings_dict.get("USER") or ""
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{settings_dict['NAME']}"


@pytest.fixture(scope="session")
def celery_queue(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    """A real Celery worker process on its own queue, against the test database and the broker."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.fail("The worker round-trip needs PostgreSQL: run the suite with deploy/test.sh.")
    queue = f"test-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "DATABASE_URL": _database_url_for(connection.settings_dict),
        "PORTAL_SCHEDULER_TRIGGER": "off",
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "worker",
            "--pool=solo",
            "-Q",
            queue,
            "-n",
            f"{queue}@%h",
            "--without-mingle",
            "--without-gossip",
            "--loglevel=WARNING",
        ],  # fmt: skip
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        yield queue
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        with django_db_blocker.unblock():
            connection.close()
