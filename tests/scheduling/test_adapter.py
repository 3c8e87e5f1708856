"""The adapter against the database: snapshot in, decisions written back in one transaction."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.models import Sum

from apps.audit.models import AuditEvent
from apps.compute.actions import check_launch_instance
from apps.compute.models import Instance
from apps.inventory.models import GPU, Allocation, Node
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from apps.scheduling import adapter, engine
from apps.scheduling.adapter import run_cycle
from apps.workspaces.models import Cohort, GPUQuota, Workspace
from tests.personas import World


def submit(world: World, gpus: str, replicas: int = 1, *, workspace: Workspace | None = None, **kwargs: Any) -> Job:
    """Queue a job as alice; tests run the cycle themselves."""
    return check_submit_job(
        workspace or world.team_a,
        name=kwargs.pop("name", "train"),
        command="python train.py",
        gpu_type="h100",
        gpus_per_replica=Decimal(gpus),
        replicas=replicas,
        acting_user=world.alice,
        **kwargs,
    )


def allocations(row: Job | Instance) -> list[tuple[int, int, Decimal]]:
    """(replica, GPU index, share) of each allocation the row holds."""
    return sorted(row.allocations.values_list("replica", "gpu__index", "fraction"))


def test_it_admits_queued_jobs_and_instances(world: World) -> None:
    job = submit(world, "2")
    instance = check_launch_instance(world.team_a, name="box", profile=world.gpu_1, acting_user=world.alice)

    result = run_cycle()

    assert sorted(result.admitted) == sorted([f"job:{job.pk}", f"instance:{instance.pk}"])
    job.refresh_from_db()
    instance.refresh_from_db()
    assert job.state == Job.State.ADMITTED
    assert instance.state == Instance.State.PROVISIONING
    for row in (job, instance):
        assert row.cluster is not None and row.cluster.name == "local"
        assert row.admitted_at is not None
        assert row.wait_reason == ""
        assert row.workspace_queue_position is None and row.cluster_queue_position is None
    assert [(r, share) for r, _, share in allocations(job)] == [(0, Decimal("1")), (0, Decimal("1"))]
    assert [(r, share) for r, _, share in allocations(instance)] == [(0, Decimal("1"))]
    held = [i for _, i, _ in allocations(job) + allocations(instance)]
    assert len(set(held)) == 3


def test_it_writes_the_allocations_of_the_placement_it_logs(world: World) -> None:
    job = submit(world, "2", replicas=2)

    run_cycle()

    [event] = AuditEvent.objects.filter(action="job.admit")
    assert (event.target_id, event.workspace, event.actor) == (str(job.pk), world.team_a, None)
    logged = [
        (replica, index, Decimal(share))
        for replica, placed in enumerate(event.data["placement"])
        for index, share in placed["devices"]
    ]
    assert allocations(job) == sorted(logged)
    assert sorted(r for r, _, _ in logged) == [0, 0, 1, 1]
    nodes = {placed["node"] for placed in event.data["placement"]}
    assert nodes == {f"{Node.objects.get().pk}/h100"}


def test_it_writes_one_audit_event_per_admission(world: World) -> None:
    jobs = [submit(world, "1", name=f"train-{i}") for i in range(3)]

    run_cycle()

    events = AuditEvent.objects.filter(action="job.admit")
    assert sorted(e.target_id for e in events) == sorted(str(j.pk) for j in jobs)
    run_cycle()
    assert AuditEvent.objects.filter(action="job.admit").count() == 3


def test_it_shares_one_device_between_fractional_jobs(world: World) -> None:
    first = submit(world, "0.5", name="half-1")
    second = submit(world, "0.25", name="quarter")

    run_cycle()

    [(_, first_gpu, first_share)] = allocations(first)
    [(_, second_gpu, second_share)] = allocations(second)
    assert first_gpu == second_gpu
    assert (first_share, second_share) == (Decimal("0.5"), Decimal("0.25"))


def test_it_tells_a_waiting_job_why_and_where_it_stands(world: World) -> None:
    world.team_b.gpu_quotas.update(gpus=8)
    submit(world, "4", name="big")
    waiting = submit(world, "1", name="small")
    other = submit(world, "4", replicas=2, workspace=world.team_b, name="gang")

    result = run_cycle()

    assert result.pending == 2
    waiting.refresh_from_db()
    other.refresh_from_db()
    assert waiting.state == Job.State.QUEUED
    assert waiting.wait_reason == "waiting for quota: 4 of 4 h100 in use in workspace team-a, this needs 1"
    assert other.wait_reason == "waiting for 2 nodes with 4 free h100"
    assert (waiting.cluster_queue_position, waiting.workspace_queue_position) == (1, 1)
    assert (other.cluster_queue_position, other.workspace_queue_position) == (2, 1)
    assert not waiting.allocations.exists() and not other.allocations.exists()


def test_it_names_the_cohort_a_workspace_would_borrow_from(world: World) -> None:
    lab = Cohort.objects.create(name="lab")
    Workspace.objects.filter(pk__in=[world.team_a.pk, world.team_b.pk]).update(cohort=lab)
    Workspace.objects.filter(pk=world.team_a.pk).update(can_borrow=True)
    submit(world, "1", workspace=world.team_b, name="lender-busy")
    waiting = submit(world, "8", name="too-big")

    run_cycle()

    waiting.refresh_from_db()
    assert waiting.wait_reason == (
        "waiting for quota: 0 of 4 h100 in use in workspace team-a, this needs 8; cohort lab has 3 idle to lend"
    )


def test_it_admits_a_waiting_job_once_room_is_freed(world: World) -> None:
    big = submit(world, "4", name="big")
    waiting = submit(world, "1", name="small")
    run_cycle()

    do_cancel_job(big, acting_user=world.alice)
    run_cycle()

    waiting.refresh_from_db()
    assert waiting.state == Job.State.ADMITTED
    assert waiting.wait_reason == ""
    assert waiting.workspace_queue_position is None and waiting.cluster_queue_position is None


def test_it_counts_running_workloads_in_the_next_cycle(world: World) -> None:
    for i in range(4):
        submit(world, "2", workspace=world.team_b if i % 2 else world.team_a, name=f"train-{i}")
    world.team_a.gpu_quotas.update(gpus=8)
    world.team_b.gpu_quotas.update(gpus=8)
    run_cycle()
    late = submit(world, "1", name="late")

    result = run_cycle()

    assert result.admitted == []
    late.refresh_from_db()
    assert late.wait_reason == "waiting for a node with 1 free h100"
    assert Allocation.objects.aggregate(total=Sum("fraction"))["total"] == Decimal("8")


def test_it_leaves_drained_nodes_alone(world: World) -> None:
    job = submit(world, "1")
    Node.objects.update(state=Node.State.DRAINED)

    run_cycle()

    job.refresh_from_db()
    assert job.state == Job.State.QUEUED
    assert job.wait_reason == "waiting for a node with 1 free h100"


def test_it_does_not_admit_a_job_cancelled_after_the_snapshot(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    job = submit(world, "1")
    decide = engine.schedule

    def cancel_then_decide(snapshot: engine.Snapshot) -> engine.Decisions:
        do_cancel_job(job, acting_user=world.alice)
        return decide(snapshot)

    monkeypatch.setattr(adapter.engine, "schedule", cancel_then_decide)

    result = run_cycle()

    assert result.admitted == []
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED
    assert job.admitted_at is None
    assert not Allocation.objects.exists()
    assert not AuditEvent.objects.filter(action="job.admit").exists()


def _run_in_threads(count: int, target: Any) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return errors


@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent writers need PostgreSQL")
def test_it_never_double_allocates_a_device_when_cycles_run_at_once(
    tx_world: World, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PORTAL_SCHEDULER_TRIGGER = "off"
    GPUQuota.objects.filter(workspace=tx_world.team_a).update(gpus=32)
    decide = engine.schedule

    def slow_decide(snapshot: engine.Snapshot) -> engine.Decisions:
        time.sleep(0.02)  # widens the window between snapshot and apply, where cycles could overlap
        return decide(snapshot)

    monkeypatch.setattr(adapter.engine, "schedule", slow_decide)

    def submit_and_schedule(thread: int) -> None:
        # Later jobs rank higher, so a cycle that saw one more job would place it first, on a device
        # that another cycle's snapshot still shows as free.
        for n in range(5):
            submit(tx_world, "0.5" if (thread + n) % 2 else "0.25", name=f"t{thread}-{n}", priority=n * 4 + thread)
            run_cycle()

    errors = _run_in_threads(4, submit_and_schedule)

    assert errors == []
    per_gpu: dict[int, Decimal] = defaultdict(Decimal)
    for gpu_id, share in Allocation.objects.values_list("gpu_id", "fraction"):
        per_gpu[gpu_id] += share
    assert per_gpu and max(per_gpu.values()) <= 1
    assert set(per_gpu) <= set(GPU.objects.values_list("pk", flat=True))
    admitted = Job.objects.filter(state=Job.State.ADMITTED)
    assert sum(job.total_gpus for job in admitted) == sum(per_gpu.values())
    assert all(job.allocations.aggregate(t=Sum("fraction"))["t"] == job.total_gpus for job in admitted)
