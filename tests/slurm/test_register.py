"""Registering the real Slurm cluster: its nodes and GPUs from scontrol, by action, command and API."""

from __future__ import annotations

from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from apps.audit.models import AuditEvent
from apps.errors import ActionError
from apps.inventory.actions import do_discover_cluster, do_register_cluster
from apps.inventory.models import GPU, Allocation, Cluster, Node, NodePool
from apps.jobs.actions import check_submit_job
from tests.personas import World
from workers.backends.slurm import node_state

NODES = [f"node{i}" for i in range(1, 5)]


def inventory(cluster: str = "slurm") -> dict[str, tuple[int, int, str, list[tuple[int, str, str]]]]:
    """node -> (CPUs, GB, state, [(index, gpu type, model)])."""
    nodes = Node.objects.filter(pool__cluster__name=cluster).prefetch_related("gpus")
    return {
        n.name: (n.cpu_cores, n.memory_gb, n.state, [(g.index, g.gpu_type, g.model) for g in n.gpus.all()])
        for n in nodes
    }


H100 = [(i, "h100", "NVIDIA H100 80GB HBM3") for i in range(4)]
EXPECTED = {name: (8, 3, "ready", H100) for name in NODES}  # RealMemory=4000 MB: 3 whole GB


def test_it_registers_the_partitions_nodes_and_gpus_once(db: None) -> None:
    out = StringIO()
    call_command("register_cluster", "slurm", "--kind", "slurm", "--partition", "gpu", stdout=out)
    call_command("register_cluster", "slurm", stdout=out)  # again: a refresh, nothing duplicated

    cluster = Cluster.objects.get()
    assert (cluster.name, cluster.kind, cluster.is_default) == ("slurm", "slurm", True)
    assert cluster.connection == {"partition": "gpu"}
    assert cluster.discovered_at is not None
    assert list(NodePool.objects.values_list("name", flat=True)) == ["gpu"]
    assert inventory() == EXPECTED
    assert out.getvalue().splitlines()[:5] == [
        "slurm/node1: 4 GPUs (h100), 8 CPUs, 3 GB, ready",
        "slurm/node2: 4 GPUs (h100), 8 CPUs, 3 GB, ready",
        "slurm/node3: 4 GPUs (h100), 8 CPUs, 3 GB, ready",
        "slurm/node4: 4 GPUs (h100), 8 CPUs, 3 GB, ready",
        "cluster slurm (slurm, partition gpu): 4 nodes, 16 GPUs (the default cluster)",
    ]
    events = AuditEvent.objects.filter(target_id=str(cluster.pk)).order_by("pk")
    assert [(e.action, e.data.get("created")) for e in events] == [
        ("cluster.create", None),
        ("cluster.discover", True),
        ("cluster.discover", False),
    ]
    assert events.last().data == {"nodes": 4, "gpus": 16, "created": False}  # type: ignore[union-attr]


def test_it_leaves_the_local_cluster_the_default(world: World) -> None:
    cluster = do_register_cluster("slurm", kind="slurm", connection={}, acting_user=world.admin)

    assert (cluster.is_default, cluster.connection) == (False, {"partition": "gpu"})
    assert Cluster.objects.get(is_default=True).name == "local"


def test_it_fails_with_exit_status_1_and_writes_nothing_when_slurm_cannot_be_asked(db: None, monkeypatch: Any) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol

    with pytest.raises(CommandError) as info:
        call_command("register_cluster", "slurm", "--partition", "gpu")

    assert info.value.returncode == 1
    assert str(info.value) == (
        "Could not reach Slurm cluster slurm: could not run scontrol: [Errno 2] No such file or directory: 'scontrol'"
    )
    assert not Cluster.objects.exists() and not AuditEvent.objects.exists()


def test_it_names_the_partitions_slurm_has_when_the_asked_one_has_no_nodes(db: None) -> None:
    refused = r"^Slurm has no nodes in partition gpus \(its partitions: elastic, gpu\)\.$"
    with pytest.raises(CommandError, match=refused):
        call_command("register_cluster", "slurm", "--partition", "gpus")
    with pytest.raises(CommandError, match=r"^'Slurm_1': "):
        call_command("register_cluster", "Slurm_1")
    assert not Cluster.objects.exists()


def test_it_refuses_to_turn_a_cluster_into_another_kind(world: World) -> None:
    with pytest.raises(CommandError, match="^Cluster local is a local cluster, not slurm.$"):
        call_command("register_cluster", "local")
    with pytest.raises(ActionError, match="^This machine is the cluster 'local': sync_inventory discovers it.$"):
        do_register_cluster("here", kind="local", connection={})
    assert list(Cluster.objects.values_list("name", "kind")) == [("local", "local")]


def test_an_admin_discovers_a_slurm_cluster_registered_through_the_api(world: World, monkeypatch: Any) -> None:
    admin = world.client(world.admin)
    body = {"name": "hpc", "kind": "slurm", "connection": {"partition": "gpu"}}
    assert admin.post("/api/v1/clusters/", body, format="json").status_code == 201
    assert world.client(world.alice).post("/api/v1/clusters/hpc/discover/").status_code == 403

    response = admin.post("/api/v1/clusters/hpc/discover/")

    assert response.status_code == 200, response.json()
    assert (response.json()["nodes"], response.json()["gpus"]) == (4, 16)
    assert inventory("hpc") == EXPECTED
    assert admin.get("/api/v1/gpus/", {"node__pool__cluster__name": "hpc"}).json()["count"] == 16

    monkeypatch.setenv("PATH", "/nonexistent")
    response = admin.post("/api/v1/clusters/hpc/discover/")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "cluster_unavailable"
    assert response.json()["error"]["message"].startswith("Could not reach Slurm cluster hpc: could not run scontrol")
    assert inventory("hpc") == EXPECTED


def test_a_refresh_removes_vanished_nodes_unless_a_workload_holds_their_gpus(world: World) -> None:
    slurm = do_register_cluster("slurm", kind="slurm", connection={"partition": "gpu"}, acting_user=world.admin)
    pool = NodePool.objects.get(cluster=slurm)
    held, empty = Node.objects.create(pool=pool, name="node9"), Node.objects.create(pool=pool, name="node10")
    for node in (held, empty):
        for index in (0, 1):
            GPU.objects.create(node=node, index=index, gpu_type="h100", model="H100")
    job = check_submit_job(world.team_a, name="t", command="c", acting_user=world.alice)
    Allocation.objects.create(gpu=held.gpus.get(index=1), fraction=Decimal(1), workload=job)

    do_discover_cluster(slurm, acting_user=world.admin)

    assert inventory() == {**EXPECTED, "node9": (0, 0, "down", [(1, "h100", "H100")])}


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("IDLE", "ready"),
        ("MIXED", "ready"),
        ("ALLOCATED", "ready"),
        ("IDLE+DRAIN", "drained"),
        ("MIXED+DRAIN", "drained"),
        ("DOWN", "down"),
        ("DOWN*+DRAIN", "down"),
        ("IDLE*", "down"),
        ("IDLE+POWERED_DOWN", "down"),
        ("UNKNOWN", "down"),
    ],
)
def test_it_reads_slurm_node_states(state: str, expected: str) -> None:
    assert node_state(state) == expected
