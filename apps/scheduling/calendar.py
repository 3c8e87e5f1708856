"""The capacity calendar: when a reservation of whole devices can begin. Part of the pure scheduling
core (no Django): the portal asks it when a GPU provisioning request is made or changed, and the
engine then keeps the devices it chose for the reservation (`Reservation`, see the engine).

A device is free over a window when no other reservation holds it at any moment of the window and
no non-preemptible running work holds a share of it after the window begins: such work is counted
until its declared end (started_at + max_runtime_s), forever without one. Preemptible work never
stands in the way: the engine evicts it before a reservation begins.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from apps.scheduling.types import NodeInfo, Reservation, Workload

Spot = tuple[str, int]  # a device: (node name, device index)


@dataclass(frozen=True)
class Slot:
    """Where and when a reservation fits: `devices` of `cluster` over [start, end)."""

    start: float
    end: float
    cluster: str
    devices: tuple[Spot, ...]

    @property
    def gpus(self) -> int:
        return len(self.devices)


def overlapping(
    reservations: Iterable[Reservation],
    *,
    cluster: str,
    devices: Iterable[Spot],
    start: float,
    end: float,
    ignore: str | None = None,
) -> list[Reservation]:
    """The reservations (less the one keyed `ignore`) that hold one of `devices` of `cluster` at some
    moment of [start, end)."""
    wanted = set(devices)
    return [
        r for r in reservations
        if r.key != ignore and r.cluster == cluster and r.start < end and r.end > start
        and wanted.intersection(r.devices)
    ]  # fmt: skip


def blocked_until(running: Iterable[Workload], cluster: str) -> dict[Spot, float]:
    """Per device of `cluster` that non-preemptible running work holds a share of: when the last of
    it ends by its declared limit (inf without one)."""
    until: dict[Spot, float] = defaultdict(float)
    for workload in running:
        if workload.preemptible or workload.cluster != cluster:
            continue
        end = math.inf
        if workload.max_runtime_s is not None and workload.started_at is not None:
            end = workload.started_at + workload.max_runtime_s
        for replica in workload.placement:
            for index, _ in replica.devices:
                until[replica.node, index] = max(until[replica.node, index], end)
    return until


def fits_calendar(
    reservation: Reservation,
    *,
    nodes: Sequence[NodeInfo],
    reservations: Sequence[Reservation],
    running: Sequence[Workload],
) -> bool:
    """Whether `reservation` (a new one, or a changed one: itself, by key, is ignored among
    `reservations`) holds devices of its type that exist, overlaps no other reservation on them, and
    finds them free of non-preemptible running work from its start."""
    known = {
        (node.name, device.index)
        for node in nodes
        if node.cluster == reservation.cluster and node.gpu_type == reservation.gpu_type
        for device in node.devices
    }
    if not reservation.devices or not known.issuperset(reservation.devices):
        return False
    if len(set(reservation.devices)) != len(reservation.devices):
        return False
    clashes = overlapping(
        reservations,
        cluster=reservation.cluster,
        devices=reservation.devices,
        start=reservation.start,
        end=reservation.end,
        ignore=reservation.key,
    )
    if clashes:
        return False
    blocked = blocked_until(running, reservation.cluster)
    return all(blocked.get(spot, 0.0) <= reservation.start for spot in reservation.devices)


def earliest_start(
    *,
    gpus: int,
    gpu_type: str,
    cluster: str | None,
    duration_s: float,
    not_before: float,
    nodes: Sequence[NodeInfo],
    reservations: Sequence[Reservation],
    running: Sequence[Workload],
    whole_nodes: bool = False,
) -> Slot | None:
    """The earliest slot from `not_before` on for `gpus` whole devices of `gpu_type` in one cluster
    (`cluster`, or any, the first by name at the same start) over `duration_s`; None if no cluster
    has that many devices of the type (with `whole_nodes`: whole nodes, the way Slurm reserves), or
    non-preemptible work without a declared end keeps too many of them forever.

    `nodes` are the devices with their full capacity; `reservations` the other approved ones;
    `running` the running work with its placement. The earliest start is one of `not_before`, the
    end of a reservation and the declared end of non-preemptible running work: a device is freed
    only at such a moment. Devices: see `_choose`."""
    by_cluster: dict[str, list[NodeInfo]] = defaultdict(list)
    for node in nodes:
        if node.gpu_type == gpu_type and (cluster is None or node.cluster == cluster) and node.devices:
            by_cluster[node.cluster].append(node)
    possible = {name: found for name, found in sorted(by_cluster.items()) if _holds(found, gpus)}
    if gpus <= 0 or duration_s <= 0 or not possible:
        return None
    blocked = {name: blocked_until(running, name) for name in possible}
    moments = {not_before}
    moments.update(r.end for r in reservations if r.end > not_before)
    moments.update(end for until in blocked.values() for end in until.values() if not_before < end < math.inf)
    for start in sorted(moments):
        end = start + duration_s
        for name, found in possible.items():
            taken = {spot for r in overlapping(reservations, cluster=name, devices=_spots(found), start=start, end=end)
                     for spot in r.devices}  # fmt: skip
            taken.update(spot for spot, until in blocked[name].items() if until > start)
            devices = _choose(found, taken, gpus, whole_nodes)
            if devices is not None:
                return Slot(start, end, name, devices)
    return None  # not even once every reservation and declared end is past: work without one is in the way


def _spots(nodes: Iterable[NodeInfo]) -> list[Spot]:
    return [(node.name, device.index) for node in nodes for device in node.devices]


def _holds(nodes: Sequence[NodeInfo], gpus: int) -> bool:
    return sum(len(node.devices) for node in nodes) >= gpus


def _choose(nodes: Sequence[NodeInfo], taken: set[Spot], gpus: int, whole_nodes: bool) -> tuple[Spot, ...] | None:
    """`gpus` devices not `taken`, on the fewest nodes: while a node has as many free as are still
    needed, the one with the fewest such (then the least name), which keeps larger free nodes whole
    for gangs; otherwise the one with the most free (then the least name), all of them. Each node's
    devices by index. With `whole_nodes`, only nodes with every device free, chosen the same way by
    their size, and all of each chosen node's devices. None if there are not enough."""
    free: dict[str, list[int]] = {}
    for node in nodes:
        indexes = sorted(device.index for device in node.devices if (node.name, device.index) not in taken)
        if whole_nodes and len(indexes) < len(node.devices):
            continue
        if indexes:
            free[node.name] = indexes
    if sum(map(len, free.values())) < gpus:
        return None
    chosen: list[Spot] = []
    left = gpus
    while left > 0:
        enough = [name for name, indexes in free.items() if len(indexes) >= left]
        best_fit, fullest = (lambda n: (len(free[n]), n)), (lambda n: (-len(free[n]), n))
        name = min(enough, key=best_fit) if enough else min(free, key=fullest)
        indexes = free.pop(name)
        picked = indexes if whole_nodes else indexes[:left]
        chosen.extend((name, index) for index in picked)
        left -= min(left, len(picked))
    return tuple(chosen)
