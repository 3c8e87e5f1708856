"""The embedded portal heals: a crashed process (worker, scheduler loop, web) is started again
while running work goes on, nothing lost or run twice; a second portal will not start beside a
live one; and a killed supervisor takes its processes with it, its running job then found again
by the next start."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import requests

from tests.test_embedded import EmbeddedPortal


def _portal_process(data_dir: Path, argv_part: str) -> int | None:
    """The pid of the portal's process (web, worker, ...) whose command line has ``argv_part``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if f"PORTAL_DATA_DIR={data_dir}".encode() in environ and argv_part.encode() in cmdline:
            return int(entry.name)
    return None


def _pids_of(marker: str) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def _until(check: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow
def test_the_embedded_portal_heals_refuses_a_twin_and_dies_whole(tmp_path: Path) -> None:
    data_dir = tmp_path / "portal-data"
    portal = EmbeddedPortal(data_dir)
    marker = f"portal-test-{uuid.uuid4().hex[:8]}"
    try:
        url = portal.wait_ready()
        headers = portal.admin_headers(url)
        body = {"workspace": "admin", "name": "long", "command": f"sleep 300 # {marker}"}
        job = requests.post(f"{url}/api/v1/jobs/", json=body, headers=headers, timeout=10).json()
        job_url = f"{url}/api/v1/jobs/{job['id']}/"
        _until(lambda: requests.get(job_url, headers=headers, timeout=10).json()["state"] == "RUNNING", "the job")
        running = _pids_of(marker)
        assert running

        # The worker dies: it is started again, the portal keeps answering, the job keeps running.
        worker = _portal_process(data_dir, "-n quick@")
        assert worker is not None
        os.kill(worker, signal.SIGKILL)
        _until(lambda: _portal_process(data_dir, "-n quick@") not in (None, worker), "a new worker")
        assert any("worker exited with status" in line and "restarting" in line for line in portal.output)
        assert requests.get(f"{url}/healthz", timeout=10).status_code == 200
        job = requests.get(job_url, headers=headers, timeout=10).json()
        assert (job["state"], job["attempts"]) == ("RUNNING", 1)
        assert _pids_of(marker) == running

        # The scheduler loop and the web process die too: both come back; nothing is lost or re-run.
        for part in ("run_scheduler", "daphne"):
            pid = _portal_process(data_dir, part)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            _until(lambda part=part, pid=pid: _portal_process(data_dir, part) not in (None, pid), f"a new {part}")
        _until(lambda: _answers(f"{url}/healthz"), "the portal to answer again")
        body = {"workspace": "admin", "name": "after", "command": "echo after the crashes"}
        after = requests.post(f"{url}/api/v1/jobs/", json=body, headers=headers, timeout=10).json()
        after_url = f"{url}/api/v1/jobs/{after['id']}/"
        _until(lambda: requests.get(after_url, headers=headers, timeout=10).json()["state"] == "SUCCEEDED", "a job")
        job = requests.get(job_url, headers=headers, timeout=10).json()
        assert (job["state"], job["attempts"]) == ("RUNNING", 1)
        assert _pids_of(marker) == running

        # A second portal on the same data directory refuses to start, and says why.
        twin = EmbeddedPortal(data_dir)
        assert twin.process.wait(timeout=120) == 1
        assert any("Another GPU Portal" in line for line in twin.output), "".join(twin.output)

        # The supervisor is killed: its processes die with it; the job runs on.
        portal.process.send_signal(signal.SIGKILL)
        portal.process.wait()
        for part in ("daphne", "celery -A portal worker", "run_scheduler", "configurable-http-proxy"):
            _until(lambda part=part: _portal_process(data_dir, part) is None, f"{part} to die with its supervisor")
        assert _pids_of(marker) == running
    finally:
        if portal.process.poll() is None:
            portal.stop()

    # The next start takes the lock and finds the job still running: reattached, not run again.
    again = EmbeddedPortal(data_dir)
    try:
        url = again.wait_ready()
        job = requests.get(f"{url}/api/v1/jobs/{job['id']}/", headers=headers, timeout=10).json()
        assert (job["state"], job["attempts"]) == ("RUNNING", 1)
        assert _pids_of(marker) == running
    finally:
        assert again.stop() == 0
    assert _pids_of(marker) == set()  # a clean stop stops its jobs
