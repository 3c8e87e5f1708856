"""GPU reservations on Kubernetes: what an approved GPU provisioning request (GPR) becomes on a cluster of kind
"kubernetes" (docs/kubernetes.md, "GPU reservations").

A reservation holds whole nodes, the ones that hold the GPR's devices, as a Slurm reservation does
(``slurm_reservations``). Each is labelled ``gpuportal.io/reservation=<name>`` and tainted
``gpuportal.io/reservation=<name>:NoSchedule``:

- the taint keeps off every new pod that does not tolerate it: other workspaces' pods, and pods that the portal
  did not make. ``NoSchedule`` evicts nothing: pods already on the node keep running (the portal's scheduler has
  moved its own work off the devices before the reservation begins), and so do DaemonSets' pods;
- the holder's pods, those of a workload whose spec names the reservation, get the matching toleration and a
  nodeSelector on the label (:func:`on_reservation`), so they run on those nodes and on no other.

No ResourceQuota is made or changed. The portal counts quota before anything reaches the cluster, and work on a
reservation is not counted against its workspace's quota while the reservation is active. The namespaces that the
workspace's jobs, Ray clusters and inference replicas run in have no ResourceQuota to raise. An instance's
namespace has one: the instance's own size, which is what it was admitted with, on a reservation or not. Raising
it by the reservation's size would let the instance's users take GPUs that were never admitted for it.

Nodes are changed precisely. The label is set and removed with a JSON merge patch of that one key. A node's
taints are one list, which a patch replaces whole, so each change reads the node, changes only the portal's
taint in the list, and sends the list back with the ``resourceVersion`` it read. If anything else wrote the
node in between (the node controller adding a taint, an admin cordoning it), the API server refuses the patch
with 409 Conflict; the change is then read and made again. Another taint or label is never dropped. Only the
label and taint of the reservation named are removed, and only where they still carry its name.

One node can hold one reservation at a time, because taints are unique by key and effect. Applying a
reservation to a node that another one still holds is a transient ``BackendError`` that changes no node: when
one reservation follows another on the same nodes, the second is applied once the first is removed.

The functions call the API server through a ``KubernetesBackend`` (``workers.backends.registry.backend_for``
with the Cluster row). That gives them its credentials, timeouts and error mapping: an unreachable server,
408/429/5xx and lasting conflicts are transient, and other refusals are permanent.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kubernetes import client

from workers.backends.base import BackendError
from workers.backends.kubernetes_objects import Manifest

# A workers.backends.kubernetes.KubernetesBackend: that module imports this one (for the pods'
# toleration), so this one names it only as the type its calls are made through.
KubernetesBackend = Any

#: The label key and taint key of every reservation; the value is the reservation's name.
RESERVATION_KEY = "gpuportal.io/reservation"
#: New pods without the toleration are not scheduled on the node; running ones stay.
RESERVATION_EFFECT = "NoSchedule"
#: The names of the portal's reservations start with this.
RESERVATION_PREFIX = "gpr-"
#: How many times a node's change is read and made again when something else wrote the node meanwhile.
CONFLICT_ATTEMPTS = 5

_MERGE_PATCH = "application/merge-patch+json"
# A label value (a taint's value has the same syntax): at most 63 characters, alphanumerics at both ends.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def reservation_name(gpr_id: int) -> str:
    """The reservation of GPR ``gpr_id`` on Kubernetes: ``gpr-<id>``. A workload's spec names it in ``reservation``."""
    return f"{RESERVATION_PREFIX}{int(gpr_id)}"


def check_reservation_name(name: str) -> str:
    """``name`` if it can be a label's and a taint's value; a permanent ``BackendError`` otherwise."""
    if not isinstance(name, str) or not _LABEL_VALUE.match(name):
        raise BackendError(f"{name!r} cannot name a reservation on Kubernetes (a label value)", permanent=True)
    return name


# -- pure builders --------------------------------------------------------------------------------------------


def reservation_taint(name: str) -> dict[str, str]:
    """The taint a reserved node carries."""
    return {"key": RESERVATION_KEY, "value": check_reservation_name(name), "effect": RESERVATION_EFFECT}


def reservation_toleration(name: str) -> dict[str, str]:
    """The toleration of exactly that taint: a pod with it may run on the reservation's nodes, and no other's."""
    return {
        "key": RESERVATION_KEY,
        "operator": "Equal",
        "value": check_reservation_name(name),
        "effect": RESERVATION_EFFECT,
    }


def on_reservation(manifest: Manifest, name: str) -> Manifest:
    """A copy of ``manifest`` with every pod in it placed on reservation ``name``'s nodes.

    Each pod spec (a Pod's spec, a workload's template, a RayCluster's groups: any object with a list of
    containers) gets the label ``RESERVATION_KEY=<name>`` in its nodeSelector, beside what it selects already
    (a GPU type's label), and the reservation's toleration. A manifest without pods is returned unchanged.
    """
    toleration = reservation_toleration(name)
    placed = copy.deepcopy(manifest)
    for pod in _pod_specs(placed):
        pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), RESERVATION_KEY: name}
        tolerations = list(pod.get("tolerations") or [])
        if toleration not in tolerations:
            tolerations.append(dict(toleration))
        pod["tolerations"] = tolerations
    return placed


def _pod_specs(node: Any) -> Iterable[dict[str, Any]]:
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield node
        for value in node.values():
            yield from _pod_specs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _pod_specs(value)


def holder(node: Manifest) -> str:
    """The reservation a node carries, by its label or by its taint (either alone is still the portal's); ""
    for none."""
    labels = node.get("metadata", {}).get("labels") or {}
    if labels.get(RESERVATION_KEY):
        return str(labels[RESERVATION_KEY])
    ours = [t for t in _taints(node) if t.get("key") == RESERVATION_KEY and t.get("effect") == RESERVATION_EFFECT]
    return str(ours[0].get("value") or "") if ours else ""


def check_free(node: Manifest, name: str) -> None:
    """A transient ``BackendError`` if a reservation other than ``name`` holds ``node``: it is the node's until
    that one is removed (one reservation per node: taints are unique by key and effect)."""
    other = holder(node)
    if other and other != name:
        node_name = node.get("metadata", {}).get("name")
        raise BackendError(f"node {node_name} is still held by reservation {other}; try again", permanent=False)


def apply_patch(node: Manifest, name: str) -> Manifest | None:
    """The merge patch that puts reservation ``name`` on ``node``: its label, and its taint added to the node's
    others. None if the node has both already. A transient ``BackendError`` if another reservation holds it."""
    taint = reservation_taint(name)
    check_free(node, name)
    labels = node.get("metadata", {}).get("labels") or {}
    taints = _taints(node)
    if labels.get(RESERVATION_KEY) == name and taint in taints:
        return None
    kept = [t for t in taints if not _is_ours(t, name)]
    return _node_patch(node, labels={RESERVATION_KEY: name}, taints=[*kept, taint])


def remove_patch(node: Manifest, name: str) -> Manifest | None:
    """The merge patch that takes reservation ``name``'s label and taint off ``node`` and leaves every other
    label and taint as it is; None if the node carries neither."""
    labels = node.get("metadata", {}).get("labels") or {}
    taints = _taints(node)
    kept = [t for t in taints if not _is_ours(t, name)]
    labelled = labels.get(RESERVATION_KEY) == name
    if not labelled and len(kept) == len(taints):
        return None
    return _node_patch(node, labels={RESERVATION_KEY: None} if labelled else {}, taints=kept or None)


def _taints(node: Manifest) -> list[dict[str, Any]]:
    return [dict(t) for t in (node.get("spec") or {}).get("taints") or []]


def _is_ours(taint: dict[str, Any], name: str) -> bool:
    return (
        taint.get("key") == RESERVATION_KEY and taint.get("effect") == RESERVATION_EFFECT and taint.get("value") == name
    )


def _node_patch(node: Manifest, *, labels: dict[str, str | None], taints: list[dict[str, Any]] | None) -> Manifest:
    """A merge patch of the node's labels named and its whole taint list (None: no taints left), made on the
    condition that the node is still at the ``resourceVersion`` read (the API server answers 409 otherwise)."""
    metadata: dict[str, Any] = {"labels": labels} if labels else {}
    version = node.get("metadata", {}).get("resourceVersion")
    if version:
        metadata["resourceVersion"] = version
    patch: Manifest = {"spec": {"taints": taints}}
    if metadata:
        patch["metadata"] = metadata
    return patch


# -- calls to the API server ----------------------------------------------------------------------------------


def apply_reservation(backend: KubernetesBackend, name: str, *, nodes: Sequence[str]) -> list[str]:
    """Reserve ``nodes`` (Kubernetes node names, as the inventory names them) for reservation ``name``: label and
    taint each. Idempotent. Returns the nodes it changed (none when all were reserved already).

    Every node is read before any is changed: a node that does not exist is a permanent ``BackendError``, one
    that another reservation still holds a transient one, and either way no node is changed.
    """
    check_reservation_name(name)
    if not nodes:
        raise BackendError(f"reservation {name}: no nodes to reserve", permanent=True)
    for node_name in sorted(set(nodes)):
        node = _read_node(backend, node_name)
        if node is None:
            raise BackendError(f"reservation {name}: the cluster has no node {node_name}", permanent=True)
        check_free(node, name)
    return [node_name for node_name in sorted(set(nodes)) if _converge(backend, node_name, name, apply_patch)]


def remove_reservation(backend: KubernetesBackend, name: str, *, nodes: Sequence[str] | None = None) -> list[str]:
    """Take reservation ``name``'s label and taint off ``nodes`` (None: off every node that carries them, from one
    LIST), leaving every other label and taint. Idempotent; a node that no longer exists is skipped. Returns the
    nodes it changed. Pods already running there keep running: neither a nodeSelector nor a ``NoSchedule`` taint
    is checked again once a pod runs."""
    check_reservation_name(name)
    names = sorted(set(nodes)) if nodes is not None else reserved_nodes(backend).get(name, [])
    return [node_name for node_name in names if _converge(backend, node_name, name, remove_patch)]


def reserved_nodes(backend: KubernetesBackend) -> dict[str, list[str]]:
    """Every reservation the cluster's nodes carry (by label or taint), with its nodes: what a reconcile pass
    compares with the portal's active GPRs, to remove what is left of ended ones."""
    answer = json.loads(backend._invoke(client.CoreV1Api, "list_node") or b"{}")
    found: dict[str, list[str]] = {}
    for node in answer.get("items") or []:
        name = holder(node)
        if name:
            found.setdefault(name, []).append(str(node["metadata"]["name"]))
    return {name: sorted(node_names) for name, node_names in sorted(found.items())}


def _converge(
    backend: KubernetesBackend, node_name: str, name: str, change: Callable[[Manifest, str], Manifest | None]
) -> bool:
    """Read the node and send ``change(node, name)``'s patch until the API server takes it. True if the node was
    changed; False if it needed no change or no longer exists. A node written by something else each time it
    was read (``CONFLICT_ATTEMPTS`` times) is a transient ``BackendError``."""
    for _ in range(CONFLICT_ATTEMPTS):
        node = _read_node(backend, node_name)
        if node is None:
            return False
        patch = change(node, name)
        if patch is None:
            return False
        # 409: the node changed since it was read. 404: it is gone (the next read says so).
        patched = backend._invoke(
            client.CoreV1Api, "patch_node", node_name, patch, ok=(404, 409), _content_type=_MERGE_PATCH
        )
        if patched is not None:
            return True
    raise BackendError(
        f"node {node_name} kept changing while reservation {name} was written; try again", permanent=False
    )


def _read_node(backend: KubernetesBackend, node_name: str) -> Manifest | None:
    data = backend._invoke(client.CoreV1Api, "read_node", node_name, ok=(404,))
    if data is None:
        return None
    node: Manifest = json.loads(data)
    return node
