"""Admitted jobs run for real on the local backend: start, logs, artifacts, exit, cancel, preemption."""

from __future__ import annotations

import hashlib
import os
import time
from decimal import Decimal
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.jobs.actions import check_submit_job, do_cancel_job, do_preempt_job
from apps.jobs.models import Job
from apps.scheduling.adapter import run_cycle
from apps.workloads.host import converge, reconcile
from tests.personas import World


@pytest.fixture
def run(settings: Any, django_capture_on_commit_callbacks: Any, tmp_path: Any) -> Any:
    """Submit a job and let the scheduler admit it and the worker start it, all in-process."""
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"
    settings.PORTAL_WORK_DIR = tmp_path / "work"

    def submit(world: World, command: str, **kwargs: Any) -> Job:
        kwargs.setdefault("gpu_type", "h100")
        kwargs.setdefault("gpus_per_replica", Decimal("1"))
        with django_capture_on_commit_callbacks(execute=True):
            job = check_submit_job(world.team_a, name="job", command=command, acting_user=world.alice, **kwargs)
        job.refresh_from_db()
        return job

    return submit


def settle(job: Job, *states: str, timeout_s: float = 20.0) -> Job:
    """Reconcile the job until it reaches one of `states`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        converge("job", job.pk)
        job.refresh_from_db()
        if job.state in states:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job.pk} is {job.state}, not {states}")


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(") ")[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            continue
    return alive


def test_it_runs_a_gang_on_its_gpus_and_keeps_logs_and_artifacts(world: World, run: Any) -> None:
    script = 'echo "rank=$RANK of $WORLD_SIZE devices=$CUDA_VISIBLE_DEVICES"; mkdir -p out; '
    script += "echo hello-$RANK > out/result-$RANK.txt; echo PROGRESS 1.0"
    job = run(world, script, replicas=2, artifact_paths=["out"])
    assert job.state == Job.State.RUNNING and job.attempts == 1

    job = settle(job, Job.State.SUCCEEDED)

    assert job.exit_code == 0 and job.progress == 1.0
    placement = AuditEvent.objects.get(action="job.admit", target_id=str(job.pk)).data["placement"]
    devices = {r: ",".join(str(d[0]) for d in replica["devices"]) for r, replica in enumerate(placement)}
    client = world.client(world.bob)
    for replica in (0, 1):
        log = client.get(f"/api/v1/jobs/{job.pk}/logs/", {"replica": replica}).json()
        assert log["text"] == f"rank={replica} of 2 devices={devices[replica]}\nPROGRESS 1.0\n"
    artifacts = {a["path"]: a for a in client.get(f"/api/v1/jobs/{job.pk}/").json()["artifacts"]}
    assert artifacts["out/result-1.txt"]["sha256"] == hashlib.sha256(b"hello-1\n").hexdigest()
    download = client.get(f"/api/v1/jobs/{job.pk}/artifact/", {"path": "out/result-1.txt"})
    assert download["Content-Type"] == "application/octet-stream"  # as the schema says, whatever the file
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"hello-1\n"
    assert client.get(f"/api/v1/jobs/{job.pk}/artifact/", {"path": "../../etc/passwd"}).status_code == 404
    assert not job.allocations.exists()


@pytest.mark.parametrize(("script", "state", "progress"), [
    ("echo PROGRESS 0.8", Job.State.SUCCEEDED, 1.0),  # done is all of it
    ("echo PROGRESS 0.8; exit 3", Job.State.FAILED, 0.8),  # how far a failed job got
])  # fmt: skip
def test_a_finished_job_shows_how_far_it_got(world: World, run: Any, script: str, state: str, progress: float) -> None:
    job = settle(run(world, script), state)
    assert job.progress == progress
    assert world.client(world.alice).get(f"/api/v1/jobs/{job.pk}/").json()["progress"] == progress


def test_it_follows_a_log_while_the_job_runs(world: World, run: Any) -> None:
    job = run(world, "echo one; sleep 30")
    client = world.client(world.alice)
    deadline = time.monotonic() + 10
    log = {"text": "", "offset": 0}
    while "one" not in log["text"] and time.monotonic() < deadline:
        log = client.get(f"/api/v1/jobs/{job.pk}/logs/").json()
        time.sleep(0.1)
    assert log == {"replica": 0, "offset": 4, "text": "one\n", "state": "RUNNING"}
    assert client.get(f"/api/v1/jobs/{job.pk}/logs/", {"offset": 4}).json()["text"] == ""
    assert client.get(f"/api/v1/jobs/{job.pk}/logs/", {"replica": 3}).status_code == 400
    do_cancel_job(job, acting_user=world.alice)
    settle(job, Job.State.CANCELLED)


def test_it_records_a_failure_with_its_exit_code(world: World, run: Any) -> None:
    job = settle(run(world, "echo broken >&2; exit 3"), Job.State.FAILED)
    assert job.exit_code == 3
    assert job.attempt_set.get().outcome == "failed"


def test_cancel_stops_every_process_of_a_running_job(
    world: World, run: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = run(world, "sleep 100 & sleep 100; wait")
    pids = [r["pid"] for r in job.backend_state["replicas"]]
    assert _alive(pids)

    with django_capture_on_commit_callbacks(execute=True):
        do_cancel_job(job, acting_user=world.alice)

    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED and job.backend_stopped is True
    assert _alive(pids) == []
    leftovers = [p for p in os.listdir("/proc") if p.isdigit() and _is_in(int(p), job.backend_state["job_dir"])]
    assert leftovers == []


def _is_in(pid: int, directory: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/cwd").startswith(directory)
    except OSError:
        return False


def test_a_preempted_running_job_is_stopped_and_requeued(
    world: World, run: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = run(world, "sleep 100", checkpointable=True)
    pids = [r["pid"] for r in job.backend_state["replicas"]]

    with django_capture_on_commit_callbacks(execute=True):
        do_preempt_job(job, reason="preempted for a test", grace_s=1.0)

    job.refresh_from_db()
    assert _alive(pids) == []
    # Requeued, and with its GPUs free again admitted and started anew: a second attempt.
    assert [(a.number, a.outcome) for a in job.attempt_set.all()] == [(1, "preempted"), (2, "")]
    assert job.state == Job.State.RUNNING and job.attempts == 2
    with django_capture_on_commit_callbacks(execute=True):
        do_cancel_job(job, acting_user=world.alice)


def test_reconcile_starts_a_job_whose_start_was_lost(world: World, settings: Any, tmp_path: Any) -> None:
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    settings.PORTAL_START_LOST_AFTER_S = 1
    job = check_submit_job(world.team_a, name="lost", command="true", acting_user=world.alice)
    run_cycle()  # admitted; the worker never heard of it (the trigger is off)
    Job.objects.filter(pk=job.pk).update(admitted_at=job.created_at.replace(year=2000))

    assert reconcile(sweep=False)["converged"] == 1
    settle(job, Job.State.SUCCEEDED)
