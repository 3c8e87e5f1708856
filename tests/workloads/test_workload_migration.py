"""The migrations that made the one workload table carry every row over, on SQLite and on
PostgreSQL: a database made by the previous release's migrations, holding jobs, instances,
notebooks, allocations, samples, attempts, collaborators and audit events, is migrated and read
back (tests/workloads/migration_scenario.py, in processes of their own, on a database of their own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = Path(__file__).with_name("migration_scenario.py")
# GPU-seconds by month (alice, team-a, h100) of the old release's usage report on these rows:
# train 2 GPUs x 4 h across the month's end, tune's attempt 1 GPU x 1 h, box 1 GPU x 2 h.
USAGE = [
    ["2026-10", "team-a", "alice", "h100", 25200],
    ["2026-11", "team-a", "alice", "h100", 14400],
]


def _run(url: str, tmp_path: Path, *args: str) -> Any:
    env = {**os.environ, "DATABASE_URL": url, "PORTAL_DATA_DIR": str(tmp_path / "data"), "DATABASE_POOL_MAX": "0",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(SCENARIO), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.sqlite3'}"
        return
    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith("postgres"):
        pytest.skip("the PostgreSQL case runs where the suite runs on PostgreSQL")
    name = f"gp_migrate_{uuid.uuid4().hex[:10]}"
    server = base.rsplit("/", 1)[0]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_every_row_moves_to_the_workload_table_and_the_usage_report_is_the_same(
    database_url: str, tmp_path: Path
) -> None:
    ids = _run(database_url, tmp_path, "before")
    moved = _run(database_url, tmp_path, "after", json.dumps(ids))
    assert moved["job_ids"] == sorted(ids["jobs"])  # a job keeps its id
    assert moved["job_states"] == [["train", "SUCCEEDED", "2.000", 1], ["tune", "RUNNING", "0.500", 2]]
    assert moved["kinds"] == ["instance", "job", "job", "notebook"]
    assert moved["pod_sets"] == [
        ["instance", "main", "1.000", 1],
        ["job", "main", "0.500", 2],
        ["job", "main", "2.000", 1],
    ]
    # The instance and the notebook had ids of jobs: they have new ones, and what referred to
    # them follows.
    assert moved["instance_is_new"] and moved["notebook_on_instance"] and moved["collaborator_on_instance"]
    assert moved["invitation_on_instance"]
    assert moved["notebook_target"] == "http+unix://x"
    assert moved["collaborator"][0][1:] == ["bob", "read"]
    assert moved["attempts"] == 2 and moved["artifacts"] == [["train", "model.pt"]]
    assert moved["allocations"] == [
        ["instance", "main", 0, "1.000"],
        ["job", "main", 0, "0.500"],
        ["job", "main", 1, "0.500"],
    ]
    assert moved["samples"] == [["instance", "box"], ["job", "tune"]]
    assert moved["audit_on_instance"]
    assert moved["backend_state"] == {"pid": 1}
    assert [[*row[:4], round(float(row[4]))] for row in moved["usage"]] == USAGE
