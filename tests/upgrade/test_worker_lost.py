"""A worker stopped in the middle of a task leaves the task to be run again (docs/operations.md,
"Rolling restart"): tasks are acknowledged only once they end, a task whose pool process dies is
handed back to its queue, and one whose whole worker is killed goes back after the broker's
visibility timeout, to the next worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from portal.celery import app
from tests.workers.conftest import ROOT

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)

VISIBILITY_TIMEOUT_S = 2


@pytest.fixture
def queue() -> str:
    if not app.conf.broker_url.startswith("redis://"):
        pytest.fail("Workers handing tasks over is a property of the Redis broker: set REDIS_URL.")
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for worker in started:
        worker.terminate()  # a warm shutdown, which ends its pool's processes too
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def _start(workers: list[subprocess.Popen[bytes]], queue: str, *pool: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PORTAL_SCHEDULER_TRIGGER": "off",
        "PORTAL_TASK_VISIBILITY_TIMEOUT_S": str(VISIBILITY_TIMEOUT_S),
    }
    argv = [sys.executable, "-m", "celery", "-A", "portal", "worker", *pool, "-Q", queue, "-n",
            f"{uuid.uuid4().hex[:8]}@%h", "--include", "tests.upgrade.held_task", "--without-mingle",
            "--without-gossip", "--loglevel=WARNING"]  # fmt: skip
    worker = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers.append(worker)
    return worker


def _wait_for(notes: Path, text: str, count: int, timeout_s: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = notes.read_text().splitlines() if notes.exists() else []
        if sum(line.startswith(text) for line in lines) >= count:
            return lines
        time.sleep(0.1)
    raise AssertionError(f"no {count} × {text!r} in {timeout_s} s: {lines}")


def test_a_task_whose_worker_is_killed_is_run_by_the_next_worker(
    queue: str, workers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    notes = tmp_path / "notes"
    first = _start(workers, queue, "--pool=solo")
    app.send_task("tests.upgrade.held", args=[str(notes)], queue=queue)
    _wait_for(notes, "started", 1)
    taken_at = time.monotonic()
    first.send_signal(signal.SIGKILL)  # no warm shutdown: the task is neither ended nor acknowledged
    first.wait()
    time.sleep(max(0.0, taken_at + VISIBILITY_TIMEOUT_S + 0.5 - time.monotonic()))
    second = _start(workers, queue, "--pool=solo")
    lines = _wait_for(notes, "ended", 1)
    assert lines == [f"started {first.pid}", f"started {second.pid}", f"ended {second.pid}"]


def test_a_task_whose_pool_process_dies_goes_back_to_the_queue(
    queue: str, workers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    notes = tmp_path / "notes"
    _start(workers, queue, "--pool=prefork", "--concurrency=1")
    app.send_task("tests.upgrade.held", args=[str(notes)], queue=queue)
    child = int(_wait_for(notes, "started", 1)[0].split()[1])
    os.kill(child, signal.SIGKILL)  # as the kernel's out-of-memory killer would
    lines = _wait_for(notes, "ended", 1)
    assert len(lines) == 3 and lines[1].startswith("started") and lines[1] != lines[0], lines
