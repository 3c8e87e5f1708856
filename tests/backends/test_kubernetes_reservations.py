"""GPU reservations on Kubernetes: reserved nodes labelled and tainted, the holder's pods tolerating the taint.

No kube-apiserver can run here. The node changes go through the official client over HTTP to kmock's API
emulator, extended below with what the API server does that these tests need and kmock does not: every write of a
node gives it a new ``resourceVersion``, a patch naming an older one is refused with 409 Conflict, and a test can
have a controller write a node right after the portal read it. The pods placed on a reservation are validated
against the Kubernetes 1.37 schemas (strict), KubeRay's documented fields and the "restricted" profile. Never seen
here: a scheduler honouring the taint, nodeSelector or toleration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import attrs
import kmock
import kubernetes_validate
import pytest

from tests.backends import kuberay_fields
from tests.backends.kmock_cluster import Emulator, running_emulator
from tests.backends.test_kubernetes_isolation import pod_specs, restricted_violations
from workers.backends import BackendError, JobSpec
from workers.backends import kuberay_objects as kro
from workers.backends import kubernetes_inference as ki
from workers.backends import kubernetes_objects as ko
from workers.backends import kubernetes_reservations as kr
from workers.backends.kubernetes import KubernetesBackend, _workload_name

K8S_VERSION = "1.37.0"
SETTINGS = ko.KubeSettings(gpu_type_node_label="gpuportal.io/gpu", workspace_volume="gp-files-{workspace}")
GPR = kr.reservation_name(12)
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2026-11-27T12:00:00Z"}
CORDONED = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": "2026-11-27T12:00:00Z"}
OURS = {"key": "gpuportal.io/reservation", "value": GPR, "effect": "NoSchedule"}


# -- the API server's optimistic concurrency on nodes, over kmock ------------------------------------------------


@attrs.frozen
class Conflict(kmock.KubernetesError):
    status: int = 409
    reason: str = "Conflict"
    message: str = "the object has been modified; please apply your changes to the latest version and try again"


@attrs.define(kw_only=True)
class VersionedNodes(kmock.KubernetesEmulator):
    """kmock's emulator, with nodes versioned as the API server versions them.

    Every write of a node sets a new ``metadata.resourceVersion``. A patch whose body names a
    ``resourceVersion`` other than the node's is refused, 409 Conflict, and changes nothing. ``meanwhile[node]``
    holds what another writer (the node controller, an admin) does after each read of the node, in turn: a change
    merged into it, as if written between the portal's read and its patch, or None for nothing.
    """

    meanwhile: dict[str, list[dict[str, Any] | None]] = attrs.field(factory=dict)
    version: int = 0

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource is None or request.resource.plural != "nodes":
            return await super()._handle(request)
        if request.action in (kmock.action.CREATE, kmock.action.UPDATE):
            async with self._lock:
                self._check_version(request)
        response = await super()._handle(request)
        if request.action == kmock.action.FETCH and self.meanwhile.get(request.name or ""):
            async with self._lock:
                change = self.meanwhile[str(request.name)].pop(0)
                if change is None:
                    return response
                self.version += 1
                metadata = {**change.get("metadata", {}), "resourceVersion": str(self.version)}
                self.objects[request.resource, None, request.name].patch({**change, "metadata": metadata})
        return response

    def _check_version(self, request: kmock.Request) -> None:
        body = request.data if isinstance(request.data, dict) else {}
        if request.action == kmock.action.UPDATE and (request.resource, None, request.name) in self.objects:
            current = self.objects[request.resource, None, request.name].get("metadata", {}).get("resourceVersion")
            asked = body.get("metadata", {}).get("resourceVersion")
            if asked is not None and asked != current:
                raise Conflict()
        self.version += 1
        body.setdefault("metadata", {})["resourceVersion"] = str(self.version)


@pytest.fixture
def cluster() -> Iterator[Emulator]:
    with running_emulator(VersionedNodes) as emulator:
        add_node(emulator, "gpu-1", taints=[GPU_TAINT])
        add_node(emulator, "gpu-2")
        add_node(emulator, "gpu-3", taints=[GPU_TAINT])
        yield emulator


def add_node(cluster: Emulator, name: str, taints: list[dict[str, Any]] | None = None) -> None:
    labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    spec = {"taints": taints} if taints else {}
    cluster.post("/api/v1/nodes", {"metadata": {"name": name, "labels": labels}, "spec": spec})


def node(cluster: Emulator, name: str) -> dict[str, Any]:
    found = cluster.get(f"/api/v1/nodes/{name}")
    assert found is not None
    return found


def placement(cluster: Emulator, name: str) -> tuple[dict[str, str], list[dict[str, Any]] | None]:
    """A node's labels and taints: what a reservation changes."""
    found = node(cluster, name)
    return found["metadata"]["labels"], found.get("spec", {}).get("taints")


def patches(cluster: Emulator, name: str) -> int:
    return cluster.requests_to("patch", f"/api/v1/nodes/{name}")


def backend(cluster: Emulator) -> KubernetesBackend:
    return KubernetesBackend(settings=SETTINGS, host=cluster.url, poll_interval_s=0.01, start_timeout_s=1.0)


def test_the_emulator_refuses_a_patch_of_a_node_that_changed_since_it_was_read(cluster: Emulator) -> None:
    # What the tests below rely on: without it, a lost update would pass unseen.
    version = node(cluster, "gpu-2")["metadata"]["resourceVersion"]
    cluster.patch("/api/v1/nodes/gpu-2", {"metadata": {"labels": {"a": "1"}, "resourceVersion": version}})
    with pytest.raises(Exception, match="409"):
        cluster.patch("/api/v1/nodes/gpu-2", {"metadata": {"labels": {"b": "2"}, "resourceVersion": version}})
    assert "b" not in node(cluster, "gpu-2")["metadata"]["labels"]


# -- the nodes ----------------------------------------------------------------------------------------------------


def test_it_names_a_gprs_reservation_after_the_gpr() -> None:
    assert kr.reservation_name(12) == "gpr-12"
    assert kr.check_reservation_name("gpr-12") == "gpr-12"
    for bad in ("", "gpr 12", "-gpr", "x" * 64, "gpr-12/"):
        with pytest.raises(BackendError) as refused:
            kr.check_reservation_name(bad)
        assert refused.value.permanent


def test_it_labels_and_taints_the_named_nodes_and_no_other(cluster: Emulator) -> None:
    k8s = backend(cluster)
    untouched = node(cluster, "gpu-3")
    labels_1, _ = placement(cluster, "gpu-1")
    assert kr.apply_reservation(k8s, GPR, nodes=["gpu-2", "gpu-1"]) == ["gpu-1", "gpu-2"]
    assert placement(cluster, "gpu-1") == (labels_1 | {"gpuportal.io/reservation": GPR}, [GPU_TAINT, OURS])
    assert placement(cluster, "gpu-2")[1] == [OURS]
    assert node(cluster, "gpu-3") == untouched and patches(cluster, "gpu-3") == 0
    assert kr.reserved_nodes(k8s) == {GPR: ["gpu-1", "gpu-2"]}


def test_removing_it_restores_the_nodes_and_keeps_what_others_added_meanwhile(cluster: Emulator) -> None:
    k8s = backend(cluster)
    before = {name: placement(cluster, name) for name in ("gpu-1", "gpu-2")}
    kr.apply_reservation(k8s, GPR, nodes=["gpu-1", "gpu-2"])
    assert kr.remove_reservation(k8s, GPR, nodes=["gpu-1", "gpu-2"]) == ["gpu-1", "gpu-2"]
    assert {name: placement(cluster, name) for name in ("gpu-1", "gpu-2")} == before
    # An admin cordons gpu-1 and labels it while it is reserved (kubectl sends the whole taint list back).
    kr.apply_reservation(k8s, GPR, nodes=["gpu-1"])
    cluster.patch(
        "/api/v1/nodes/gpu-1", {"metadata": {"labels": {"rack": "r7"}}, "spec": {"taints": [GPU_TAINT, OURS, CORDONED]}}
    )
    kr.remove_reservation(k8s, GPR, nodes=["gpu-1"])
    labels, taints = placement(cluster, "gpu-1")
    assert labels == before["gpu-1"][0] | {"rack": "r7"} and taints == [GPU_TAINT, CORDONED]
    assert kr.reserved_nodes(k8s) == {}


def test_applying_and_removing_again_changes_nothing(cluster: Emulator) -> None:
    k8s = backend(cluster)
    kr.apply_reservation(k8s, GPR, nodes=["gpu-1", "gpu-2"])
    applied = placement(cluster, "gpu-1"), placement(cluster, "gpu-2")
    assert kr.apply_reservation(k8s, GPR, nodes=["gpu-1", "gpu-2"]) == []
    assert (placement(cluster, "gpu-1"), placement(cluster, "gpu-2")) == applied
    assert patches(cluster, "gpu-1") == patches(cluster, "gpu-2") == 1
    assert kr.remove_reservation(k8s, GPR, nodes=["gpu-1", "gpu-2"]) == ["gpu-1", "gpu-2"]
    assert kr.remove_reservation(k8s, GPR, nodes=["gpu-1", "gpu-2"]) == []
    assert kr.remove_reservation(k8s, GPR) == []
    assert patches(cluster, "gpu-1") == patches(cluster, "gpu-2") == 2


def test_a_half_applied_reservation_is_completed_and_removed_by_either_mark(cluster: Emulator) -> None:
    # A node left with the label alone (or the taint alone) is still the reservation's.
    k8s = backend(cluster)
    cluster.patch("/api/v1/nodes/gpu-2", {"metadata": {"labels": {"gpuportal.io/reservation": GPR}}})
    cluster.patch("/api/v1/nodes/gpu-3", {"spec": {"taints": [GPU_TAINT, OURS]}})
    assert kr.reserved_nodes(k8s) == {GPR: ["gpu-2", "gpu-3"]}
    assert kr.apply_reservation(k8s, GPR, nodes=["gpu-2"]) == ["gpu-2"]
    assert placement(cluster, "gpu-2")[1] == [OURS]
    assert kr.remove_reservation(k8s, GPR) == ["gpu-2", "gpu-3"]
    assert placement(cluster, "gpu-2")[1] is None and placement(cluster, "gpu-3")[1] == [GPU_TAINT]
    assert "gpuportal.io/reservation" not in placement(cluster, "gpu-2")[0]


def test_a_taint_written_between_the_read_and_the_patch_is_kept(cluster: Emulator) -> None:
    k8s = backend(cluster)
    handler = cluster.handler
    assert isinstance(handler, VersionedNodes)
    # Read to check every node first, then read again to change it: the node controller taints it in between.
    handler.meanwhile["gpu-1"] = [None, {"spec": {"taints": [GPU_TAINT, UNREACHABLE]}}]
    assert kr.apply_reservation(k8s, GPR, nodes=["gpu-1"]) == ["gpu-1"]
    assert placement(cluster, "gpu-1")[1] == [GPU_TAINT, UNREACHABLE, OURS]
    assert patches(cluster, "gpu-1") == 2  # the first, made on what was read before the taint, was refused
    handler.meanwhile["gpu-1"] = [{"spec": {"taints": [GPU_TAINT, UNREACHABLE, OURS, CORDONED]}}]
    assert kr.remove_reservation(k8s, GPR, nodes=["gpu-1"]) == ["gpu-1"]
    assert placement(cluster, "gpu-1")[1] == [GPU_TAINT, UNREACHABLE, CORDONED]


def test_a_node_that_keeps_changing_is_a_transient_error(cluster: Emulator) -> None:
    handler = cluster.handler
    assert isinstance(handler, VersionedNodes)
    # Read once to check it, then once per attempt, each time followed by another writer's change.
    handler.meanwhile["gpu-2"] = [None] + [
        {"metadata": {"labels": {"beat": str(i)}}} for i in range(kr.CONFLICT_ATTEMPTS)
    ]
    with pytest.raises(BackendError) as failed:
        kr.apply_reservation(backend(cluster), GPR, nodes=["gpu-2"])
    assert not failed.value.permanent and "kept changing" in failed.value.message
    assert "gpuportal.io/reservation" not in placement(cluster, "gpu-2")[0]


def test_a_node_another_reservation_holds_is_not_taken_and_nothing_is_changed(cluster: Emulator) -> None:
    k8s = backend(cluster)
    kr.apply_reservation(k8s, "gpr-11", nodes=["gpu-2"])
    held = placement(cluster, "gpu-2")
    before = placement(cluster, "gpu-1")
    with pytest.raises(BackendError) as refused:
        kr.apply_reservation(k8s, GPR, nodes=["gpu-1", "gpu-2"])
    assert not refused.value.permanent and "gpr-11" in refused.value.message
    assert placement(cluster, "gpu-2") == held and placement(cluster, "gpu-1") == before
    assert kr.remove_reservation(k8s, GPR, nodes=["gpu-2"]) == []  # not its own: left alone
    assert placement(cluster, "gpu-2") == held
    # Once the first is removed, the next one takes the node.
    kr.remove_reservation(k8s, "gpr-11")
    assert kr.apply_reservation(k8s, GPR, nodes=["gpu-1", "gpu-2"]) == ["gpu-1", "gpu-2"]
    assert kr.reserved_nodes(k8s) == {GPR: ["gpu-1", "gpu-2"]}


def test_an_unknown_node_is_a_permanent_error_and_nothing_is_changed(cluster: Emulator) -> None:
    k8s = backend(cluster)
    before = placement(cluster, "gpu-1")
    for nodes in (["gpu-1", "gpu-9"], []):
        with pytest.raises(BackendError) as refused:
            kr.apply_reservation(k8s, GPR, nodes=nodes)
        assert refused.value.permanent
    assert placement(cluster, "gpu-1") == before and patches(cluster, "gpu-1") == 0
    assert kr.remove_reservation(k8s, GPR, nodes=["gpu-9"]) == []  # a node that is gone has nothing to remove


# -- the holder's pods --------------------------------------------------------------------------------------------


def job_spec(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "key": "job-7",
        "workspace": "vision",
        "name": "train",
        "command": "python train.py",
        "work_dir": "/unused",
        "image": "pytorch/pytorch:2.5.1",
        "replicas": 2,
        "devices": [["0", "1"], ["2", "3"]],
        "cpu_cores": 4,
        "memory_gb": 16,
    }
    return JobSpec(**(fields | overrides))


def submitted_job(cluster: Emulator, spec: JobSpec) -> dict[str, Any]:
    backend(cluster).submit(spec)
    namespace = ko.jobs_namespace_name("vision", SETTINGS)
    job = cluster.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{ko.job_name(_workload_name(spec.key))}")
    assert job is not None
    return job


def test_a_holders_job_tolerates_its_reservation_and_runs_only_on_its_nodes(cluster: Emulator) -> None:
    job = submitted_job(cluster, job_spec(reservation=GPR))
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpuportal.io/reservation": GPR}
    assert pod["tolerations"] == [
        {"key": "gpuportal.io/reservation", "operator": "Equal", "value": GPR, "effect": "NoSchedule"}
    ]
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    assert restricted_violations(pod) == []


def test_a_job_without_a_reservation_has_neither(cluster: Emulator) -> None:
    job = submitted_job(cluster, job_spec())
    pod = job["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "tolerations" not in pod


def test_a_reservation_that_cannot_be_a_label_value_is_refused(cluster: Emulator) -> None:
    with pytest.raises(BackendError) as refused:
        backend(cluster).submit(job_spec(reservation="GPR 12!"))
    assert refused.value.permanent
    assert (
        cluster.requests_to("post", f"/apis/batch/v1/namespaces/{ko.jobs_namespace_name('vision', SETTINGS)}/jobs") == 0
    )


def holders_manifests() -> list[tuple[str, dict[str, Any]]]:
    """Every kind of workload that has pods, of a GPU type (whose node label the pods select already)."""
    owner = ko.Owner("vision", "dev")
    size = ko.Size(8, 64, Decimal(2), "h100")
    gang = ko.GangJob(name="train", image="pytorch/pytorch:2.5.1", command="python train.py", size=size, replicas=2)
    serve = ki.ServeSpec(
        name="replica-1",
        endpoint="12",
        server="vllm",
        image="vllm/vllm-openai:v0.33.0",
        model="models/qwen-0.5b",
        served_name="qwen",
        size=size,
        api_key="gpk_" + "9f" * 24,
    )
    ray = kro.RaySpec(
        name="tune", image=kro.DEFAULT_RAY_IMAGE, head=ko.Size(2, 8), worker=size, workers=2, auth_token="t" * 32
    )
    ray_owner = kro.ray_owner("vision", SETTINGS)
    return [
        *[(f"job-{m['kind']}", m) for m in ko.job_objects(owner, gang, SETTINGS)],
        *[
            (f"notebook-{m['kind']}", m)
            for m in ko.notebook_objects(owner, "lab", image="img", size=size, token="t", settings=SETTINGS)
        ],
        *[
            (f"inference-{m['kind']}", m)
            for m in ki.replica_objects(ki.serve_owner("vision", SETTINGS), serve, SETTINGS)
        ],
        *[(f"ray-{m['kind']}", m) for m in kro.ray_objects(ray_owner, ray, SETTINGS)],
        *[
            (f"ray-job-{m['kind']}", m)
            for m in kro.ray_objects(ray_owner, dataclasses.replace(ray, entrypoint="python tune.py"), SETTINGS)
        ],
    ]


HOLDERS = holders_manifests()


@pytest.mark.parametrize("manifest", [m for _, m in HOLDERS], ids=[i for i, _ in HOLDERS])
def test_every_pod_of_every_kind_of_workload_is_placed_and_still_valid(manifest: dict[str, Any]) -> None:
    placed = kr.on_reservation(manifest, GPR)
    pods = [pod for _, pod in pod_specs(placed)]
    for pod, original in zip(pods, [pod for _, pod in pod_specs(manifest)], strict=True):
        assert pod["nodeSelector"] == {**original.get("nodeSelector", {}), "gpuportal.io/reservation": GPR}
        assert pod["tolerations"] == [kr.reservation_toleration(GPR)]
        assert restricted_violations(pod) == []
        assert "tolerations" not in original  # a copy: the builder's own manifest is unchanged
    if placed["kind"] in ("RayCluster", "RayJob"):
        assert kuberay_fields.problems(placed) == []
    else:
        kubernetes_validate.validate(placed, K8S_VERSION, strict=True)
    assert kr.on_reservation(placed, GPR) == placed  # placed twice: the same


def test_the_cases_above_have_pods_of_every_kind() -> None:
    kinds = {m["kind"] for _, m in HOLDERS if pod_specs(m)}
    assert kinds == {"Job", "StatefulSet", "Pod", "RayCluster", "RayJob"}
    gpu_selected = [
        pod for _, m in HOLDERS for _, pod in pod_specs(m) if "gpuportal.io/gpu" in pod.get("nodeSelector", {})
    ]
    assert gpu_selected  # the merge with a selector already there is exercised
