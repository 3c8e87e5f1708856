"""A node's drain and an inference endpoint's replicas there: make before break. The replica serves
on while a replacement is placed on another node and loads its model; it stops once the replacement
serves, or at PORTAL_DRAIN_REPLACE_S if none does; an endpoint's minimum (not preemptible) is
replaced too, never waited out for ever. The scheduling and the autoscaler are the portal's own;
a replica's server answering is recorded as its worker records it (the servers themselves:
tests/inference/test_servers.py)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.inference import scaling
from apps.inference.actions import record_replica_ready
from apps.inference.models import Endpoint, Replica
from apps.inventory.maintenance import do_uncordon_node, upkeep
from apps.inventory.models import GPU, Allocation, Node
from apps.scheduling.adapter import run_cycle
from tests.inference.endpoints import cpu_profile, endpoint
from tests.mail import body_of, smtp_server
from tests.maintenance.test_windows import announce
from tests.personas import World


@pytest.fixture(autouse=True)
def work(settings: Any, tmp_path: Path) -> Path:
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    return settings.PORTAL_WORK_DIR


def _second_node() -> Node:
    first = Node.objects.get()
    second = Node.objects.create(pool=first.pool, name="node-2", cpu_cores=64, memory_gb=512)
    GPU.objects.bulk_create(GPU(node=second, index=i, gpu_type="h100", model="NVIDIA H100") for i in range(8))
    return second


def _serving(world: World) -> tuple[Endpoint, Replica, Node]:
    """An endpoint whose one replica (its minimum: not preemptible) serves on a GPU; its node."""
    made = endpoint(world.team_a, world.alice, cpu_profile("llama-gpu", gpu_type="h100", gpus=Decimal(1)),
                    min_replicas=1, max_replicas=1)  # fmt: skip
    run_cycle()
    replica = Replica.objects.get(endpoint=made)
    assert replica.state == "ADMITTED" and not replica.preemptible
    record_replica_ready(replica, target="127.0.0.1:1")
    return made, replica, _node_of(replica)


def _node_of(replica: Replica) -> Node:
    return Allocation.objects.select_related("gpu__node").get(workload=replica).gpu.node


def _drain(world: World, node: Node) -> dict[str, Any]:
    answer = world.client(world.admin).post(f"/api/v1/nodes/{node.pk}/drain/", {"reason": "PSU"}, format="json")
    assert answer.status_code == 200, answer.json()
    return answer.json()


def test_a_drain_starts_a_replicas_replacement_elsewhere_and_stops_it_once_the_replacement_serves(
    world: World,
) -> None:
    _second_node()
    made, old, drained = _serving(world)

    assert _drain(world, drained)["maintenance"] == "draining"

    old.refresh_from_db()
    assert old.state == "READY" and old.retiring_at is not None  # it serves on meanwhile
    assert AuditEvent.objects.get(action="node.drain").data["replaced"] == [str(old.workload_ptr)]
    scaling.upkeep()
    new = Replica.objects.exclude(pk=old.pk).get(endpoint=made)
    assert new.state == "QUEUED" and new.baseline  # the endpoint's minimum, in its class
    run_cycle()
    new.refresh_from_db()
    assert new.state == "ADMITTED" and _node_of(new) != drained
    scaling.upkeep()
    assert Replica.objects.get(pk=old.pk).state == "READY"  # the replacement does not serve yet
    page = world.client(world.alice).get(f"/api/v1/endpoints/{made.pk}/").json()
    shown = next(r for r in page["replicas"] if r["id"] == old.pk)
    assert shown["retiring_at"] and "drained for maintenance: PSU" in shown["retire_reason"]

    record_replica_ready(new, target="127.0.0.1:2")
    scaling.upkeep()

    old.refresh_from_db()
    assert old.state in ("PREEMPTED", "STOPPED")
    assert old.reason == f"preempted: node {drained.name} is drained for maintenance: PSU; its replacement serves"
    assert Replica.objects.get(pk=new.pk).state == "READY" and Endpoint.objects.get(pk=made.pk).state == "READY"
    Replica.objects.filter(pk=old.pk).update(state="STOPPED")  # its worker stops its server
    upkeep()
    assert Node.objects.get(pk=drained.pk).maintenance == "drained"


def test_a_replica_whose_replacement_cannot_start_is_stopped_at_the_deadline_so_the_drain_ends(
    world: World, settings: Any
) -> None:
    made, old, drained = _serving(world)  # one node: no room for a replacement
    _drain(world, drained)
    scaling.upkeep()
    run_cycle()
    new = Replica.objects.exclude(pk=old.pk).get(endpoint=made)
    assert new.state == "QUEUED" and "waiting for" in new.wait_reason
    scaling.upkeep()
    assert Replica.objects.get(pk=old.pk).state == "READY"

    Replica.objects.filter(pk=old.pk).update(
        retiring_at=timezone.now() - timedelta(seconds=settings.PORTAL_DRAIN_REPLACE_S + 1)
    )
    scaling.upkeep()

    old.refresh_from_db()
    assert old.state in ("PREEMPTED", "STOPPED")
    assert old.reason.endswith(f"no replacement served within {settings.PORTAL_DRAIN_REPLACE_S} s")
    assert not Allocation.objects.filter(gpu__node=drained).exists()


def test_a_node_back_before_the_replacement_serves_keeps_its_replica_and_the_replacement_goes(
    world: World,
) -> None:
    _second_node()
    made, old, drained = _serving(world)
    _drain(world, drained)
    scaling.upkeep()
    run_cycle()

    do_uncordon_node(drained, acting_user=world.admin)
    scaling.upkeep()

    old.refresh_from_db()
    assert old.state == "READY" and old.retiring_at is None
    new = Replica.objects.exclude(pk=old.pk).get(endpoint=made)
    assert new.state in ("STOPPED", "STOPPING") and new.reason == "scaled down"  # not serving yet: it goes


def test_a_window_tells_the_endpoints_owner_its_replica_is_replaced_not_stopped(
    world: World, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    made, replica, _ = _serving(world)
    with smtp_server() as box:
        for key, value in box.settings().items():
            setattr(settings, key, value)
        assert announce(world, django_capture_on_commit_callbacks).status_code == 201
        [mail] = box.wait_for(1)

    text = body_of(mail)
    assert f"#{replica.pk}" in text
    assert "replaced at the start: it serves on until its replacement on another node serves" in text
