"""Admitting a workload where the scheduler placed it: the action a cycle calls for each admission."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.compute.actions import check_launch_instance
from apps.compute.models import Instance
from apps.inventory.actions import do_save_cluster
from apps.inventory.models import GPU, Cluster
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from apps.scheduling.actions import Admission, AdmittedDevice, AdmittedReplica, do_admit_workload
from tests.broker import own_queues, queued
from tests.personas import World


@pytest.fixture
def started(settings: Any) -> Iterator[Any]:
    """The start requests sent on commit, read back from the real broker: queues of this test's own."""
    assert settings.CELERY_BROKER_URL.startswith("redis://"), "the suite runs against Redis"
    settings.PORTAL_WORKLOAD_TRIGGER = "task"
    with own_queues(settings) as names:
        yield lambda: [(m["headers"]["task"], m["headers"]["argsrepr"]) for m in queued(*names)]


def queued_job(world: World, gpus: str = "2") -> Job:
    """A job in line; the cycle its submission asks for runs only on commit, which these tests never reach."""
    return check_submit_job(
        world.team_a,
        name="train",
        command="python train.py",
        gpu_type="h100",
        gpus_per_replica=Decimal(gpus),
        acting_user=world.alice,
    )


def on_local_gpus(*indexes: int, share: str = "1") -> Admission:
    """An admission of one replica on the local node's devices `indexes`."""
    cluster = Cluster.objects.get(name="local")
    gpus = {gpu.index: gpu for gpu in GPU.objects.filter(node__pool__cluster=cluster)}
    node = f"{gpus[indexes[0]].node_id}/h100"
    devices = tuple(AdmittedDevice(i, gpus[i].pk, Decimal(share)) for i in indexes)
    return Admission(cluster.pk, (AdmittedReplica(node, devices),), borrowed=Decimal("1"))


def held(row: Job | Instance) -> list[tuple[int, int, Decimal]]:
    return sorted(row.allocations.values_list("replica", "gpu__index", "fraction"))


def test_it_admits_a_queued_job_with_its_allocations_audit_event_and_start(
    world: World, started: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = queued_job(world)
    admission = on_local_gpus(2, 3)

    with django_capture_on_commit_callbacks(execute=True):
        assert do_admit_workload(job, admission) is True

    job.refresh_from_db()
    assert job.state == Job.State.ADMITTED
    assert job.cluster_id == admission.cluster_id and job.admitted_at is not None
    assert job.wait_reason == "" and job.cluster_queue_position is None
    assert held(job) == [(0, 2, Decimal("1")), (0, 3, Decimal("1"))]
    [event] = AuditEvent.objects.filter(action="job.admit", target_id=str(job.pk))
    assert event.workspace == world.team_a and event.actor is None
    assert event.data == {
        "placement": [{"node": admission.replicas[0].node, "devices": [[2, "1"], [3, "1"]]}],
        "borrowed": "1",
    }
    assert started() == [("portal.converge", f"('job', {job.pk})")]


def test_it_admits_a_queued_instance_and_asks_for_its_convergence(
    world: World, started: Any, django_capture_on_commit_callbacks: Any
) -> None:
    instance = check_launch_instance(world.team_a, name="box", profile=world.gpu_1, acting_user=world.alice)

    with django_capture_on_commit_callbacks(execute=True):
        assert do_admit_workload(instance, on_local_gpus(5, share="0.5")) is True

    instance.refresh_from_db()
    assert instance.state == Instance.State.PROVISIONING
    assert held(instance) == [(0, 5, Decimal("0.5"))]
    assert AuditEvent.objects.filter(action="instance.admit", target_id=str(instance.pk)).count() == 1
    assert started() == [("portal.converge", f"('instance', {instance.pk})")]


def test_it_does_not_admit_a_job_cancelled_since_the_snapshot(
    world: World, started: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = queued_job(world)
    do_cancel_job(Job.objects.get(pk=job.pk), acting_user=world.alice)

    with django_capture_on_commit_callbacks(execute=True):
        assert do_admit_workload(job, on_local_gpus(0, 1)) is False  # `job` still says QUEUED

    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED and job.admitted_at is None
    assert held(job) == []
    assert not AuditEvent.objects.filter(action="job.admit").exists()
    assert started() == []


def test_it_leaves_a_job_queued_with_the_reason_while_its_cluster_is_disabled(
    world: World, started: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = queued_job(world)
    admission = on_local_gpus(0, 1)
    do_save_cluster(Cluster.objects.get(name="local"), {"enabled": False}, acting_user=world.admin)

    with django_capture_on_commit_callbacks(execute=True):
        assert do_admit_workload(job, admission) is False

    job.refresh_from_db()
    assert job.state == Job.State.QUEUED and job.cluster_id is None
    assert job.wait_reason == "Cluster local is disabled: waiting until an admin enables it."
    assert held(job) == []
    assert not AuditEvent.objects.filter(action="job.admit").exists()
    assert started() == []
