"""The API of elastic node pools (/api/v1/pool-scaling/): admins make a pool elastic, change its limits
and make it static again, each change audited; limits the pool cannot keep are refused by field;
everyone else is refused, reads included; decisions are listed newest first, a page at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.elastic.models import PoolScaling, ScalingDecision
from apps.inventory.actions import do_save_cluster
from apps.inventory.models import GPU, Cluster, Node, NodePool
from tests.personas import World

pytestmark = pytest.mark.django_db
URL = "/api/v1/pool-scaling/"


@pytest.fixture
def pool() -> NodePool:
    """Cluster burst (Slurm): pool elastic of three nodes with 4 h100 each, all up."""
    burst = do_save_cluster(Cluster(), {"name": "burst", "kind": "slurm", "connection": {"partition": "elastic"}},
                            acting_user=None)  # fmt: skip
    pool = NodePool.objects.create(cluster=burst, name="elastic")
    for name in ("b1", "b2", "b3"):
        node = Node.objects.create(pool=pool, name=name, cpu_cores=64, memory_gb=512)
        GPU.objects.bulk_create(GPU(node=node, index=i, gpu_type="h100", model="H100") for i in range(4))
    return pool


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """An operator's program that starts and stops nodes (here it only says so)."""
    path = tmp_path / "scale.sh"
    path.write_text('#!/bin/sh\necho "$@"\n')
    path.chmod(0o755)
    return path


def made_elastic(pool: NodePool, **limits: Any) -> PoolScaling:
    return PoolScaling.objects.create(pool=pool, **{"min_nodes": 1, "max_nodes": 3, **limits})


def test_an_admin_makes_a_pool_elastic_changes_its_limits_and_makes_it_static_again(
    world: World, pool: NodePool, script: Path
) -> None:
    admin = world.client(world.admin)
    created = admin.post(URL, {"pool": pool.pk, "max_nodes": 2, "min_nodes": 1}, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert (body["id"], body["cluster"], body["pool_name"], body["provider"]) == (pool.pk, "burst", "elastic", "slurm")
    assert (body["scale_down_delay_s"], body["start_timeout_s"], body["budget_gpu_hours"]) == (600, 600, None)
    assert [(n["name"], n["state"]) for n in body["nodes"]] == [("b1", "ready"), ("b2", "ready"), ("b3", "ready")]
    assert AuditEvent.objects.filter(action="elastic.set", target_id=str(pool.pk)).count() == 1

    changed = admin.patch(f"{URL}{pool.pk}/", {"provider": "command", "command": str(script), "max_nodes": 3,
                                               "budget_gpu_hours": 500}, format="json")  # fmt: skip
    assert changed.status_code == 200, changed.json()
    scaling = PoolScaling.objects.get(pool=pool)
    assert (scaling.provider, scaling.command, scaling.min_nodes, scaling.max_nodes, scaling.budget_gpu_hours) == (
        "command", str(script), 1, 3, 500,
    )  # fmt: skip
    event = AuditEvent.objects.filter(action="elastic.set").latest("id")
    assert event.actor == world.admin and event.data["max_nodes"] == 3 and "min_nodes" not in event.data
    assert [row["id"] for row in admin.get(URL).json()["results"]] == [pool.pk]

    assert admin.delete(f"{URL}{pool.pk}/").status_code == 204
    assert not PoolScaling.objects.exists()
    assert AuditEvent.objects.filter(action="elastic.delete", target_id=str(pool.pk)).exists()
    assert admin.get(f"{URL}{pool.pk}/").status_code == 404


def test_it_keeps_the_scaling_of_a_pool_whose_nodes_are_not_all_up(world: World, pool: NodePool) -> None:
    made_elastic(pool)
    Node.objects.filter(name="b3").update(state=Node.State.POWERED_DOWN)
    response = world.client(world.admin).delete(f"{URL}{pool.pk}/")
    assert response.status_code == 409, response.json()
    assert "b3 (powered down)" in response.json()["error"]["message"]
    assert PoolScaling.objects.filter(pool=pool).exists()
    assert not AuditEvent.objects.filter(action="elastic.delete").exists()


def test_it_refuses_everyone_but_admins_reads_included(world: World, pool: NodePool) -> None:
    made_elastic(pool)
    ScalingDecision.objects.create(pool=pool, action="up", nodes=["b2"], reason="adding 1 node")
    other = NodePool.objects.create(cluster=pool.cluster, name="other")
    before = list(PoolScaling.objects.values())
    for persona in (world.alice, world.bob, world.victor):
        client = world.client(persona)
        for response in (
            client.get(URL),
            client.get(f"{URL}{pool.pk}/"),
            client.get(f"{URL}{pool.pk}/decisions/"),
            client.post(URL, {"pool": other.pk, "max_nodes": 1}, format="json"),
            client.patch(f"{URL}{pool.pk}/", {"max_nodes": 1}, format="json"),
            client.delete(f"{URL}{pool.pk}/"),
        ):
            assert response.status_code == 403, (persona, response.content[:300])
            assert response.json()["error"]["message"] == "Only platform admins can do this."
    assert list(PoolScaling.objects.values()) == before
    assert not AuditEvent.objects.filter(action__startswith="elastic.").exists()


BAD = [
    ({"min_nodes": 3, "max_nodes": 2}, "min_nodes", "The minimum (3) is above the maximum (2) of nodes."),
    ({"max_nodes": 4}, "max_nodes", "has 3 nodes in the inventory, and an elastic pool cannot start nodes it does not"),
    ({"max_nodes": 0}, "max_nodes", "greater than or equal to 1"),
    ({"start_timeout_s": 5}, "start_timeout_s", "greater than or equal to 10"),
    ({"start_timeout_s": 3601}, "start_timeout_s", "less than or equal to 3600"),
    ({"scale_down_delay_s": 7 * 86400 + 1}, "scale_down_delay_s", "less than or equal to 604800"),
    ({"scale_down_delay_s": -1}, "scale_down_delay_s", "greater than or equal to 0"),
    ({"provider": "command"}, "command", "needs the command's absolute path"),
    ({"provider": "command", "command": "scale.sh"}, "command", "is not an absolute path"),
    ({"provider": "command", "command": "/no/such/scale.sh"}, "command", "is not a file on the portal's host"),
    ({"provider": "command", "command": "{plain}"}, "command", "is not executable"),
    ({"provider": "cloud"}, "provider", "is not a valid choice"),
    ({"provider": "kubernetes"}, "provider", "start only a Kubernetes cluster's nodes, and burst is Slurm"),
    ({"budget_gpu_hours": -5}, "budget_gpu_hours", "greater than or equal to 0"),
]


@pytest.mark.parametrize(("change", "field", "says"), BAD, ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(BAD)])
def test_it_refuses_limits_the_pool_cannot_keep_by_field(
    world: World, pool: NodePool, tmp_path: Path, change: dict[str, Any], field: str, says: str
) -> None:
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\n")  # not executable
    change = {k: str(v).format(plain=plain) if isinstance(v, str) else v for k, v in change.items()}
    admin = world.client(world.admin)
    created = admin.post(URL, {"pool": pool.pk, "max_nodes": 2, **change}, format="json")
    assert created.status_code == 400, created.json()
    assert list(created.json()["error"]["fields"]) == [field]
    assert says in created.json()["error"]["fields"][field][0]
    assert not PoolScaling.objects.exists()

    made_elastic(pool, max_nodes=2)
    changed = admin.patch(f"{URL}{pool.pk}/", change, format="json")
    assert changed.status_code == 400 and list(changed.json()["error"]["fields"]) == [field], changed.json()
    assert PoolScaling.objects.get(pool=pool).max_nodes == 2
    assert not AuditEvent.objects.filter(action__startswith="elastic.").exists()


def test_it_refuses_slurms_power_saving_off_slurm_and_a_second_scaling_of_a_pool(world: World, pool: NodePool) -> None:
    admin = world.client(world.admin)
    local = NodePool.objects.get(cluster__name="local")
    response = admin.post(URL, {"pool": local.pk, "max_nodes": 1}, format="json")
    assert response.status_code == 400
    assert "scale it by command" in response.json()["error"]["fields"]["provider"][0]
    made_elastic(pool)
    again = admin.post(URL, {"pool": pool.pk, "max_nodes": 1}, format="json")
    assert again.status_code == 400 and "is elastic already" in again.json()["error"]["fields"]["pool"][0]
    missing = admin.post(URL, {"pool": 987654, "max_nodes": 1}, format="json")
    assert missing.status_code == 400 and list(missing.json()["error"]["fields"]) == ["pool"]


def test_it_lists_a_pools_decisions_newest_first_a_page_at_a_time(world: World, pool: NodePool) -> None:
    made_elastic(pool)
    for i in range(7):
        ScalingDecision.objects.create(pool=pool, action="up" if i % 2 else "down", nodes=[f"b{i % 3 + 1}"],
                                       reason=f"decision {i}", error="no capacity" if i == 6 else "")  # fmt: skip
    other = NodePool.objects.create(cluster=pool.cluster, name="other")
    ScalingDecision.objects.create(pool=other, action="up", nodes=["x"], reason="another pool's")
    admin = world.client(world.admin)
    first = admin.get(f"{URL}{pool.pk}/decisions/", {"page_size": 5}).json()
    assert first["count"] == 7
    assert [d["reason"] for d in first["results"]] == [f"decision {i}" for i in (6, 5, 4, 3, 2)]
    assert first["results"][0] | {"id": 0, "at": ""} == {
        "id": 0, "at": "", "action": "down", "nodes": ["b1"], "reason": "decision 6", "error": "no capacity",
    }  # fmt: skip
    second = admin.get(first["next"]).json()
    assert [d["reason"] for d in second["results"]] == ["decision 1", "decision 0"]
    assert admin.get(f"{URL}{other.pk}/decisions/").status_code == 404  # not elastic
