"""Discovering a Kubernetes cluster through the backend contract (``nodes()`` and ``discover()``), by API.

No kube-apiserver runs here: the backend talks over HTTP to the API emulator of the backend's own tests
(tests/backends/kmock_cluster.py), where the tests write the nodes as the kubelet would. Slurm's
discovery runs against the real Slurm in tests/slurm/test_register.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.inventory.models import Node, NodePool
from tests.backends.kmock_cluster import Emulator, running_emulator
from tests.personas import World


@pytest.fixture
def cluster() -> Iterator[Emulator]:
    with running_emulator() as emulator:
        yield emulator


def add_node(
    cluster: Emulator, name: str, cpu: str, memory: str, *, gpus: str = "", product: str = "", ready: bool = True,
    cordoned: bool = False,
) -> None:  # fmt: skip
    """A node as the kubelet reports it (and NVIDIA's device plugin and GPU feature discovery label it)."""
    allocatable = {"cpu": cpu, "memory": memory} | ({"nvidia.com/gpu": gpus} if gpus else {})
    status = {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    labels = {"nvidia.com/gpu.product": product} if product else {}
    node = {"metadata": {"name": name, "labels": labels}, "spec": {"unschedulable": cordoned}, "status": status}
    cluster.post("/api/v1/nodes", node)


def inventory(name: str) -> dict[str, tuple[int, int, str, list[tuple[int, str, str]]]]:
    nodes = Node.objects.filter(pool__cluster__name=name).prefetch_related("gpus")
    return {
        n.name: (n.cpu_cores, n.memory_gb, n.state, [(g.index, g.gpu_type, g.model) for g in n.gpus.all()])
        for n in nodes
    }


def register(world: World, connection: dict[str, Any]) -> Any:
    admin = world.client(world.admin)
    body = {"name": "k8s", "kind": "kubernetes", "connection": connection}
    assert admin.post("/api/v1/clusters/", body, format="json").status_code == 201
    return admin


def test_an_admin_discovers_a_kubernetes_clusters_nodes_and_gpus(world: World, cluster: Emulator) -> None:
    add_node(cluster, "gpu-a", "32", "131072Mi", gpus="2", product="NVIDIA-H100-80GB-HBM3")
    add_node(cluster, "gpu-b", "7800m", "64Gi", gpus="1", product="Tesla-T4", cordoned=True)
    add_node(cluster, "cpu-c", "4", "16Gi", ready=False)
    admin = register(world, {"host": cluster.url})

    response = admin.post("/api/v1/clusters/k8s/discover/")

    assert response.status_code == 200, response.json()
    assert (response.json()["nodes"], response.json()["gpus"]) == (3, 3)
    assert inventory("k8s") == {
        "gpu-a": (32, 128, "ready", [(0, "h100", "NVIDIA H100 80GB HBM3"), (1, "h100", "NVIDIA H100 80GB HBM3")]),
        "gpu-b": (7, 64, "drained", [(0, "t4", "Tesla T4")]),
        "cpu-c": (4, 16, "down", []),
    }
    assert list(NodePool.objects.filter(cluster__name="k8s").values_list("name", flat=True)) == ["default"]
    event = AuditEvent.objects.filter(action="cluster.discover").latest("pk")
    assert event.data == {"nodes": 3, "gpus": 3, "created": False}


def test_a_kubernetes_cluster_that_does_not_answer_is_unavailable_and_keeps_its_inventory(world: World) -> None:
    admin = register(world, {"host": "http://127.0.0.1:9", "request_timeout_s": 2})

    response = admin.post("/api/v1/clusters/k8s/discover/")

    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "cluster_unavailable"
    assert error["message"].startswith(
        "Could not reach Kubernetes cluster k8s: the Kubernetes API could not be reached"
    )
    assert not Node.objects.filter(pool__cluster__name="k8s").exists()


def test_connection_settings_the_backend_refuses_are_named(world: World) -> None:
    admin = register(world, {"host": "http://127.0.0.1:9", "namspace_prefix": "lab"})

    response = admin.post("/api/v1/clusters/k8s/discover/")

    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {
        "connection": ["unknown Kubernetes connection settings: namspace_prefix"]
    }
