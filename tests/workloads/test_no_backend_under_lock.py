"""No backend call and no hashing of a workload's files while a transaction is open
(apps/workloads/host.py): a backend may wait on Slurm, Kubernetes or a process, and a row locked
across that wait would hold up every action on the workload and the scheduling cycle.

Every hook of the real local backend (and the artifact hasher) notes whether the database
connection of the thread calling it is inside a transaction. The database is a committed one
(``transaction=True``), so the test's own transaction does not count. Jobs and instances go
through every path the host has: a start, a start abandoned because its job was cancelled
meanwhile, a failed start, progress, an exit with artifacts, a stop, a restart in place, a delete.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from apps.compute.actions import check_launch_instance, do_delete_instance
from apps.compute.models import Instance
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from apps.workloads.host import converge, reconcile
from tests.personas import World
from workers.backends import files
from workers.backends.base import Backend, PolicyRefusal
from workers.backends.local import LocalBackend

pytestmark = pytest.mark.django_db(transaction=True)

#: Every hook of the backend contract a host path may call.
HOOKS = ("start", "adopt", "poll", "stop", "get_state", "load_state", "clear_state", "logs", "artifacts", "progress")


class Watch:
    """The backend hooks (and hashes) called while the calling thread's connection was in a transaction."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.in_transaction: list[str] = []

    def note(self, what: str) -> None:
        self.calls.append(what)
        if connection.in_atomic_block:
            self.in_transaction.append(what)


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch, settings: Any, tmp_path: Path) -> Iterator[Watch]:
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    watched = Watch()
    for hook in HOOKS:
        monkeypatch.setattr(LocalBackend, hook, _noting(watched, hook, getattr(LocalBackend, hook)))
    monkeypatch.setattr(files, "sha256_of_file", _noting(watched, "sha256", files.sha256_of_file))
    yield watched


def _noting(watched: Watch, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def noted(*args: Any, **kwargs: Any) -> Any:
        watched.note(name)
        return real(*args, **kwargs)

    return noted


def submit(world: World, name: str, command: str, **kwargs: Any) -> Job:
    job = check_submit_job(
        world.team_a, name=name, command=command, gpu_type="h100", gpus_per_replica=Decimal(1),
        acting_user=world.alice, **kwargs,
    )  # fmt: skip
    job.refresh_from_db()
    assert job.state == Job.State.ADMITTED, job.wait_reason
    return job


def reconciled(row: Any, done: Callable[[Any], bool], timeout_s: float = 30.0) -> Any:
    """Reconcile passes until ``done(row)`` holds of the row as stored."""
    deadline = time.monotonic() + timeout_s
    while True:
        reconcile(sweep=False)
        row.refresh_from_db()
        if done(row):
            return row
        assert time.monotonic() < deadline, f"{row} is {row.state}"
        time.sleep(0.1)


def test_a_job_runs_reports_progress_exits_and_is_stopped_with_no_backend_call_in_a_transaction(
    tx_world: World, watch: Watch
) -> None:
    script = "echo PROGRESS 0.5; sleep 1; mkdir -p out; echo done > out/result.txt"
    job = submit(tx_world, "runs", f"{script}; sleep 1", artifact_paths=["out"])
    assert converge("job", job.pk).state == Job.State.RUNNING

    job = reconciled(job, lambda j: j.progress == 0.5)
    job = reconciled(job, lambda j: j.state == Job.State.SUCCEEDED)
    assert [a.path for a in job.artifacts.all()] == ["out/result.txt"]  # hashed once it ended

    stopped = submit(tx_world, "stopped", "sleep 60")
    assert converge("job", stopped.pk).state == Job.State.RUNNING
    do_cancel_job(stopped, acting_user=tx_world.alice)
    assert converge("job", stopped.pk).backend_stopped

    assert {"start", "poll", "progress", "get_state", "stop", "artifacts", "sha256"} <= set(watch.calls)
    assert watch.in_transaction == []


def test_a_start_abandoned_or_refused_is_stopped_with_no_backend_call_in_a_transaction(
    tx_world: World, watch: Watch, monkeypatch: pytest.MonkeyPatch
) -> None:
    abandoned = submit(tx_world, "abandoned", "sleep 60")
    real_start = LocalBackend.start

    def cancelled_meanwhile(backend: Backend, spec: Any) -> Any:
        """The job is cancelled while its backend starts it (in the start's own thread and connection)."""
        endpoint = real_start(backend, spec)
        try:
            do_cancel_job(Job.objects.get(pk=abandoned.pk), acting_user=None)
        finally:
            connection.close()
        return endpoint

    monkeypatch.setattr(LocalBackend, "start", cancelled_meanwhile)
    converge("job", abandoned.pk)
    abandoned.refresh_from_db()
    assert abandoned.state == Job.State.CANCELLED and abandoned.backend_state is None
    assert watch.calls.count("stop") == 1 and "clear_state" in watch.calls  # what it started, stopped

    def refused(backend: Backend, spec: Any) -> Any:
        raise PolicyRefusal("not here")

    monkeypatch.setattr(LocalBackend, "start_job", refused)
    failed = converge("job", submit(tx_world, "refused", "true").pk)
    assert failed.state == Job.State.FAILED and failed.failure_reason == "not here"
    assert watch.in_transaction == []


def test_an_instance_restarts_in_place_and_is_deleted_with_no_backend_call_in_a_transaction(
    tx_world: World, watch: Watch
) -> None:
    world = tx_world
    instance = check_launch_instance(world.team_a, name="box", profile=world.cpu_small, acting_user=world.alice)
    instance = converge("instance", instance.pk)
    assert instance.state == Instance.State.RUNNING
    for replica in instance.backend_state["replicas"]:
        os.killpg(replica["pid"], 9)  # its processes die: reconcile starts it again in place
    instance = reconciled(instance, lambda i: i.restarts == 1 and i.backend_state is not None)
    assert instance.state == Instance.State.RUNNING

    do_delete_instance(instance, acting_user=world.alice)
    assert converge("instance", instance.pk).state == Instance.State.DELETED
    assert {"start", "poll", "stop", "clear_state"} <= set(watch.calls)
    assert watch.in_transaction == []
