"""Node maintenance: a cordoned node takes no new work, a drain moves work off or waits it out, and
a node brought back takes work again; discovery never undoes a cordon; only admins may do it."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.compute.actions import check_launch_instance, do_delete_instance
from apps.inventory.actions import do_sync_local_cluster
from apps.inventory.discovery import parse_declared
from apps.inventory.maintenance import do_cordon_node, do_drain_node, do_uncordon_node, upkeep
from apps.inventory.models import Allocation, Node
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from apps.scheduling.adapter import run_cycle
from tests.jobs.test_running import _alive
from tests.personas import World


def submit(world: World, name: str, gpus: str = "1", **kwargs: Any) -> Job:
    job = check_submit_job(world.team_a, name=name, command="sleep 100", gpu_type="h100",
                           gpus_per_replica=Decimal(gpus), acting_user=world.alice, **kwargs)  # fmt: skip
    run_cycle()
    job.refresh_from_db()
    return job


def node() -> Node:
    return Node.objects.get()


def test_a_cordoned_node_takes_no_new_work_and_keeps_what_runs(world: World) -> None:
    running = submit(world, "running")
    assert running.state == Job.State.ADMITTED

    do_cordon_node(node(), reason="new fans", acting_user=world.admin)
    waiting = submit(world, "waiting")

    running.refresh_from_db()
    assert running.state == Job.State.ADMITTED and Allocation.objects.filter(workload=running).exists()
    assert waiting.state == Job.State.QUEUED
    assert "waiting for" in waiting.wait_reason
    assert (node().maintenance, node().maintenance_reason, node().cordoned_by) == ("cordoned", "new fans", world.admin)

    do_uncordon_node(node(), acting_user=world.admin)
    run_cycle()

    waiting.refresh_from_db()
    assert waiting.state == Job.State.ADMITTED and node().maintenance == ""
    events = AuditEvent.objects.filter(action__startswith="node.").order_by("pk")
    assert list(events.values_list("action", flat=True)) == ["node.cordon", "node.uncordon"]


def test_a_cordoned_node_is_not_freed_for_other_work_by_preemption(world: World, settings: Any) -> None:
    settings.PORTAL_PREEMPTION_MIN_RUNTIME_S = 0
    low = submit(world, "low", gpus="4", priority=-100)
    assert low.state == Job.State.ADMITTED
    do_cordon_node(node(), acting_user=world.admin)

    high = submit(world, "high", gpus="4", priority=100)

    low.refresh_from_db()
    assert high.state == Job.State.QUEUED and low.state == Job.State.ADMITTED


def test_discovery_does_not_undo_a_cordon(world: World) -> None:
    do_cordon_node(node(), reason="disk swap", acting_user=world.admin)

    do_sync_local_cluster(parse_declared("8xh100"))

    assert (node().state, node().maintenance, node().maintenance_reason) == (Node.State.READY, "cordoned", "disk swap")
    assert submit(world, "after").state == Job.State.QUEUED


@pytest.fixture
def started(settings: Any, tmp_path: Any, django_capture_on_commit_callbacks: Any) -> Any:
    """Jobs admitted start at once for real on the local backend."""
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    return django_capture_on_commit_callbacks


def test_a_drain_requeues_a_preemptible_job_after_its_grace_and_leaves_the_node_drained(
    world: World, started: Any
) -> None:
    with started(execute=True):
        job = submit(world, "train", checkpointable=True)
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING
    pids = [r["pid"] for r in job.backend_state["replicas"]]
    client = world.client(world.admin)

    with started(execute=True):
        response = client.post(f"/api/v1/nodes/{node().pk}/drain/", {"reason": "BIOS", "grace_s": 1}, format="json")

    assert response.status_code == 200, response.json()
    job.refresh_from_db()
    assert _alive(pids) == []
    assert job.state == Job.State.QUEUED and [a.outcome for a in job.attempt_set.all()] == ["preempted"]
    preempted = AuditEvent.objects.get(action="job.preempt").data
    assert "drained for maintenance: BIOS" in preempted["reason"] and preempted["grace_s"] == 1  # to checkpoint
    upkeep()
    shown = client.get(f"/api/v1/nodes/{node().pk}/").json()
    assert (shown["maintenance"], shown["maintenance_reason"]) == ("drained", "BIOS")
    assert not Allocation.objects.filter(gpu__node=node()).exists()

    with started(execute=True):
        response = client.post(f"/api/v1/nodes/{node().pk}/uncordon/")
        run_cycle()

    assert response.json()["maintenance"] == ""
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING and job.attempts == 2
    with started(execute=True):
        do_cancel_job(job, acting_user=world.alice)


def test_a_drain_waits_out_an_instance_and_work_not_preemptible(world: World) -> None:
    instance = check_launch_instance(world.team_a, name="box", profile=world.gpu_1, acting_user=world.alice)
    pinned = submit(world, "pinned", preemptible=False)
    run_cycle()
    instance.refresh_from_db()
    assert instance.state == instance.State.PROVISIONING and pinned.state == Job.State.ADMITTED

    do_drain_node(node(), reason="PSU", acting_user=world.admin)
    upkeep()

    instance.refresh_from_db()
    pinned.refresh_from_db()
    assert instance.state == instance.State.PROVISIONING and pinned.state == Job.State.ADMITTED
    assert node().maintenance == "draining"
    event = AuditEvent.objects.get(action="node.drain")
    assert event.data["evicted"] == []
    assert set(event.data["waited_out"]) == {f"instance:{instance.pk}", f"job:{pinned.pk}"}

    do_delete_instance(instance, acting_user=world.alice)
    do_cancel_job(pinned, acting_user=world.alice)
    upkeep()

    assert node().maintenance == "drained"
    assert AuditEvent.objects.filter(action="node.drained").count() == 1


def test_an_empty_node_is_drained_at_once(world: World) -> None:
    do_drain_node(node(), acting_user=world.admin)

    assert node().maintenance == "drained"


@pytest.mark.parametrize("persona", ["victor", "bob", "alice", "charlie"])
def test_only_admins_maintain_nodes(world: World, persona: str) -> None:
    client = world.client(getattr(world, persona))

    for verb in ("cordon", "drain", "uncordon"):
        response = client.post(f"/api/v1/nodes/{node().pk}/{verb}/", {"reason": "mine now"}, format="json")
        assert response.status_code == 403, response.json()
    assert node().maintenance == "" and not AuditEvent.objects.filter(action__startswith="node.").exists()
    assert world.client(world.admin).post("/api/v1/nodes/987654/cordon/").status_code == 404


def test_bad_input_is_refused_with_field_messages(world: World) -> None:
    client = world.client(world.admin)

    response = client.post(f"/api/v1/nodes/{node().pk}/drain/", {"grace_s": -1, "reason": "x" * 301}, format="json")

    assert response.status_code == 400
    assert set(response.json()["error"]["fields"]) == {"grace_s", "reason"}
    assert node().maintenance == ""
