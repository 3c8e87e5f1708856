"""Elastic pools on Kubernetes, end to end through the API emulator (tests/backends/kmock_cluster.py): the
portal's autoscaler asks the cluster autoscaler for nodes with a ProvisioningRequest and its PodTemplate, sent
with the official client over HTTP. No kube-apiserver or cluster autoscaler runs here: the test plays the cluster
autoscaler's part (it writes the request's conditions, adds Ready nodes with the pool's label, removes cordoned
ones), and the objects are checked against the Kubernetes 1.37 schemas and the request's published CRD schema."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from django.utils import timezone

from apps.elastic import scaling
from apps.elastic.actions import Limits, check_limits
from apps.elastic.models import PoolScaling, ScalingDecision
from apps.errors import ActionError
from apps.inventory.actions import do_save_cluster
from apps.inventory.models import GPU, Allocation, Cluster, Node, NodePool
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from apps.scheduling.adapter import run_cycle
from apps.workspaces.models import GPUQuota
from tests.backends.kmock_cluster import Emulator, running_emulator
from tests.elastic.provisioning_request_schema import SCHEMA
from tests.personas import World
from workers.backends import kubernetes_provisioning as kp

pytestmark = pytest.mark.django_db

K8S_VERSION = "1.37.0"
REQUESTS = f"/apis/{kp.GROUP}/{kp.VERSION}/namespaces/{kp.NAMESPACE}/{kp.PLURAL}"
TEMPLATES = f"/api/v1/namespaces/{kp.NAMESPACE}/podtemplates"
SLOTS = ("slot-1", "slot-2", "slot-3")


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with running_emulator() as cluster:
        yield cluster


def add_node(cluster: Emulator, name: str, pool: str = "gpu", ready: bool = True) -> None:
    labels = {"kubernetes.io/hostname": name, kp.POOL_LABEL: pool, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
              "allocatable": {"nvidia.com/gpu": "4", "cpu": "64", "memory": "512Gi"}}  # fmt: skip
    cluster.post("/api/v1/nodes", {"metadata": {"name": name, "labels": labels}, "spec": {}, "status": status})


def elastic_pool(emulator: Emulator) -> PoolScaling:
    """Cluster k8s, pool gpu: three slots powered down, 4 h100 each, for the cluster autoscaler's nodes; 0 to 3
    nodes (the node group's limits in the cluster autoscaler too)."""
    k8s = do_save_cluster(Cluster(), {"name": "k8s", "kind": "kubernetes", "connection": {"host": emulator.url}},
                          acting_user=None)  # fmt: skip
    pool = NodePool.objects.create(cluster=k8s, name="gpu")
    for name in SLOTS:
        node = Node.objects.create(pool=pool, name=name, cpu_cores=64, memory_gb=512, state=Node.State.POWERED_DOWN)
        GPU.objects.bulk_create(GPU(node=node, index=i, gpu_type="h100", model="H100") for i in range(4))
    return PoolScaling.objects.create(pool=pool, provider="kubernetes", min_nodes=0, max_nodes=3,
                                      scale_down_delay_s=600, start_timeout_s=900)  # fmt: skip


def gang(world: World, replicas: int) -> Job:
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=Decimal(16))
    return check_submit_job(world.team_a, name="gang", command="true", gpu_type="h100", gpus_per_replica=Decimal(4),
                            replicas=replicas, requested_cluster=Cluster.objects.get(name="k8s"),
                            acting_user=world.alice)  # fmt: skip


def states() -> dict[str, str]:
    return dict(Node.objects.filter(pool__name="gpu").values_list("name", "state"))


def requests(emulator: Emulator) -> list[dict[str, Any]]:
    return list((emulator.get(REQUESTS) or {}).get("items") or [])


def condition(kind: str, message: str, reason: str) -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": "2026-11-27T22:00:00Z"}  # fmt: skip


def test_a_gang_asks_the_cluster_autoscaler_for_nodes_runs_on_them_and_empty_nodes_are_given_back(
    world: World, emulator: Emulator
) -> None:
    elastic_pool(emulator)
    job = gang(world, 2)
    run_cycle()

    [change] = scaling.upkeep()
    assert change.reason == "adding 2 nodes (slot-1, slot-2) to h100 on k8s for 1 pending workload of team-a"
    [request] = requests(emulator)
    name = request["metadata"]["name"]
    assert name == "gp-k8s-gpu-1"
    assert request["spec"] == {
        "provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
        "podSets": [{"podTemplateRef": {"name": name}, "count": 2}],
        "parameters": {"ValidUntilSeconds": "900"},
    }
    template = emulator.get(f"{TEMPLATES}/{name}")
    assert template is not None
    pod = template["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}  # a whole node each
    assert pod["nodeSelector"] == {kp.POOL_LABEL: "gpu"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert states() == {"slot-1": "powering_up", "slot-2": "powering_up", "slot-3": "powered_down"}
    assert scaling.upkeep() == []  # nothing yet: not asked again
    assert len(requests(emulator)) == 1 and states()["slot-1"] == "powering_up"

    # The cluster autoscaler: the nodes are made, then the request is Provisioned.
    add_node(emulator, "gke-gpu-a1b2")
    add_node(emulator, "gke-gpu-c3d4", ready=False)  # still booting
    emulator.set_status(f"{REQUESTS}/{name}", {"conditions": [condition("Provisioned", "capacity is ready", "Done")]})
    scaling.upkeep()
    assert states() == {"slot-1": "ready", "slot-2": "powering_up", "slot-3": "powered_down"}
    run_cycle()
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED  # one node is still booting
    emulator.patch("/api/v1/nodes/gke-gpu-c3d4", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    scaling.upkeep()
    assert states()["slot-2"] == "ready"
    assert requests(emulator) == [] and emulator.get(f"{TEMPLATES}/{name}") is None  # it has served
    run_cycle()
    job.refresh_from_db()
    assert job.state == Job.State.ADMITTED
    placed = set(Allocation.objects.filter(workload=job).values_list("gpu__node__name", flat=True))
    assert placed == {"slot-1", "slot-2"}

    # Done: after the delay the slots' nodes are cordoned; the cluster autoscaler removes them.
    do_cancel_job(job, acting_user=world.alice)
    now = timezone.now()
    assert scaling.upkeep(now) == []
    [stop] = scaling.upkeep(now + timedelta(seconds=601))
    assert stop.action == "down"
    stopped = {n for n, state in states().items() if state == "powering_down"}
    assert stopped == {"slot-1", "slot-2"}
    for node_name in ("gke-gpu-a1b2", "gke-gpu-c3d4"):
        assert (emulator.get(f"/api/v1/nodes/{node_name}") or {})["spec"]["unschedulable"] is True
    emulator.delete("/api/v1/nodes/gke-gpu-a1b2")
    emulator.delete("/api/v1/nodes/gke-gpu-c3d4")
    scaling.upkeep(now + timedelta(seconds=700))
    assert set(states().values()) == {"powered_down"}
    assert PoolScaling.objects.get().provider_state["slots"] == {}


def test_a_failed_request_marks_its_nodes_failed_with_the_message_and_the_gang_is_not_placed_there(
    world: World, emulator: Emulator
) -> None:
    elastic_pool(emulator)
    job = gang(world, 2)
    scaling.upkeep()
    [request] = requests(emulator)
    name = request["metadata"]["name"]
    message = "Out of resources: GCE quota NVIDIA_H100_GPUS exceeded in us-central1"
    emulator.set_status(f"{REQUESTS}/{name}", {"conditions": [condition("Failed", message, "ScaleUpFailed")]})
    add_node(emulator, "gke-gpu-stray")  # a node of the pool's that no provisioned request accounts for
    scaling.upkeep()
    assert states() == {"slot-1": "failed", "slot-2": "failed", "slot-3": "powered_down"}
    failed = ScalingDecision.objects.filter(action="failed").order_by("id")
    assert [d.nodes for d in failed] == [["slot-1"], ["slot-2"]]
    assert all(f"Failed: {message}" in d.reason for d in failed)
    assert requests(emulator) == []  # withdrawn
    run_cycle()
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED
    assert not Allocation.objects.exists()

    # After the start timeout the slots are forgotten and may be asked for again, in a new request.
    later = timezone.now() + timedelta(seconds=901)
    [again] = scaling.upkeep(later)
    assert again.action == "up"
    assert [r["metadata"]["name"] for r in requests(emulator)] == ["gp-k8s-gpu-2"]


def test_the_objects_are_valid_against_the_schemas() -> None:
    shape = kp.NodeShape(pool="gpu", gpus=8)
    template = kp.pod_template("gp-k8s-gpu-1", shape)
    kubernetes_validate.validate(template, K8S_VERSION, strict=True)
    request = kp.provisioning_request("gp-k8s-gpu-1", shape, 3, valid_for_s=600)
    jsonschema.validate(request, SCHEMA)
    bad = {**request, "spec": {**request["spec"], "podSet": request["spec"]["podSets"]}}
    with pytest.raises(jsonschema.ValidationError):  # the schema is not vacuous
        jsonschema.validate(bad, SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**request, "spec": {**request["spec"], "podSets": []}}, SCHEMA)


def test_it_reads_the_requests_conditions() -> None:
    def with_conditions(*conditions: dict[str, Any]) -> dict[str, Any]:
        return {"status": {"conditions": list(conditions)}}

    assert kp.outcome(with_conditions()) == ("pending", "")
    assert kp.outcome(with_conditions(condition("Provisioned", "ok", "Done"))) == ("provisioned", "")
    revoked = with_conditions(condition("Provisioned", "ok", "Done"), condition("CapacityRevoked", "gone", "Revoked"))
    assert kp.outcome(revoked) == ("failed", "CapacityRevoked: gone")
    assert kp.outcome(with_conditions(condition("BookingExpired", "10 min", "Expired")))[0] == "failed"
    assert kp.outcome(None) == ("failed", "the ProvisioningRequest is gone")
    assert kp.request_name("K8s_East", "gpu", 12) == "gp-k8s-east-gpu-12"


def test_only_a_kubernetes_clusters_pool_scales_by_provisioning_request(world: World) -> None:
    slurm = do_save_cluster(Cluster(), {"name": "hpc", "kind": "slurm", "connection": {"partition": "gpu"}},
                            acting_user=None)  # fmt: skip
    pool = NodePool.objects.create(cluster=slurm, name="gpu")
    Node.objects.create(pool=pool, name="n1", cpu_cores=8, memory_gb=64)
    with pytest.raises(ActionError) as refused:
        check_limits(pool, Limits(max_nodes=1, provider="kubernetes"))
    assert refused.value.field == "provider"
