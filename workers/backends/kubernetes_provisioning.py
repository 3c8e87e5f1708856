"""Elastic node pools on Kubernetes: nodes asked of the cluster autoscaler with a ProvisioningRequest
(``autoscaling.x-k8s.io/v1``), as Kueue's ProvisioningRequest admission check asks for a workload's capacity
(docs/kubernetes.md, "Elastic node pools"; docs/provisioning.md).

One scale-up decision of the portal's autoscaler becomes one request: a PodTemplate with the shape of one of the
pool's nodes (a pod asking for all of a node's GPUs, selecting the pool's nodes by their label and tolerating the
GPU taint), and a ProvisioningRequest of class ``best-effort-atomic-scale-up.autoscaling.x-k8s.io`` for ``count``
such pods, one per node. The atomic class, not ``check-capacity``: the portal wants nodes made, all of the decision
or none (a gang needs them all), and ``check-capacity`` only says whether the capacity is there already. Its
``ValidUntilSeconds`` is the pool's start timeout, so the cluster autoscaler stops trying when the portal gives up.

The request's conditions drive the pool's nodes in the portal's inventory (its slots, ``Node`` rows named as the
operator declared them): ``Provisioned`` and nodes with the pool's label Ready make its slots up, each slot bound
to one Kubernetes node; ``Failed``, ``CapacityRevoked`` or ``BookingExpired`` before its nodes came make the slots
still waiting failed, with the condition's message as the reason. A request whose slots are all bound is deleted:
its booking has served, the nodes are the pool's now (Kueue deletes a request once its workload is admitted too).

Scale-down cordons the slot's node (no new pod goes there) and forgets the binding once the node is gone. The
Node object is not deleted: the VM behind it is the cloud's, and its kubelet would register it again. The cluster
autoscaler removes an empty node itself, after its ``--scale-down-unneeded-time`` (10 min by default); the slot is
powering down until then.

Builders are pure. The calls go through a ``KubernetesBackend`` (its credentials, timeouts and error mapping, as
``kubernetes_reservations`` does): create is idempotent (409 is done), delete too (404 is done).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kubernetes import client

from workers.backends.base import BackendError
from workers.backends.kubernetes_objects import MANAGED_BY, Manifest

# A workers.backends.kubernetes.KubernetesBackend: the calls are made through its ``_invoke``.
KubernetesBackend = Any

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
#: The cluster autoscaler's class that makes the nodes, all or none, and retries until ValidUntilSeconds.
ATOMIC_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
#: The label the pool's nodes carry (the node group's label in the cluster autoscaler), the pool's name its value.
POOL_LABEL = "gpuportal.io/node-pool"
#: Where the portal's requests and their PodTemplates live.
NAMESPACE = "gpuportal-capacity"
#: What the capacity pods would run: nothing (they are never created; the template is their shape).
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
#: The taint GPU node pools carry (the NVIDIA GPU operator's and the clouds' convention).
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
LABEL_REQUEST = "gpuportal.io/provisioning-request"
# The conditions that end a request without (all of) its nodes.
ENDING = ("Failed", "CapacityRevoked", "BookingExpired")
_MERGE_PATCH = "application/merge-patch+json"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Outcome = Literal["pending", "provisioned", "failed"]


@dataclass(frozen=True)
class NodeShape:
    """One node of the pool as its capacity pod asks for it: the pool's name (its nodes' label), its GPUs."""

    pool: str
    gpus: int
    gpu_resource_name: str = "nvidia.com/gpu"
    tolerations: tuple[Mapping[str, str], ...] = field(default=(GPU_TOLERATION,))


def request_name(cluster: str, pool: str, serial: int) -> str:
    """The request of a pool's ``serial``-th scale-up: ``gp-<cluster>-<pool>-<serial>``, a DNS label (its PodTemplate's
    name too)."""
    base = re.sub(r"[^a-z0-9-]+", "-", f"gp-{cluster}-{pool}".lower()).strip("-")[:50].strip("-")
    name = f"{base}-{int(serial)}"
    if not _DNS_LABEL.match(name):
        raise BackendError(f"{name!r} cannot name a ProvisioningRequest", permanent=True)
    return name


# -- pure builders --------------------------------------------------------------------------------------------


def _labels(name: str, pool: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": MANAGED_BY, POOL_LABEL: pool, LABEL_REQUEST: name}


def pod_template(name: str, shape: NodeShape, namespace: str = NAMESPACE) -> Manifest:
    """The PodTemplate a request references: one pod that takes a whole node of the pool (all its GPUs), on the
    pool's nodes only, tolerating the GPU taint. The cluster autoscaler simulates it to pick the node group."""
    if shape.gpus < 1:
        raise BackendError(f"pool {shape.pool} has nodes without GPUs: nothing to ask for", permanent=True)
    gpus = {shape.gpu_resource_name: str(int(shape.gpus))}
    container = {"name": "capacity", "image": PAUSE_IMAGE, "resources": {"requests": gpus, "limits": gpus}}
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(name, shape.pool)},
        "template": {
            "metadata": {"labels": _labels(name, shape.pool)},
            "spec": {
                "containers": [container],
                "nodeSelector": {POOL_LABEL: shape.pool},
                "tolerations": [dict(t) for t in shape.tolerations],
                "restartPolicy": "Never",
            },
        },
    }


def provisioning_request(name: str, shape: NodeShape, count: int, *, valid_for_s: int,
                         namespace: str = NAMESPACE) -> Manifest:  # fmt: skip
    """The ProvisioningRequest for ``count`` nodes of the pool's shape, atomic, tried for ``valid_for_s``."""
    if not 1 <= count <= 2**31 - 1:
        raise BackendError(f"cannot ask for {count} nodes", permanent=True)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ProvisioningRequest",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(name, shape.pool)},
        "spec": {
            "provisioningClassName": ATOMIC_CLASS,
            "podSets": [{"podTemplateRef": {"name": name}, "count": int(count)}],
            "parameters": {"ValidUntilSeconds": str(int(valid_for_s))},
        },
    }


def cordon_patch() -> Manifest:
    """The merge patch that keeps new pods off a node (``kubectl cordon``)."""
    return {"spec": {"unschedulable": True}}


def outcome(request: Mapping[str, Any] | None) -> tuple[Outcome, str]:
    """What a request's conditions say: ``provisioned`` (``Provisioned`` true), ``failed`` with the condition's
    message (``Failed``, ``CapacityRevoked`` or ``BookingExpired`` true; a request that is gone), else ``pending``."""
    if request is None:
        return "failed", "the ProvisioningRequest is gone"
    conditions = {c.get("type"): c for c in (request.get("status") or {}).get("conditions") or []}
    for kind in ENDING:
        condition = conditions.get(kind) or {}
        if condition.get("status") == "True":
            said = condition.get("message") or condition.get("reason") or kind
            return "failed", f"{kind}: {said}"
    if (conditions.get("Provisioned") or {}).get("status") == "True":
        return "provisioned", ""
    return "pending", ""


def ready_nodes(nodes: Iterable[Mapping[str, Any]], pool: str) -> list[str]:
    """The names of the nodes labelled as the pool's that are Ready and not cordoned, sorted."""
    return sorted(
        str(node["metadata"]["name"])
        for node in nodes
        if (node.get("metadata", {}).get("labels") or {}).get(POOL_LABEL) == pool
        and _ready(node) and not (node.get("spec") or {}).get("unschedulable")
    )  # fmt: skip


def _ready(node: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])  # fmt: skip


# -- calls to the API server ----------------------------------------------------------------------------------


def ask(backend: KubernetesBackend, name: str, shape: NodeShape, count: int, *, valid_for_s: int) -> None:
    """Create the namespace (if missing), the PodTemplate and the ProvisioningRequest. Idempotent: what exists
    already is left as it is (a request's spec cannot change)."""
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": NAMESPACE, "labels": {"app.kubernetes.io/managed-by": MANAGED_BY}}}  # fmt: skip
    backend._invoke(client.CoreV1Api, "create_namespace", namespace, ok=(409,))
    backend._invoke(client.CoreV1Api, "create_namespaced_pod_template", NAMESPACE, pod_template(name, shape),
                    ok=(409,))  # fmt: skip
    backend._invoke(client.CustomObjectsApi, "create_namespaced_custom_object", GROUP, VERSION, NAMESPACE, PLURAL,
                    provisioning_request(name, shape, count, valid_for_s=valid_for_s), ok=(409,))  # fmt: skip


def read(backend: KubernetesBackend, name: str) -> Manifest | None:
    data = backend._invoke(client.CustomObjectsApi, "get_namespaced_custom_object", GROUP, VERSION, NAMESPACE,
                           PLURAL, name, ok=(404,))  # fmt: skip
    return None if data is None else dict(json.loads(data))


def withdraw(backend: KubernetesBackend, name: str) -> None:
    """Delete the request and its PodTemplate (either gone already is fine). Nodes it made stay."""
    backend._invoke(client.CustomObjectsApi, "delete_namespaced_custom_object", GROUP, VERSION, NAMESPACE, PLURAL,
                    name, ok=(404,))  # fmt: skip
    backend._invoke(client.CoreV1Api, "delete_namespaced_pod_template", name, NAMESPACE, ok=(404,))


def nodes(backend: KubernetesBackend) -> dict[str, Manifest]:
    """Every node of the cluster by name, from one LIST."""
    answer = json.loads(backend._invoke(client.CoreV1Api, "list_node") or b"{}")
    return {str(n["metadata"]["name"]): dict(n) for n in answer.get("items") or []}


def cordon(backend: KubernetesBackend, node_names: Sequence[str]) -> None:
    """Cordon each node (one that is gone already is skipped)."""
    for node_name in node_names:
        backend._invoke(client.CoreV1Api, "patch_node", node_name, cordon_patch(), ok=(404,),
                        _content_type=_MERGE_PATCH)  # fmt: skip
