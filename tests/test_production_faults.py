"""The production processes fail one at a time, in any order, and nothing is lost, run twice or
left behind: the web process (gunicorn) killed mid-request, the Celery worker killed while it
starts jobs, the scheduler loop killed mid-cycle, Redis restarted; each comes back and the
workloads converge. Each job appends its name to a file in its own directory, so a job body that
ran twice shows as two lines.

Everything is driven through the HTTP API: no broker or Redis client lives in the test process
(one that did kept retrying a stopped Redis after its test and broke the run)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from django.db import connection

from tests.leftovers import stop_everything_of
from tests.personas import World, api_token
from tests.workers.conftest import _database_url_for

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TEAM = "team-a"  # 4 h100 of quota on a machine of 8


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _until(check: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except requests.RequestException:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _pids_with(marker: str) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def _settled_pids(marker: str) -> set[int]:
    """The processes with `marker` once they stay the same for a second: a job's launch passes
    through short-lived processes (the shell and sandbox steps that start its command)."""
    seen = _pids_with(marker)
    time.sleep(1.0)
    now = _pids_with(marker)
    return now if now and now == seen else set()


@dataclass
class Production:
    """PostgreSQL (the test database), a private Redis, and the three processes of docs/operations.md."""

    tmp: Path
    env: dict[str, str]
    redis_port: int
    web_port: int
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    redis: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def argv(self, name: str) -> list[str]:
        return {
            "web": [PYTHON, "-m", "gunicorn", "-c", "python:portal.gunicorn_conf", "-b", f"127.0.0.1:{self.web_port}",
                    "-w", "2", "portal.asgi:application"],
            "worker": [PYTHON, "-m", "celery", "-A", "portal", "worker", "-Q", "celery,provision", "--concurrency=2",
                       "--loglevel=INFO",
                       "--without-gossip", "--without-mingle"],
            "scheduler": [PYTHON, "manage.py", "run_scheduler"],
        }[name]  # fmt: skip

    def start(self, name: str) -> None:
        log = (self.tmp / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            self.argv(name), cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def kill(self, name: str) -> None:
        process = self.processes[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def start_redis(self) -> None:
        log = (self.tmp / "redis.log").open("ab")
        self.redis = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        _until(lambda: _connect_ok(self.redis_port), "Redis")

    def stop_redis(self) -> None:
        assert self.redis is not None
        self.redis.terminate()
        self.redis.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in sorted(self.tmp.glob("*.log"))
        )


def _connect_ok(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture
def production(tx_world: World, tmp_path: Path) -> Iterator[Production]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (deploy/test.sh installs it)")
    redis_port, web_port = _free_port(), _free_port()
    env = {**os.environ, "DATABASE_URL": _database_url_for(connection.settings_dict),
           "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "PORTAL_DATA_DIR": str(tmp_path / "data"),
           "PORTAL_DECLARED_GPUS": "8xh100", "PORTAL_SCHEDULER_INTERVAL_S": "1", "PORTAL_START_LOST_AFTER_S": "3",
           "PORTAL_START_UNTAKEN_S": "15",
           "PORTAL_PUBLIC_URL": f"http://127.0.0.1:{web_port}", "WEB_CONCURRENCY": "2", "DATABASE_POOL_MAX": "4",
           "DJANGO_SETTINGS_MODULE": "portal.settings"}  # fmt: skip
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "PORTAL_SCHEDULER_TRIGGER", "PORTAL_WORKLOAD_TRIGGER"):
        env.pop(name, None)
    logs = tmp_path / "logs"
    logs.mkdir()
    production = Production(logs, env, redis_port, web_port)
    production.start_redis()
    try:
        for name in ("web", "worker", "scheduler"):
            production.start(name)
        _until(lambda: requests.get(f"{production.url}/healthz", timeout=2).ok, "the web process")
        yield production
    finally:
        for process in production.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in production.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if production.redis is not None and production.redis.poll() is None:
            production.stop_redis()
        stop_everything_of(str(tmp_path / "data" / "work"))


class Client:
    def __init__(self, production: Production, token: str):
        self.production = production
        self.headers = {"Authorization": f"Token {token}"}

    def submit(self, name: str, command: str, gpus: str = "1") -> requests.Response:
        body = {"workspace": TEAM, "name": name, "command": command, "gpu_type": "h100", "gpus_per_replica": gpus,
                "env": {"RUN_NAME": name}}  # fmt: skip
        return requests.post(f"{self.production.url}/api/v1/jobs/", json=body, headers=self.headers, timeout=30)

    def jobs(self) -> list[dict[str, Any]]:
        answer = requests.get(f"{self.production.url}/api/v1/jobs/", params={"workspace": TEAM, "page_size": 500},
                              headers=self.headers, timeout=30)  # fmt: skip
        answer.raise_for_status()
        return answer.json()["results"]


# Each job appends its name to a file of its own directory: a body that ran twice leaves two lines.
RECORD = 'echo "$RUN_NAME" >> "$HOME/ran"; sleep 1'


def _bodies_run(production: Production) -> Counter[str]:
    runs: Counter[str] = Counter()
    for record in (Path(production.env["PORTAL_DATA_DIR"]) / "work").rglob("ran"):
        runs.update(record.read_text().split())
    return runs


def _all_succeeded(client: Client, names: set[str]) -> bool:
    states = {job["name"]: job["state"] for job in client.jobs() if job["name"] in names}
    return set(states) == names and set(states.values()) == {"SUCCEEDED"}


@pytest.mark.slow
def test_each_process_killed_in_turn_loses_and_repeats_nothing(production: Production, tx_world: World) -> None:
    client = Client(production, api_token(tx_world.alice))
    try:
        # 1. The worker dies while it starts a burst of jobs, as the first body runs (often between
        #    a start and its record: the next start adopts what runs); a new one comes up later.
        burst = {f"burst-{n}" for n in range(10)}
        for name in sorted(burst):
            assert client.submit(name, RECORD).status_code == 201
        _until(lambda: bool(_bodies_run(production)), "a first body to run", timeout_s=30)
        production.kill("worker")
        time.sleep(1)
        production.start("worker")

        # 2. The scheduler loop dies mid-cycle (a queue of ten for four GPUs keeps it busy).
        time.sleep(1)
        production.kill("scheduler")
        production.start("scheduler")
        _until(lambda: _all_succeeded(client, burst), "the burst to succeed", timeout_s=90)

        # 3. The web process dies under a stream of submissions: each answered one exists once, an
        #    unanswered one once or not at all; none twice.
        answered: set[str] = set()
        cut_off: set[str] = set()
        stop = threading.Event()

        def stream() -> None:
            n = 0
            while not stop.is_set():
                name = f"stream-{n}"
                n += 1
                try:
                    (answered if client.submit(name, "true", gpus="0").status_code == 201 else cut_off).add(name)
                except requests.RequestException:
                    cut_off.add(name)

        sender = threading.Thread(target=stream)
        sender.start()
        time.sleep(1)
        production.kill("web")
        time.sleep(0.5)
        stop.set()
        sender.join()
        production.start("web")
        _until(lambda: requests.get(f"{production.url}/healthz", timeout=2).ok, "the web process again")
        assert answered and cut_off
        names = Counter(job["name"] for job in client.jobs() if job["name"].startswith("stream-"))
        assert all(names[name] == 1 for name in answered)
        assert all(names[name] <= 1 for name in cut_off)

        # 4. Redis restarts: queued work goes on, new submissions run, nothing by hand (a worker
        # that no longer takes work after its broker restarted has its job starts made by the
        # scheduler loop, PORTAL_START_UNTAKEN_S after their admission).
        production.stop_redis()
        time.sleep(1)
        production.start_redis()
        after = {f"after-redis-{n}" for n in range(3)}
        for name in sorted(after):
            answer = _until(lambda name=name: client.submit(name, RECORD).status_code == 201, "a submission")
            assert answer
        _until(lambda: _all_succeeded(client, after), "jobs after the Redis restart", timeout_s=90)

        runs = _bodies_run(production)
        assert {name: count for name, count in runs.items() if count != 1} == {}
        assert set(runs) == burst | after
        for job in client.jobs():
            if job["name"] in burst | after:
                assert job["attempts"] >= 1  # a start lost with the worker is retried, never run twice
    except AssertionError:
        print(production.logs())
        print({job["name"]: (job["state"], job["attempts"]) for job in client.jobs()})
        raise


@pytest.mark.slow
@pytest.mark.parametrize("order", [("worker", "scheduler", "web"), ("web", "scheduler", "worker")])
def test_restarting_each_process_in_any_order_leaves_running_work_alone(
    production: Production, tx_world: World, order: tuple[str, ...]
) -> None:
    client = Client(production, api_token(tx_world.alice))
    marker = f"fault-{uuid.uuid4().hex[:8]}"
    for n in range(2):
        assert client.submit(f"long-{n}", f"sleep 120 # {marker}").status_code == 201
    _until(lambda: {j["state"] for j in client.jobs()} == {"RUNNING"}, "the jobs to run")
    running = _until(lambda: _settled_pids(marker), "their processes")
    try:
        for name in order:
            production.kill(name)
            production.start(name)
            time.sleep(1.5)  # a scheduling period and a reconcile with the process back
        _until(lambda: requests.get(f"{production.url}/healthz", timeout=2).ok, "the web process")
        assert client.submit("after", "true", gpus="0").status_code == 201
        _until(lambda: any(j["name"] == "after" and j["state"] == "SUCCEEDED" for j in client.jobs()), "a new job")
        jobs = {job["name"]: job for job in client.jobs()}
        assert [(jobs[f"long-{n}"]["state"], jobs[f"long-{n}"]["attempts"]) for n in range(2)] == [("RUNNING", 1)] * 2
        assert _pids_with(marker) == running
    except AssertionError:
        print(production.logs())
        raise
