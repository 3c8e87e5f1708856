"""A workload's start holds no row lock while its backend works (apps/workloads/claims.py): while
one job's start hangs in its backend, other jobs are admitted and started, and the hanging one can
be cancelled at once; what its start made is stopped when it returns. A failed start is stopped and
cleared; a start that overruns the portal's timeout is stopped and its job requeued with backoff."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from apps.compute.actions import check_launch_instance
from apps.compute.models import Instance
from apps.inventory.models import Allocation
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from apps.workloads import host
from apps.workloads.host import converge
from tests.personas import World
from workers.backends.base import Backend, BackendError
from workers.backends.local import LocalBackend
from workers.backends.registry import backend_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def work(settings: Any, tmp_path: Path) -> Iterator[Path]:
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    yield settings.PORTAL_WORK_DIR


class Gate:
    """Holds the backend start of one job until let go; records the backends that were stopped."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, held_key: str) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()
        self.stopped: list[str] = []
        self.cleared: list[str] = []
        start, stop, clear = LocalBackend.start, LocalBackend.stop, LocalBackend.clear_state
        gate = self

        def gated_start(backend: Backend, spec: Any) -> Any:
            endpoint = start(backend, spec)
            if spec.key == held_key:
                gate.entered.set()
                assert gate.go.wait(30), "the test never let the start go"
            return endpoint

        def recorded_stop(backend: Backend, grace_s: float = 10.0) -> None:
            gate.stopped.append(str(backend.get_state().get("key", "")))
            stop(backend, grace_s)

        def recorded_clear(backend: Backend) -> None:
            gate.cleared.append("cleared")
            clear(backend)

        monkeypatch.setattr(LocalBackend, "start", gated_start)
        monkeypatch.setattr(LocalBackend, "stop", recorded_stop)
        monkeypatch.setattr(LocalBackend, "clear_state", recorded_clear)


def submit(world: World, name: str, command: str = "sleep 30") -> Job:
    job = check_submit_job(
        world.team_a, name=name, command=command, gpu_type="h100", gpus_per_replica=Decimal(1),
        acting_user=world.alice,
    )  # fmt: skip
    job.refresh_from_db()
    assert job.state == Job.State.ADMITTED, job.wait_reason  # the inline cycle admitted it
    return job


def in_thread(action: Any, *args: Any) -> Any:
    def run() -> Any:
        try:
            return action(*args)
        finally:
            connections.close_all()

    return ThreadPoolExecutor(max_workers=1).submit(run)


def test_a_hanging_start_holds_up_no_other_job_and_no_cancel(
    tx_world: World, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = tx_world
    slow = submit(world, "slow")
    gate = Gate(monkeypatch, f"job-{slow.pk}")
    hanging = in_thread(converge, "job", slow.pk)
    assert gate.entered.wait(20)  # its processes started; its backend call has not returned

    # Another job is admitted by a scheduling cycle and started, in this thread, meanwhile.
    quick = submit(world, "quick")
    started = converge("job", quick.pk)
    assert started is not None and started.state == Job.State.RUNNING

    # The hanging job is cancelled at once (a row lock across the start would block this call).
    cancelled = in_thread(lambda: do_cancel_job(Job.objects.get(pk=slow.pk), acting_user=None)).result(timeout=10)
    assert cancelled.state == Job.State.CANCELLED

    gate.go.set()
    hanging.result(timeout=30)
    slow.refresh_from_db()
    assert slow.state == Job.State.CANCELLED and slow.backend_state is None  # nothing recorded
    assert f"job-{slow.pk}" in gate.stopped and gate.cleared  # what its start made was stopped
    do_cancel_job(Job.objects.get(pk=quick.pk), acting_user=None)
    converge("job", quick.pk)


def test_a_failed_start_is_stopped_and_cleared(tx_world: World, work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    world = tx_world
    job = submit(world, "broken")
    gate = Gate(monkeypatch, "none")

    def failing_start(backend: Backend, spec: Any) -> Any:
        raise BackendError("the node refused the job", permanent=True)

    monkeypatch.setattr(LocalBackend, "start_job", failing_start)
    converge("job", job.pk)
    job.refresh_from_db()
    assert job.state == Job.State.FAILED and "the node refused the job" in job.failure_reason
    assert gate.stopped and gate.cleared
    assert job.start_claim is None and not job.allocations.exists()


def test_a_start_that_overruns_its_timeout_is_stopped_and_requeued(
    tx_world: World, work: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = tx_world
    settings.PORTAL_GANG_READY_TIMEOUT_S = 1
    job = submit(world, "late")
    gate = Gate(monkeypatch, f"job-{job.pk}")
    try:
        converge("job", job.pk)
        job.refresh_from_db()
        assert job.state == Job.State.QUEUED and job.cluster is None
        assert "backoff" in job.wait_reason  # the cycle after the requeue explains the wait
        assert job.eligible_at is not None and job.unready_requeues == 1
        assert job.start_claim is None and not job.allocations.exists()
        assert f"job-{job.pk}" in gate.stopped and gate.cleared
    finally:
        gate.go.set()


def test_an_instance_start_that_overruns_its_timeout_fails_it(
    tx_world: World, work: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each kind says what an overrun means: a job goes back in line (above), an instance fails."""
    world = tx_world
    settings.PORTAL_INSTANCE_START_TIMEOUT_S = 1
    instance = check_launch_instance(world.team_a, name="late-box", profile=world.cpu_small, acting_user=world.alice)
    instance.refresh_from_db()
    assert instance.state == Instance.State.PROVISIONING  # admitted by the inline cycle
    gate = Gate(monkeypatch, f"instance-{instance.pk}")
    try:
        converge("instance", instance.pk)
        instance.refresh_from_db()
        assert instance.state == Instance.State.FAILED and "did not start within 1 s" in instance.failure_reason
        assert instance.backend_state is None and instance.start_claim is None
        assert not Allocation.objects.filter(workload=instance).exists()
        assert f"instance-{instance.pk}" in gate.stopped and gate.cleared
    finally:
        gate.go.set()


def test_a_start_lost_with_its_worker_is_taken_over_and_not_run_twice(
    tx_world: World, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker died between its backend starting a job and the portal recording it: the next
    start takes the stale claim over and adopts what runs under the job's key, so its body runs
    once (a marker file counts the runs)."""
    world = tx_world
    marker = work / world.team_a.name / "runs"  # the workspace's directory: the job may write there
    job = submit(world, "once", command=f"echo ran >> {marker}; sleep 2")
    kind = host.kind_of("job")
    # The lost start: claimed by a process of this host that died, its backend started, nothing recorded.
    Job.objects.filter(pk=job.pk).update(
        start_claim={"token": "lost", "at": time.time(), "host": socket.gethostname(), "pid": _dead_pid()}
    )
    row = Job.objects.select_related("workspace", "cluster").get(pk=job.pk)
    lost = backend_for(row.cluster)  # as the dead worker built it
    lost.start(kind.spec(row))
    first = [r["pid"] for r in lost.get_state()["replicas"]]

    started = converge("job", job.pk)
    assert started is not None and started.state == Job.State.RUNNING
    assert [r["pid"] for r in started.backend_state["replicas"]] == first  # adopted, not started again
    deadline = time.monotonic() + 30
    while Job.objects.get(pk=job.pk).state == Job.State.RUNNING:
        assert time.monotonic() < deadline
        converge("job", job.pk)
        time.sleep(0.2)
    assert Job.objects.get(pk=job.pk).state == Job.State.SUCCEEDED
    assert marker.read_text() == "ran\n"


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid
