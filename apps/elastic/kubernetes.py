"""The Kubernetes provider of elastic pools: nodes asked of the cluster autoscaler with ProvisioningRequests
(workers/backends/kubernetes_provisioning.py builds and sends them).

The pool's nodes in the portal's inventory are slots, named as the operator declared them; the cluster
autoscaler names the nodes it makes. ``PoolScaling.provider_state`` keeps the link:
``{"serial": 3, "requests": {"<request>": ["<slot>", ...]}, "slots": {"<slot>": {"request": "<request>",
"node": "<kubernetes node>", "error": "<why it failed>"}}}``. A slot is up while it is bound to a Ready node of
the pool, starting while its request waits for nodes, failed when its request ended without them (until the
autoscaler resets it), stopping while its node is cordoned, and down once its node is gone (the cluster
autoscaler removes empty nodes) or when it has none. A slot named as a Kubernetes node is that node: a pool's
static nodes are listed in the inventory under their own names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Count

from apps.elastic.models import PoolScaling
from apps.inventory.models import Node
from workers.backends import kubernetes_provisioning as kp
from workers.backends.base import BackendError

Power = str  # providers.Power: "up", "down", "powering_up", "powering_down", "failed"


def _backend(scaling: PoolScaling) -> Any:
    from workers.backends.registry import backend_for

    return backend_for(scaling.pool.cluster)


def _state(scaling: PoolScaling) -> dict[str, Any]:
    state = dict(scaling.provider_state or {})
    state.setdefault("serial", 0)
    state.setdefault("requests", {})
    state.setdefault("slots", {})
    return state


def _save(scaling: PoolScaling, state: dict[str, Any]) -> None:
    scaling.provider_state = state
    PoolScaling.objects.filter(pk=scaling.pk).update(provider_state=state)


def shape(scaling: PoolScaling, backend: Any) -> kp.NodeShape:
    """A node of the pool as the request asks for it: the most GPUs any of its slots has."""
    gpus = Node.objects.filter(pool=scaling.pool).annotate(devices=Count("gpus")).values_list("devices", flat=True)
    resource = getattr(getattr(backend, "settings", None), "gpu_resource_name", "nvidia.com/gpu")
    return kp.NodeShape(pool=scaling.pool.name, gpus=max(gpus, default=0), gpu_resource_name=resource)


def power_up(scaling: PoolScaling, slots: Sequence[str]) -> None:
    """One ProvisioningRequest for the slots (one node each), remembered before it is sent: a request that was
    sent but not answered is found again by its name."""
    backend = _backend(scaling)
    state = _state(scaling)
    state["serial"] += 1
    name = kp.request_name(scaling.pool.cluster.name, scaling.pool.name, state["serial"])
    state["requests"][name] = list(slots)
    for slot in slots:
        state["slots"][slot] = {"request": name, "node": "", "error": ""}
    _save(scaling, state)
    kp.ask(backend, name, shape(scaling, backend), len(slots), valid_for_s=scaling.start_timeout_s)


def observe(scaling: PoolScaling, slots: Sequence[str]) -> dict[str, Power]:
    """Each slot's power, from its request's conditions and the cluster's nodes; binds the slots of a provisioned
    request to the pool's Ready nodes no slot has, and deletes a request once it has served (or ended)."""
    backend = _backend(scaling)
    state = _state(scaling)
    found = kp.nodes(backend)
    taken = {info["node"] for info in state["slots"].values() if info.get("node")} | set(slots)
    for name, members in list(state["requests"].items()):
        result, message = kp.outcome(kp.read(backend, name))
        waiting = [s for s in members if not state["slots"].get(s, {}).get("node")]
        if result == "provisioned":
            free = [n for n in kp.ready_nodes(found.values(), scaling.pool.name) if n not in taken]
            for slot, node_name in zip(waiting, free, strict=False):
                state["slots"][slot]["node"] = node_name
                taken.add(node_name)
        elif result == "failed":
            for slot in waiting:
                state["slots"][slot].update(request="", error=message[:900])
        if result == "failed" or all(state["slots"].get(s, {}).get("node") for s in members):
            kp.withdraw(backend, name)
            del state["requests"][name]
    powers = {slot: _power(state, slot, found) for slot in slots}
    _save(scaling, state)
    return powers


def _power(state: dict[str, Any], slot: str, found: dict[str, Any]) -> Power:
    info = state["slots"].get(slot)
    if info is None:
        node = found.get(slot)
        return "down" if node is None else _node_power(node, "down")
    if info.get("error"):
        return "failed"
    if not info.get("node"):
        return "powering_up" if info.get("request") else "down"
    node = found.get(info["node"])
    if node is None:  # the cluster autoscaler removed it
        del state["slots"][slot]
        return "down"
    return _node_power(node, "powering_up")


def _node_power(node: dict[str, Any], not_ready: Power) -> Power:
    if (node.get("spec") or {}).get("unschedulable"):
        return "powering_down"
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or [])  # fmt: skip
    return "up" if ready else not_ready


def failure(scaling: PoolScaling, slot: str) -> str:
    """Why the slot's start failed, as the request's condition said ('' if it did not fail so)."""
    return str(_state(scaling)["slots"].get(slot, {}).get("error") or "")


def reset(scaling: PoolScaling, slots: Sequence[str]) -> None:
    """Forget the slots' failed start (and their request, if no other slot waits on it), so they may be asked
    for again."""
    state = _state(scaling)
    backend = None
    for slot in slots:
        info = state["slots"].pop(slot, None) or {}
        request = info.get("request")
        members = state["requests"].get(request or "")
        if members is None:
            continue
        if slot in members:
            members.remove(slot)
        if not any(s in state["slots"] for s in members):
            backend = backend or _backend(scaling)
            kp.withdraw(backend, str(request))
            del state["requests"][str(request)]
    _save(scaling, state)


def power_down(scaling: PoolScaling, slots: Sequence[str]) -> None:
    """Cordon the slots' nodes (the cluster autoscaler removes them once empty, after its own delay); a slot
    without a node is down at once. A slot named as a Kubernetes node is cordoned too."""
    state = _state(scaling)
    cordoned = []
    for slot in slots:
        info = state["slots"].get(slot)
        if info is None:
            cordoned.append(slot)
        elif info.get("node"):
            cordoned.append(info["node"])
        else:
            state["slots"].pop(slot)
    if cordoned:
        try:
            kp.cordon(_backend(scaling), cordoned)
        except BackendError:
            _save(scaling, state)
            raise
    _save(scaling, state)
