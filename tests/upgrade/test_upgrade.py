"""Upgrading from the previous release (deploy/previous-release) to this tree on PostgreSQL, as
docs/operations.md ("Upgrading") does it: the previous release's code, checked out of this clone's
history, makes a database with its own migrations and fills every one of its tables; this tree's
`migrate` then runs while the previous release's web process keeps serving reads. No row is lost,
the usage report is the same, every read is answered. And the new migrations keep to the rule that
makes this possible: nothing the previous release reads or writes is dropped, renamed or made
stricter in the same release."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from django.core.management import call_command

from tests.test_web_server import _answers, _free_port

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).with_name("release_data.py")
# What the previous release's web process is asked, over and over, during the migration.
READS = ["me/", "workspaces/", "jobs/", "instances/", "notebooks/", "endpoints/", "ray-clusters/", "workloads/",
         "gprs/", "alerts/", "alert-rules/", "audit-events/", "usage/", "clusters/", "gpus/"]  # fmt: skip
# Migrations since the previous release that break the rule on purpose: (app, name) -> why it is
# safe all the same (say what the previous release does with what they change).
ALLOWED: dict[tuple[str, str], str] = {}


def previous_release() -> str:
    """The commit deploy/previous-release names (its first word that is not a comment)."""
    lines = (ROOT / "deploy" / "previous-release").read_text().splitlines()
    return next(line.split()[0] for line in lines if line.strip() and not line.startswith("#"))


def _git(*args: str, **options: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False, **options)


def have_commit(commit: str) -> bool:
    """Whether this clone has `commit`; a shallow clone first fetches the rest of its history from
    where it was cloned (when that is reachable)."""
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0:
        return True
    if _git("rev-parse", "--is-shallow-repository", text=True).stdout.strip() == "true":
        _git("fetch", "--quiet", "--unshallow", timeout=300)
    return _git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's files, from this clone's history."""
    commit = previous_release()
    if not have_commit(commit):
        pytest.fail(
            f"deploy/previous-release names {commit}, which this clone does not have: the upgrade test needs "
            "the repository's history (in CI, check out with full history, e.g. fetch-depth: 0)."
        )
    tree = tmp_path_factory.mktemp("previous-release")
    archive = _git("archive", "--format=tar", commit)
    assert archive.returncode == 0, archive.stderr.decode()
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


@pytest.fixture
def database_url() -> Iterator[str]:
    """An empty database of the test's own."""
    base = os.environ["DATABASE_URL"]
    server, name = base.rsplit("/", 1)[0], f"gp_upgrade_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _env(tree: Path, url: str, data_dir: Path) -> dict[str, str]:
    """A release's processes: its tree first on the path, the test's database, nothing queued."""
    return {**os.environ, "PYTHONPATH": str(tree), "DATABASE_URL": url, "DATABASE_POOL_MAX": "0",
            "PORTAL_DATA_DIR": str(data_dir), "PORTAL_WORK_DIR": str(data_dir / "work"),
            "PORTAL_SCHEDULER_TRIGGER": "off", "PORTAL_WORKLOAD_TRIGGER": "off"}  # fmt: skip


def _release(tree: Path, url: str, data_dir: Path, phase: str) -> Any:
    """release_data.py's `phase` run by the release in `tree`: its last line of output, as JSON."""
    done = subprocess.run([sys.executable, str(DATA), phase], cwd=tree, env=_env(tree, url, data_dir),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rows(url: str) -> dict[str, set[str] | int]:
    """Every table's rows: the set of primary keys where it has one column of them, else a count."""
    with psycopg.connect(url) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
            "AND table_type = 'BASE TABLE'")]  # fmt: skip
        keys = dict(conn.execute(
            "SELECT tc.table_name, min(kcu.column_name) FROM information_schema.table_constraints tc "
            "JOIN information_schema.key_column_usage kcu ON kcu.constraint_name = tc.constraint_name "
            "AND kcu.table_schema = tc.table_schema WHERE tc.constraint_type = 'PRIMARY KEY' "
            "AND tc.table_schema = 'public' GROUP BY tc.table_name HAVING count(*) = 1").fetchall())  # fmt: skip
        found: dict[str, set[str] | int] = {}
        for table in tables:
            if table in keys:
                found[table] = {str(row[0]) for row in conn.execute(f'SELECT "{keys[table]}" FROM "{table}"')}
            else:
                found[table] = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]  # type: ignore[index]
    return found


def _lost(before: set[str] | int, after: set[str] | int | None) -> list[str] | int:
    """What of a table's rows `before` is not there `after`: the keys gone, or how many rows fewer."""
    if after is None:
        return ["the table is gone"]
    if isinstance(before, int) or isinstance(after, int):
        return max(0, _size(before) - _size(after))
    return sorted(before - after)


def _size(rows: set[str] | int) -> int:
    return rows if isinstance(rows, int) else len(rows)


@contextmanager
def old_web(tree: Path, url: str, data_dir: Path, log: Path) -> Iterator[str]:
    """The previous release's web process, as its docs/operations.md starts it (one worker)."""
    port = _free_port()
    env = {**_env(tree, url, data_dir), "WEB_CONCURRENCY": "1"}
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "python:portal.gunicorn_conf", "-b", f"127.0.0.1:{port}",
         "portal.asgi:application"],
        cwd=tree, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _answers(f"{base}/healthz"):
            assert web.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield base
    finally:
        os.killpg(web.pid, 15)
        try:
            web.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(web.pid, 9)
            web.wait()


class Reader(threading.Thread):
    """GETs the API's reads in turn, as long as it runs, noting each answer's status and when."""

    def __init__(self, base: str, token: str) -> None:
        super().__init__(daemon=True)
        self.base, self.token = base, token
        self.answers: list[tuple[float, str, int]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {self.token}"
        while not self.stopping.is_set():
            for path in READS:
                try:
                    status = session.get(f"{self.base}/api/v1/{path}", timeout=30).status_code
                except requests.RequestException:
                    status = 0
                self.answers.append((time.monotonic(), path, status))


@pytest.mark.slow
def test_it_upgrades_from_the_previous_release_losing_nothing_while_the_old_web_process_serves(
    previous_tree: Path, database_url: str, tmp_path: Path
) -> None:
    seeded = _release(previous_tree, database_url, tmp_path / "data", "seed")
    before, report = _rows(database_url), _release(previous_tree, database_url, tmp_path / "data", "report")
    assert report, "the previous release's data has GPU use to report"

    with old_web(previous_tree, database_url, tmp_path / "data", tmp_path / "web.log") as base:
        reader = Reader(base, seeded["reader"])
        reader.start()
        while len(reader.answers) < len(READS):  # warm: every read answered once before
            time.sleep(0.1)
        began = time.monotonic()
        migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--no-input"], cwd=ROOT,
                                 env=_env(ROOT, database_url, tmp_path / "data"), capture_output=True, text=True,
                                 timeout=300)  # fmt: skip
        ended = time.monotonic()
        time.sleep(2)  # and the old process keeps answering on the new schema
        reader.stopping.set()
        reader.join(timeout=60)
        # What it writes too: its INSERTs name only the columns it knows.
        submitted = requests.post(f"{base}/api/v1/jobs/", json={"workspace": "team-a", "name": "after-upgrade",
                                  "command": "true"}, headers={"Authorization": f"Token {seeded['writer']}"},
                                  timeout=30)  # fmt: skip
    assert migrate.returncode == 0, migrate.stderr[-4000:]

    failed = [(path, status) for _, path, status in reader.answers if status != 200]
    assert not failed, f"{failed[:10]}\n{(tmp_path / 'web.log').read_text()[-4000:]}"
    assert any(began <= at <= ended for at, _, _ in reader.answers), "reads were answered during the migration"
    assert any(at > ended for at, _, _ in reader.answers), "reads were answered after it"
    assert submitted.status_code == 201, f"{submitted.text[:400]}\n{(tmp_path / 'web.log').read_text()[-4000:]}"

    after = _rows(database_url)
    lost = {table: missing for table, rows in before.items() if (missing := _lost(rows, after.get(table)))}
    assert not lost, f"rows lost in the upgrade: {lost}"
    assert _release(ROOT, database_url, tmp_path / "data", "report") == report


# --- The rule ------------------------------------------------------------------------------------

_MIGRATION = re.compile(r"^apps/(?P<app>\w+)/migrations/(?P<name>\d{4}_\w+)\.py$")


def new_migrations() -> list[tuple[str, str]]:
    """(app, name) of every migration in this tree that the previous release does not have."""
    have_commit(previous_release())
    listed = _git("ls-tree", "-r", "--name-only", previous_release(), "--", "apps", text=True)
    assert listed.returncode == 0, f"deploy/previous-release's commit is not in this clone: {listed.stderr}"
    old = set(listed.stdout.split())
    here = {str(path.relative_to(ROOT)) for path in ROOT.glob("apps/*/migrations/[0-9][0-9][0-9][0-9]_*.py")}
    return sorted((m["app"], m["name"]) for path in sorted(here - old) if (m := _MIGRATION.match(path)))


def breaches(sql: str, new_tables: set[str]) -> list[str]:
    """What in a migration's SQL the previous release's code would trip over, on its own tables
    (those not in `new_tables`): a column or table dropped or renamed, a column made NOT NULL or
    retyped, a NOT NULL column added with no default left in the database (its INSERTs name only
    the columns it knows)."""
    found = []
    for part in sql.split(";"):
        statement = " ".join(line.strip() for line in part.splitlines() if not line.lstrip().startswith("--")).strip()
        table = re.search(r'(?:ALTER|DROP) TABLE (?:IF EXISTS )?"(\w+)"', statement)
        if table is None or table[1] in new_tables:
            continue
        for pattern, why in (
            (r"\bDROP COLUMN\b", "drops a column"),
            (r"\bDROP TABLE\b", "drops a table"),
            (r"\bRENAME\b", "renames"),
            (r"\bALTER COLUMN \"\w+\" SET NOT NULL\b", "makes a column NOT NULL"),
            (r"\bALTER COLUMN \"\w+\" TYPE\b", "changes a column's type"),
        ):
            if re.search(pattern, statement):
                found.append(f"{why}: {statement}")
        added = re.search(r'ADD COLUMN "(\w+)" [^;]*\bNOT NULL\b', statement)
        if added and ("DEFAULT" not in statement or re.search(rf'ALTER COLUMN "{added[1]}" DROP DEFAULT', sql)):
            found.append(f"adds a NOT NULL column with no default in the database (use db_default): {statement}")
    return found


@pytest.mark.django_db
def test_the_migrations_since_the_previous_release_keep_what_it_reads_and_writes() -> None:
    sql = {}
    for app, name in new_migrations():
        out = io.StringIO()
        call_command("sqlmigrate", app, name, stdout=out)
        sql[app, name] = out.getvalue()
    new_tables = {table for text in sql.values() for table in re.findall(r'CREATE TABLE "(\w+)"', text)}
    broken = {key: found for key, text in sql.items() if key not in ALLOWED and (found := breaches(text, new_tables))}
    assert not broken, (
        "Migrations must stay backwards-compatible for one release (docs/operations.md, 'Upgrading'): "
        f"{json.dumps({'.'.join(key): found for key, found in broken.items()}, indent=1)}"
    )


def test_the_rule_refuses_what_would_break_the_previous_release() -> None:
    assert breaches('ALTER TABLE "t" DROP COLUMN "a" CASCADE;', set())
    assert breaches('ALTER TABLE "t" RENAME COLUMN "a" TO "b";', set())
    assert breaches('ALTER TABLE "t" ALTER COLUMN "a" SET NOT NULL;', set())
    assert breaches('ALTER TABLE "t" ADD COLUMN "a" jsonb DEFAULT \'[]\'::jsonb NOT NULL;\n'
                    'ALTER TABLE "t" ALTER COLUMN "a" DROP DEFAULT;', set())  # fmt: skip
    assert breaches('DROP TABLE "t" CASCADE;', set())
    assert not breaches('ALTER TABLE "t" ADD COLUMN "a" integer NULL;', set())
    assert not breaches('ALTER TABLE "t" ADD COLUMN "a" integer DEFAULT 0 NOT NULL;', set())
    assert not breaches('ALTER TABLE "n" DROP COLUMN "a" CASCADE;', {"n"})  # a table new in this release
