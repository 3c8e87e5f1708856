"""A GPU provisioning request on a Kubernetes cluster, through the portal: approved on whole nodes,
its nodes labelled and tainted once it begins (by the scheduler loop's upkeep, through the official
client over HTTP to the API emulator of the backend's tests), the holder's job sent there, and the
nodes restored when it is released. No kube-apiserver runs here (docs/kubernetes.md)."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest

from apps.inventory.actions import do_save_cluster
from apps.inventory.models import GPU, Cluster, Node, NodePool
from apps.jobs.actions import check_submit_job
from apps.jobs.hosting import JobKind
from apps.jobs.models import Job
from apps.provisioning import actions, clusters
from apps.provisioning.models import ProvisioningRequest
from apps.scheduling.adapter import run_cycle
from apps.workspaces.models import GPUQuota
from tests.backends.kmock_cluster import Emulator, running_emulator
from tests.backends.test_kubernetes_reservations import GPU_TAINT, VersionedNodes, add_node, placement
from tests.personas import World

pytestmark = pytest.mark.django_db


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with running_emulator(VersionedNodes) as cluster:
        add_node(cluster, "gpu-1", taints=[GPU_TAINT])
        add_node(cluster, "gpu-2")
        yield cluster


def kubernetes_cluster(emulator: Emulator) -> Cluster:
    """Cluster k8s, two nodes of four h100 each, as discovery records them."""
    k8s = do_save_cluster(Cluster(), {"name": "k8s", "kind": "kubernetes", "connection": {"host": emulator.url}},
                          acting_user=None)  # fmt: skip
    pool = NodePool.objects.create(cluster=k8s, name="gpu")
    for name in ("gpu-1", "gpu-2"):
        node = Node.objects.create(pool=pool, name=name, cpu_cores=64, memory_gb=512)
        GPU.objects.bulk_create(GPU(node=node, index=i, gpu_type="h100", model="H100") for i in range(4))
    return k8s


def test_a_request_on_kubernetes_reserves_whole_nodes_its_job_tolerates_them_and_release_restores_them(
    world: World, emulator: Emulator
) -> None:
    k8s = kubernetes_cluster(emulator)
    before = placement(emulator, "gpu-1"), placement(emulator, "gpu-2")
    asked = actions.check_request(world.team_a, gpu_type="h100", gpus=3, duration_s=3600, cluster=k8s)
    gpr = actions.do_request(asked, priority=0, justification="on Kubernetes", acting_user=world.alice)
    assert gpr.state == ProvisioningRequest.State.APPROVED
    [reserved] = {gpu.node.name for gpu in gpr.devices.select_related("node")}
    assert gpr.devices.count() == 4  # a whole node: Kubernetes reserves nodes
    clusters.keep_up()  # approved, not begun: the nodes are left as they are
    assert (placement(emulator, "gpu-1"), placement(emulator, "gpu-2")) == before

    actions.upkeep()
    clusters.keep_up()
    labels, taints = placement(emulator, reserved)
    assert labels["gpuportal.io/reservation"] == f"gpr-{gpr.pk}"
    assert {"key": "gpuportal.io/reservation", "value": f"gpr-{gpr.pk}", "effect": "NoSchedule"} in (taints or [])
    other = "gpu-2" if reserved == "gpu-1" else "gpu-1"
    assert placement(emulator, other) == dict(zip(("gpu-1", "gpu-2"), before, strict=True))[other]

    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=Decimal("0"))  # only the reservation holds it
    job = check_submit_job(world.team_a, name="inside", command="true", gpu_type="h100", gpus_per_replica=Decimal(2),
                           requested_cluster=k8s, acting_user=world.alice)  # fmt: skip
    run_cycle()
    job.refresh_from_db()
    assert (job.state, job.reservation_id) == (Job.State.ADMITTED, gpr.pk)
    assert JobKind().spec(job).reservation == f"gpr-{gpr.pk}"  # its pods tolerate the taint and select the node

    actions.do_release(gpr, acting_user=world.alice)
    clusters.keep_up()
    assert (placement(emulator, "gpu-1"), placement(emulator, "gpu-2")) == before
    gpr.refresh_from_db()
    assert gpr.backend_synced is None and [e.kind for e in gpr.events.all()][-1] == "kubernetes"
