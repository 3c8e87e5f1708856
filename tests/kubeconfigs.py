"""A running Kubernetes namespace instance with its token issued, on the API emulator of the backend's
own tests (tests/backends/kmock_cluster.py): the namespace and its token are really created and read back
through the backend, as the API and the instance page hand them out."""

from __future__ import annotations

import base64

from apps.compute.models import Instance
from apps.inventory.actions import do_save_cluster
from apps.inventory.models import Cluster
from tests.backends.kmock_cluster import Emulator
from tests.personas import World
from workers.backends.base import InstanceSpec
from workers.backends.registry import backend_for

TOKEN = "team-a-s3cret-token"
SERVER = "https://k8s.example.org:6443"


def running_namespace_instance(world: World, cluster: Emulator) -> Instance:
    """Team A's instance ``dev``, running as a namespace on ``cluster``, its token issued."""
    connection = {"host": cluster.url, "server_url": SERVER}
    k8s = do_save_cluster(Cluster(), {"name": "k8s", "kind": "kubernetes", "connection": connection}, acting_user=None)
    backend = backend_for(k8s)
    backend.start(
        InstanceSpec(key="instance-dev", workspace="team-a", name="dev", work_dir="/unused", kind="namespace")
    )
    namespace = backend.get_state()["namespace"]
    data = {"token": base64.b64encode(TOKEN.encode()).decode(), "ca.crt": base64.b64encode(b"PEM").decode()}
    cluster.patch(f"/api/v1/namespaces/{namespace}/secrets/gpuportal-user-token", {"data": data})
    return placed(world, "dev", k8s, backend.get_state())


def placed(world: World, name: str, cluster: Cluster | None, run: dict[str, object] | None = None) -> Instance:
    """A team A instance, running on ``cluster`` with the backend state ``run``; queued where there is none."""
    instance = Instance.objects.create(workspace=world.team_a, name=name, profile=world.cpu_small)
    if cluster is not None:
        running = {"state": Instance.State.RUNNING, "cluster": cluster, "backend_state": run or {}}
        Instance.objects.filter(pk=instance.pk).update(**running)
    return instance
