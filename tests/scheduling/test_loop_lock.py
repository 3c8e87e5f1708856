"""The scheduler loop's lock (apps/scheduling/leader.py): of several loops on one database, one runs rounds,
the others wait and say so, and one of them takes over when the leader stops or loses its session."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from apps.scheduling.leader import LOOP_LOCK_ID, LoopLock
from tests.workers.conftest import _database_url_for

ROOT = Path(__file__).resolve().parents[2]
# The in-process tests take a lock of their own: a loop the suite starts elsewhere never meets them.
TEST_LOCK_ID = LOOP_LOCK_ID + 1000


@pytest.fixture(autouse=True)
def _postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.fail("The scheduler loop's lock is PostgreSQL's: run the suite with deploy/test.sh.")


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Loop(threading.Thread):
    """A loop as run_scheduler runs it: wait for the lock, then rounds while it holds it (each recorded)."""

    def __init__(self, name: str, rounds: list[tuple[str, float, float]]) -> None:
        super().__init__(name=name, daemon=True)
        self.lock = LoopLock(lock_id=TEST_LOCK_ID, poll_s=0.05)
        self.stop, self.rounds, self.leading = threading.Event(), rounds, threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                started = time.monotonic()  # a round counts from the moment its loop asks whether it leads
                if not self.lock.held():
                    self.leading.clear()
                    if not self.lock.acquire(self.stop):
                        return
                    started = time.monotonic()
                self.leading.set()
                time.sleep(0.02)  # a round
                self.rounds.append((self.name, started, time.monotonic()))
        finally:
            self.lock.release()


Loops = tuple[Loop, Loop, list[tuple[str, float, float]]]


@pytest.fixture
def loops() -> Iterator[Loops]:
    rounds: list[tuple[str, float, float]] = []
    first, second = Loop("first", rounds), Loop("second", rounds)
    yield first, second, rounds
    for loop in (first, second):
        loop.stop.set()
        loop.join(timeout=10)


def _never_overlap(rounds: list[tuple[str, float, float]]) -> None:
    ordered = sorted(rounds, key=lambda r: r[1])
    overlaps = [(a, b) for a, b in zip(ordered, ordered[1:], strict=False) if b[1] < a[2]]
    assert overlaps == []


@pytest.mark.django_db
def test_it_runs_one_loop_and_hands_over_when_it_stops(loops: Loops, caplog: pytest.LogCaptureFixture) -> None:
    first, second, rounds = loops
    caplog.set_level("INFO", logger="apps.scheduling.leader")
    first.start()
    _until(first.leading.is_set, "the first loop to lead")
    second.start()
    _until(lambda: "held by gpuportal-scheduler" in caplog.text, "the second loop to say it waits")
    time.sleep(0.5)
    assert not second.leading.is_set()
    assert {name for name, _, _ in rounds} == {"first"}
    stopped_at = time.monotonic()
    first.stop.set()
    first.join(timeout=10)
    _until(second.leading.is_set, "the second loop to take over", timeout_s=5)
    _until(lambda: any(name == "second" for name, _, _ in rounds), "a round of the second loop")
    assert min(start for name, start, _ in rounds if name == "second") >= stopped_at
    _never_overlap(rounds)


@pytest.mark.django_db
def test_a_leader_whose_session_ends_stops_until_it_holds_the_lock_again(loops: Loops) -> None:
    first, second, rounds = loops
    first.start()
    _until(first.leading.is_set, "the first loop to lead")
    second.start()
    time.sleep(0.3)
    assert not second.leading.is_set()
    # The database ends the leader's session (a restart, a lost node): the lock goes with it, and whichever
    # loop asks first holds it next, on a session of its own.
    assert first.lock._connection is not None
    ended = first.lock._connection.info.backend_pid
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [ended])
    ended_at = time.monotonic()
    _until(lambda: _holder() not in (None, ended), "a loop to hold the lock again", timeout_s=5)
    _until(lambda: any(start > ended_at for _, start, _ in rounds), "a round after the hand-over", timeout_s=5)
    assert first.leading.is_set() != second.leading.is_set()
    # A round the old leader had begun may end after the hand-over (a scheduling cycle takes a lock of its own
    # for that instant); no round begins without the lock.
    _never_overlap([r for r in rounds if r[1] > ended_at])


@pytest.mark.django_db
def test_a_lock_of_the_same_number_in_another_database_is_another_portals(caplog: pytest.LogCaptureFixture) -> None:
    """Advisory locks are one database's: a portal on another database of the same server neither blocks this
    one's loop nor is named as its holder."""
    caplog.set_level("INFO", logger="apps.scheduling.leader")
    params = connection.get_connection_params() | {"dbname": "postgres", "autocommit": True}
    with psycopg.connect(**params, application_name="another portal's loop") as elsewhere:
        elsewhere.execute("SELECT pg_advisory_lock(%s)", [TEST_LOCK_ID])
        first, second = LoopLock(lock_id=TEST_LOCK_ID, poll_s=0.05), LoopLock(lock_id=TEST_LOCK_ID, poll_s=0.05)
        stop = threading.Event()
        try:
            assert first.acquire(stop)
            threading.Timer(0.5, stop.set).start()
            assert not second.acquire(stop)
        finally:
            first.release()
            second.release()
    waiting = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert len(waiting) == 1 and waiting[0].startswith(f"The scheduler loop's lock is held by {first.name} (")


def _holder() -> int | None:
    """The database session holding the test's lock, if any."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND objsubid = 1 AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [TEST_LOCK_ID],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def _logs(logs: dict[str, Path]) -> str:
    return "\n".join(f"{name}: {path.read_text()}" for name, path in logs.items())


def test_the_scheduler_loops_of_two_processes_take_turns(django_db_setup: None, tmp_path: Path) -> None:
    """Two `manage.py run_scheduler` processes: the second waits, saying who leads, and leads once the first
    is stopped (SIGTERM, as Kubernetes stops a pod)."""
    env = {
        **os.environ,
        "DATABASE_URL": _database_url_for(connection.settings_dict),
        "PORTAL_DATA_DIR": str(tmp_path / "data"),
        "PORTAL_SCHEDULER_TRIGGER": "off",
        "PORTAL_WORKLOAD_TRIGGER": "off",
        "LOG_LEVEL": "INFO",
    }
    logs = {name: tmp_path / f"{name}.log" for name in ("first", "second")}
    processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str) -> None:
        with open(logs[name], "wb") as log:
            processes[name] = subprocess.Popen(
                [sys.executable, "manage.py", "run_scheduler", "--interval", "0.5"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def said(name: str, text: str) -> bool:
        return text in logs[name].read_text()

    try:
        start("first")
        _until(lambda: said("first", "holds the scheduler loop's lock"), "the first loop to lead")
        start("second")
        _until(lambda: said("second", "is held by gpuportal-scheduler"), "the second loop to wait")
        leader = re.search(r"(gpuportal-scheduler \S+ pid \d+) holds", logs["first"].read_text())
        assert leader and f"held by {leader.group(1)} " in logs["second"].read_text(), _logs(logs)
        assert not said("second", "holds the scheduler loop's lock")
        os.killpg(processes["first"].pid, signal.SIGTERM)
        assert processes["first"].wait(timeout=30) == 0
        _until(lambda: said("second", "holds the scheduler loop's lock"), "the second loop to take over")
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
