"""The autoscaler's decisions: which nodes of elastic pools to power up, and which to power down.

Pure: a scheduling snapshot (as the cycle that just ran saw it) and the elastic pools' nodes with
their power states come in; changes come out, each with its reason. Growth asks the engine itself:
the snapshot is scheduled again as if every powered-down node of the elastic pools were up and
free (preemption off), and the nodes that what-if admission places work on are the ones to start:
gangs are counted by their shape, quotas hold, and nothing that already fits is counted. Nodes
holding devices of a reservation about to begin are started too. Shrinking powers down nodes that
have been empty for the pool's delay and that nothing needs, never below the pool's minimum, never a
node with work on it, never one a reservation not yet ended holds.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Literal

from apps.scheduling.engine import schedule
from apps.scheduling.types import Device, NodeInfo, Snapshot

ONE = Decimal("1")
# Sorts after every name the portal gives a node (digits, letters, "/", "-").
LAST = "\U0010ffff"
Power = Literal["up", "down", "powering_up", "powering_down", "failed"]


@dataclass(frozen=True)
class ElasticNode:
    name: str  # the engine's name of the node (the snapshot's NodeInfo.name)
    label: str  # what reasons call it (the cluster's own node name)
    power: Power
    busy: bool  # work runs on it
    idle_since: float | None = None  # up and empty since (None: not empty, or unknown)


@dataclass(frozen=True)
class ElasticPool:
    key: str
    cluster: str
    gpu_type: str
    nodes: tuple[ElasticNode, ...]
    min_nodes: int
    max_nodes: int
    delay_s: float  # an empty node is powered down after this long
    devices_per_node: int = 1
    start_s: float = 600.0  # how long a node takes to start: reservations this close are prepared for
    may_grow: bool = True  # False: its budget is spent
    why_not: str = ""  # why it may not grow


@dataclass(frozen=True)
class Change:
    pool: str
    action: Literal["up", "down"]
    nodes: tuple[str, ...]  # engine names
    reason: str
    for_keys: tuple[str, ...] = ()  # the pending workloads the nodes are started for


def decide(snapshot: Snapshot, pools: Sequence[ElasticPool], now: float) -> list[Change]:
    """What to change now, pool by pool: at most one change a pool (start some, or stop some)."""
    wanted, used = _wanted(snapshot, pools)
    owners = {w.key: w.workspace for w in snapshot.pending}
    reserved = _reserved_soon(snapshot, pools, now)
    changes = []
    for pool in pools:
        up = [n for n in pool.nodes if n.power in ("up", "powering_up")]
        down = {n.name: n for n in pool.nodes if n.power == "down"}
        needed = sorted(set(wanted.get(pool.key, {})) | reserved.get(pool.key, set()))
        start = [name for name in needed if name in down][: max(0, pool.max_nodes - len(up))]
        if start and pool.may_grow:
            changes.append(_grow(pool, start, wanted.get(pool.key, {}), reserved.get(pool.key, set()), down, owners))
            continue
        # Empty nodes pending work would be placed on (the next cycle admits it) are kept too.
        stop = _idle(pool, now, set(needed) | used | _holding(snapshot, pool, now), len(up))
        if stop:
            empty = min(now - n.idle_since for n in stop if n.idle_since is not None)
            reason = (
                f"removing {_nodes(len(stop))} from {pool.gpu_type} on {pool.cluster}: empty for "
                f"{_minutes(empty)}, above the minimum of {pool.min_nodes}"
            )
            changes.append(Change(pool.key, "down", tuple(n.name for n in stop), reason))
    return changes


def _wanted(snapshot: Snapshot, pools: Sequence[ElasticPool]) -> tuple[dict[str, dict[str, list[str]]], set[str]]:
    """Per pool, the powered-down nodes what-if admission places pending work on, with that work; and
    every elastic node it places work on (an empty node that is up and will be used is not stopped).

    In the what-if, nodes that are off (or starting) are renamed to sort after every running node:
    among nodes the engine finds equally good it takes the least name, so running nodes are filled
    first, and a node is started only for what no running one can take."""
    down = {n.name: pool for pool in pools for n in pool.nodes if n.power == "down"}
    idle = {n.name for pool in pools for n in pool.nodes if n.power == "up" and not n.busy}
    if not (down or idle) or not snapshot.pending:
        return {}, set()
    # Nodes already starting count as up: what waits for them is not counted again.
    starting = {n.name for pool in pools for n in pool.nodes if n.power == "powering_up"}
    # In the order of the cluster's own names (b2 before b10), not of the engine's (ids, as strings).
    labels = {n.name: n.label for pool in pools for n in pool.nodes}
    order = sorted((*down, *starting), key=lambda name: (_natural(labels[name]), name))
    renamed = {name: f"{LAST}{i:06d}{name}" for i, name in enumerate(order)}
    original = {new: old for old, new in renamed.items()}
    nodes = tuple(
        NodeInfo(renamed[n.name], n.cluster, n.gpu_type, tuple(Device(d.index, ONE) for d in n.devices))
        if n.name in renamed else n
        for n in snapshot.nodes
    )  # fmt: skip
    reservations = tuple(
        replace(r, devices=tuple((renamed.get(node, node), index) for node, index in r.devices))
        for r in snapshot.reservations
    )
    whatif = replace(snapshot, nodes=nodes, reservations=reservations, estimate=False,
                     policy=replace(snapshot.policy, preemption=False))  # fmt: skip
    found: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    used: set[str] = set()
    for admit in schedule(whatif).admitted:
        for replica in admit.placement:
            name = original.get(replica.node, replica.node)
            used.add(name)
            pool = down.get(name)
            if pool is not None and admit.key not in found[pool.key][name]:
                found[pool.key][name].append(admit.key)
    return found, used


def _reserved_soon(snapshot: Snapshot, pools: Sequence[ElasticPool], now: float) -> dict[str, set[str]]:
    """Per pool, the powered-down nodes holding devices of a reservation that begins within the time a
    node takes to start (or has begun)."""
    found: dict[str, set[str]] = defaultdict(set)
    for pool in pools:
        down = {n.name for n in pool.nodes if n.power == "down"}
        for reservation in snapshot.reservations:
            if reservation.end > now and reservation.start - now <= pool.start_s:
                found[pool.key].update(node for node, _ in reservation.devices if node in down)
    return found


def _holding(snapshot: Snapshot, pool: ElasticPool, now: float) -> set[str]:
    """Its nodes a reservation not yet ended holds devices of: they stay up."""
    names = {n.name for n in pool.nodes}
    return {node for r in snapshot.reservations if r.end > now for node, _ in r.devices if node in names}


def _idle(pool: ElasticPool, now: float, keep: set[str], up: int) -> list[ElasticNode]:
    """The nodes to power down: up, empty for the pool's delay, not kept; never below the minimum."""
    idle = [
        n
        for n in pool.nodes
        if n.power == "up" and not n.busy and n.name not in keep
        and n.idle_since is not None and now - n.idle_since >= pool.delay_s
    ]  # fmt: skip
    idle.sort(key=lambda n: (n.idle_since or 0.0, n.name))
    return idle[: max(0, up - pool.min_nodes)]


def _grow(pool: ElasticPool, start: list[str], wanted: dict[str, list[str]], reserved: set[str],
          down: dict[str, ElasticNode], owners: dict[str, str]) -> Change:  # fmt: skip
    keys = sorted({key for name in start for key in wanted.get(name, [])})
    workspaces = sorted({owners[key] for key in keys if key in owners})
    why = []
    if keys:
        what = "workload" if len(keys) == 1 else "workloads"
        why.append(f"{len(keys)} pending {what}" + (f" of {', '.join(workspaces)}" if workspaces else ""))
    if any(name in reserved for name in start):
        why.append("a reservation about to begin")
    labels = ", ".join(down[name].label for name in start)
    reason = f"adding {_nodes(len(start))} ({labels}) to {pool.gpu_type} on {pool.cluster} for {' and '.join(why)}"
    return Change(pool.key, "up", tuple(start), reason, tuple(keys))


def _natural(label: str) -> tuple[tuple[int, int | str], ...]:
    """A node name's sort key with its numbers compared as numbers: gpu-2 before gpu-10."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", label) if part)


def _nodes(count: int) -> str:
    return f"{count} node{'s' if count != 1 else ''}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min"
