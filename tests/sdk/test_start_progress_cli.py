"""`gpuportal wait` prints each step of a job's start as it begins (waiting for a worker, the
environment, starting), and the SDK has them as ``StartStep``s (``Job.start_progress``, a wait's
``on_step``): against the live embedded portal, and, for the "each once, as it comes" part, on
successive answers as a wait sees them."""

from __future__ import annotations

import io
import re

from gpuportal import Client, Job, StartStep
from gpuportal.cli.app import Progress

from tests.sdk.conftest import Run


def _answer(steps: list[dict[str, object]], state: str = "ADMITTED") -> Job:
    return Job.from_api({"id": 7, "name": "train", "state": state, "start_progress": steps})


def _step(name: str, detail: str, at: str, ended: str | None = None) -> dict[str, object]:
    return {"step": name, "detail": detail, "started_at": at, "ended_at": ended, "expected_s": None}


def test_the_wait_display_prints_each_new_step_once_as_it_begins() -> None:
    out = io.StringIO()
    progress = Progress(lambda job: f"Job {job.id} {job.state}", lambda job: job.state, out)
    queued = _step("queued", "waiting for a worker to take the start", "2026-11-27T22:00:00Z")
    progress(_answer([queued]))
    building = _step("environment", "building the Python environment (x): usually 40 s", "2026-11-27T22:00:02Z")
    done_queued = {**queued, "ended_at": "2026-11-27T22:00:02Z"}
    progress(_answer([done_queued, building]))
    progress(_answer([done_queued, building]))  # nothing new: nothing printed
    starting = _step("starting", "starting the job's process", "2026-11-27T22:00:41Z")
    progress(_answer([done_queued, {**building, "ended_at": "2026-11-27T22:00:41Z"}, starting], "RUNNING"))
    lines = [line.strip() for line in out.getvalue().splitlines() if line.startswith("  ")]
    assert [re.sub(r"^\d\d:\d\d:\d\d ", "", line) for line in lines] == [
        "waiting for a worker: waiting for a worker to take the start",
        "environment: building the Python environment (x): usually 40 s",
        "starting: starting the job's process",
    ]


def test_gpuportal_wait_prints_the_steps_of_a_jobs_start_and_the_sdk_has_them(cli: Run, portal_client: Client) -> None:
    submitted = cli("submit", "-q", "--name", "steps", "--command", "true")
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout.strip())
    waited = cli("wait", str(job_id), "--timeout", "120")
    assert waited.returncode == 0, waited.stderr
    printed = re.findall(r"^  \d\d:\d\d:\d\d ([a-z ]+): ", waited.stderr, re.M)
    assert printed == ["waiting for a worker", "environment", "starting"], waited.stderr

    job = portal_client.jobs.get(job_id)
    assert [step.step for step in job.start_progress] == ["queued", "environment", "starting"]
    assert all(isinstance(step, StartStep) and step.took is not None for step in job.start_progress)
    seen: list[StartStep] = []
    job.wait(timeout=30, on_step=seen.append)
    assert [step.step for step in seen] == ["queued", "environment", "starting"]
