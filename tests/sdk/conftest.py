"""A live embedded portal for the SDK and CLI: started as `bash deploy/run.sh` starts it (web,
Celery worker, scheduler loop, local backend, SQLite) in its own data directory, once per test
process, and driven over real HTTP.

It outlives each test, and so do its workspaces' disks: their images lie in its own data directory,
not in the one whose disks go after every test (tests/conftest.py), which would pull a disk from
under a workload the portal is still starting or running for a later test."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from gpuportal import Client, GPUPortalError, Job

from tests.leftovers import release_disks
from tests.test_embedded import EmbeddedPortal, _processes_with

T = TypeVar("T")

GPUPORTAL = str(Path(sys.executable).with_name("gpuportal"))  # the installed console script


@dataclass(frozen=True)
class LivePortal:
    url: str
    data_dir: Path
    passwords: dict[str, str]
    token: str  # the demo user's

    def client(self) -> Client:
        return Client(self.url, self.token, timeout=30)


@pytest.fixture(scope="session")
def live_portal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LivePortal]:
    data_dir = tmp_path_factory.mktemp("sdk-portal")
    disk_images = data_dir / "disks"  # the portal's default, outside its work directory
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PORTAL_DISK_IMAGE_DIR", str(disk_images))
        portal = EmbeddedPortal(data_dir)
    try:
        url = portal.wait_ready()
        output = "".join(portal.output)
        passwords = dict(re.findall(r"Login: (\w+) / (\S+)", output))
        assert {"admin", "demo"} <= passwords.keys(), output
        token = Client.login(url, "demo", passwords["demo"]).token
        assert token
        yield LivePortal(url=url, data_dir=data_dir, passwords=passwords, token=token)
    finally:
        portal.stop()
        for pid in _processes_with(str(data_dir)):  # jobs or instances a failed test left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        release_disks(disk_images)  # what its stop left mounted (a workload it could not stop)


@pytest.fixture
def portal_client(live_portal: LivePortal) -> Iterator[Client]:
    with live_portal.client() as client:
        yield client


Run = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def cli_env(live_portal: LivePortal, tmp_path: Path) -> dict[str, str]:
    """The environment of a user whose portal and token come from GPUPORTAL_URL and GPUPORTAL_TOKEN."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPORTAL_")}
    env.update(
        GPUPORTAL_URL=live_portal.url,
        GPUPORTAL_TOKEN=live_portal.token,
        GPUPORTAL_CONFIG=str(tmp_path / "config" / "config.yaml"),
        COLUMNS="200",
    )
    return env


@pytest.fixture
def cli(cli_env: dict[str, str], tmp_path: Path) -> Run:
    """Run `gpuportal ARGS...` in a subprocess, in the test's folder; returns the finished process."""

    def run(*args: str, input: str | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [GPUPORTAL, *args], env=cli_env, cwd=tmp_path, input=input, capture_output=True, text=True, timeout=timeout
        )

    return run


def until(fetch: Callable[[], T], predicate: Callable[[T], bool], timeout_s: float = 60) -> T:
    """Fetch until `predicate` holds (a state the test needs before it goes on). A workload that
    ended without it (``is_final``: a job, a Ray cluster, an endpoint) never will: the test fails
    at once, saying why it ended."""
    deadline = time.monotonic() + timeout_s
    obj = fetch()
    while not predicate(obj):
        assert not getattr(obj, "is_final", False), f"ended instead: {why_ended(obj)}"
        assert time.monotonic() < deadline, f"never got there: {obj!r}"
        time.sleep(0.3)
        obj = fetch()
    return obj


def why_ended(workload: object) -> str:
    """A workload that ended, with the portal's reason and the end of its log."""
    reason = getattr(workload, "failure_reason", "") or getattr(workload, "reason", "")
    text = f"{workload!r}: {reason or 'no reason given'}"
    logs = getattr(workload, "logs", None)
    if callable(logs):
        try:
            tail = str(logs())[-2000:]
        except GPUPortalError as exc:  # the reason matters more than the log
            tail = f"(its log could not be read: {exc})"
        text += f"\n{tail}" if tail else ""
    return text


def wait_for(client: Client, job_id: int, predicate: Callable[[Job], bool], timeout_s: float = 60) -> Job:
    return until(lambda: client.jobs.get(job_id), predicate, timeout_s)


def submitted_id(text: str) -> int:
    found = re.search(r"Submitted job (\d+)", text)
    assert found, text
    return int(found.group(1))
