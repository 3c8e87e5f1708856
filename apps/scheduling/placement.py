"""Where replicas fit: one GPU type's nodes in one cluster, bucketed for constant-time fits.

Among the nodes (or devices) a bucket holds, the one with the least name is always chosen, so that
where work goes depends on the free devices alone, not on the order in which they were freed
(a preemption search gives devices back and takes them again, and must leave no trace).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Callable, Sequence
from heapq import heappop, heappush, nsmallest
from typing import Generic, TypeVar

from apps.scheduling.types import UNIT, Device, NodeInfo, gpus_of, units_of

K = TypeVar("K", str, tuple[str, int])
V = TypeVar("V")


class _Bucket(Generic[K, V]):
    """Members with the least key at hand: a dict, and a heap of keys cleaned as it is read."""

    __slots__ = ("members", "heap")

    def __init__(self) -> None:
        self.members: dict[K, V] = {}
        self.heap: list[K] = []

    def __bool__(self) -> bool:
        return bool(self.members)

    def add(self, key: K, value: V) -> None:
        self.members[key] = value
        heappush(self.heap, key)
        if len(self.heap) > 2 * len(self.members) + 32:
            self.heap = sorted(self.members)  # drop the keys that left

    def remove(self, key: K) -> None:
        del self.members[key]

    def first(self) -> K:
        heap, members = self.heap, self.members
        while heap[0] not in members:
            heappop(heap)
        return heap[0]


# --- Internal state ------------------------------------------------------------------------------


class PoolNode:
    __slots__ = ("name", "cluster", "gpu_type", "indexes", "free", "whole", "capacity")

    def __init__(self, info: NodeInfo):
        self.name = info.name
        self.cluster = info.cluster
        self.gpu_type = info.gpu_type
        devices = sorted(info.devices, key=lambda d: d.index)  # the same choices whatever the input order
        self.indexes = [d.index for d in devices]
        self.free = [units_of(d.free) for d in devices]
        self.whole = sum(1 for f in self.free if f == UNIT)
        self.capacity = len(self.free)


class Pool:
    """The nodes of one GPU type in one cluster, bucketed by whole free devices for O(1) fits."""

    def __init__(self, cluster: str, gpu_type: str, nodes: list[PoolNode], spread: bool):
        self.cluster = cluster
        self.gpu_type = gpu_type
        self.spread = spread
        self.nodes = {n.name: n for n in nodes}
        self.max_devices = max((n.capacity for n in nodes), default=0)
        self.buckets: list[_Bucket[str, PoolNode]] = [_Bucket() for _ in range(self.max_devices + 1)]
        self.held: dict[str, PoolNode] = {}  # nodes kept free for a starving gang this cycle
        # Partly used devices by their free share, for fractional requests: {free: {(node, position)}},
        # and the free shares that have some, in order.
        self.partial: dict[int, _Bucket[tuple[str, int], None]] = {}
        self.levels: list[int] = []
        for node in sorted(nodes, key=lambda n: n.name):
            self.buckets[node.whole].add(node.name, node)
            for position, free in enumerate(node.free):
                if 0 < free < UNIT:
                    self._add_partial(free, (node.name, position))
        self.capacity = sum(n.capacity for n in nodes) * UNIT
        self.order = {node: at for at, node in enumerate(self.nodes.values())}  # each node's place in `nodes`
        self.free_units = sum(sum(n.free) for n in nodes)

    def _add_partial(self, free: int, device: tuple[str, int]) -> None:
        bucket = self.partial.get(free)
        if bucket is None:
            bucket = self.partial[free] = _Bucket()
        if not bucket:
            insort(self.levels, free)
        bucket.add(device, None)

    def _remove_partial(self, free: int, device: tuple[str, int]) -> None:
        bucket = self.partial[free]
        bucket.remove(device)
        if not bucket:
            del self.levels[bisect_left(self.levels, free)]

    def _change(self, node: PoolNode, devices: list[tuple[int, int]], sign: int) -> None:
        before = whole = node.whole
        free = node.free
        total = 0
        for position, share in devices:
            old = free[position]
            new = old + sign * share
            if old == UNIT:
                whole -= 1
            elif old:
                self._remove_partial(old, (node.name, position))
            if new == UNIT:
                whole += 1
            elif new:
                self._add_partial(new, (node.name, position))
            free[position] = new
            total += share
        self.free_units += sign * total
        if whole != before:
            node.whole = whole
            if node.name not in self.held:
                self.buckets[before].remove(node.name)
                self.buckets[whole].add(node.name, node)

    def take(self, node: PoolNode, devices: list[tuple[int, int]]) -> None:
        self._change(node, devices, -1)

    def give(self, node: PoolNode, devices: list[tuple[int, int]]) -> None:
        self._change(node, devices, +1)

    def hold(self, node: PoolNode) -> None:
        self.buckets[node.whole].remove(node.name)
        self.held[node.name] = node

    def release_held(self) -> None:
        for node in self.held.values():
            self.buckets[node.whole].add(node.name, node)
        self.held.clear()

    def roomy(self, share: int) -> set[PoolNode]:
        """The nodes (held ones too) with room now for one replica of `share` thousandths: that many
        whole free devices, or for a fraction one device with that much free."""
        count = max(1, share // UNIT)
        found = {node for whole in range(count, self.max_devices + 1) for node in self.buckets[whole].members.values()}
        if share < UNIT:
            for level in self.levels[bisect_left(self.levels, share) :]:
                found.update(self.nodes[name] for name, _ in self.partial[level].members)
        for node in self.held.values():
            if node.whole >= count if share >= UNIT else max(node.free, default=0) >= share:
                found.add(node)
        return found

    def to_hold(self, count: int, replicas: int) -> list[PoolNode]:
        """The `replicas` nodes of at least `count` devices to hold for work that waits for them
        (fewer if the pool has fewer): those with the most whole free devices, then the largest
        free share of a partly used device, then the least name. Only the buckets it takes from are
        ordered (held nodes are in none: hold from a pool that holds none)."""
        freest: dict[str, int] = {}  # each node's largest free share of a partly used device
        for level in reversed(self.levels):
            for name, _ in self.partial[level].members:
                freest.setdefault(name, level)
        chosen: list[PoolNode] = []
        for whole in range(self.max_devices, -1, -1):
            bucket = [n for n in self.buckets[whole].members.values() if n.capacity >= count]
            left = replicas - len(chosen)
            if len(bucket) > left:
                bucket = nsmallest(left, bucket, key=lambda n: (-freest.get(n.name, 0), n.name))
            else:
                bucket.sort(key=lambda n: (-freest.get(n.name, 0), n.name))
            chosen.extend(bucket)
            if len(chosen) == replicas:
                break
        return chosen

    def place_on_held_too(self, share: int, replicas: int) -> list[tuple[PoolNode, list[tuple[int, int]]]] | None:
        """`place`, with the held nodes open to it as well (backfill that ends before their gang
        could start); they stay held."""
        held = list(self.held.values())
        self.release_held()
        try:
            return self.place(share, replicas)
        finally:
            for node in held:
                self.hold(node)

    def _whole_candidates(self, count: int) -> list[PoolNode]:
        order = range(self.max_devices, count - 1, -1) if self.spread else range(count, self.max_devices + 1)
        for whole in order:
            bucket = self.buckets[whole]
            if bucket:
                return [bucket.members[bucket.first()]]
        return []

    def _fit(self, share: int) -> tuple[PoolNode, list[tuple[int, int]]] | None:
        """One replica: `share` thousandths below one GPU, or a whole number of devices."""
        if share >= UNIT:
            count = share // UNIT
            for node in self._whole_candidates(count):
                positions = [p for p, f in enumerate(node.free) if f == UNIT][:count]
                return node, [(p, UNIT) for p in positions]
            return None
        # A fraction: the fullest partly used device that still has room (bin-packing).
        levels = self.levels
        for at in range(bisect_left(levels, share), len(levels)):
            partial = self.partial[levels[at]]
            if not self.held:
                name, position = partial.first()
                return self.nodes[name], [(position, share)]
            for name, position in sorted(partial.members):
                if name not in self.held:
                    return self.nodes[name], [(position, share)]
        for node in self._whole_candidates(1):
            position = node.free.index(UNIT)
            return node, [(position, share)]
        return None

    def place(self, share: int, replicas: int) -> list[tuple[PoolNode, list[tuple[int, int]]]] | None:
        """Every replica or none: placed one by one, undone on the first that does not fit."""
        placed: list[tuple[PoolNode, list[tuple[int, int]]]] = []
        for _ in range(replicas):
            fit = self._fit(share)
            if fit is None:
                for node, devices in reversed(placed):
                    self.give(node, devices)
                return None
            self.take(*fit)
            placed.append(fit)
        return placed


Placed = list[tuple[PoolNode, list[tuple[int, int]]]]  # (node, [(device position, thousandths)]) per replica
Spot = tuple[PoolNode, int]  # a device: its node, its position there


def place_shapes(pool: Pool, shapes: Sequence[tuple[int, int]]) -> Placed | None:
    """Every pod set of `shapes` ((thousandths per replica, replicas)) in `pool`, each by its own
    shape, or none: its replicas in order, the first pod set's first."""
    placed: Placed = []
    for share, replicas in shapes:
        if not share:
            continue
        more = pool.place(share, replicas)
        if more is None:
            for node, devices in reversed(placed):
                pool.give(node, devices)
            return None
        placed.extend(more)
    return placed


def place_apart(
    pool: Pool, devices: Sequence[tuple[PoolNode, int, int]], shapes: Sequence[tuple[int, int]]
) -> Placed | None:
    """`place_shapes` on `devices` alone ((node, position, free thousandths)), as `pool` would place
    there (binpack or spread), or None; nothing is taken: the caller takes what it uses from
    wherever those shares are kept."""
    by_node: dict[PoolNode, list[Device]] = defaultdict(list)
    for node, position, free in devices:
        by_node[node].append(Device(position, gpus_of(free)))  # positions stand in for indexes
    apart = [
        PoolNode(NodeInfo(node.name, node.cluster, node.gpu_type, tuple(found))) for node, found in by_node.items()
    ]
    placed = place_shapes(Pool(pool.cluster, pool.gpu_type, apart, pool.spread), shapes)
    if placed is None:
        return None
    real = {node.name: node for node in by_node}
    return [(real[node.name], [(node.indexes[p], share) for p, share in taken]) for node, taken in placed]


class Fences:
    """Devices kept out of their pools for reservations (each named by a key): whatever share of a
    device is free when it is fenced is taken out of its pool, so that no placement sees it until
    it is opened. What running work gives back there between two `lift`s goes to the pool, and is
    fenced again by the next round of `add`."""

    def __init__(self) -> None:
        self.taken: dict[Spot, int] = {}  # per device: the thousandths taken out of its pool
        self.covers: dict[Spot, list[str]] = {}  # per device: the keys that fence it
        self.in_pool: dict[Pool, list[Spot]] = defaultdict(list)  # the fenced devices of each pool
        self.of_key: dict[str, tuple[Pool, list[Spot]]] = {}  # each key's pool and devices

    def __bool__(self) -> bool:
        return bool(self.covers)

    def lift(self) -> None:
        """Give every fenced share back to its pool and forget the fences."""
        for pool, spots in self.in_pool.items():
            for node, position in spots:
                taken = self.taken[node, position]
                if taken:
                    pool.give(node, [(position, taken)])
        self.taken.clear()
        self.covers.clear()
        self.in_pool.clear()
        self.of_key.clear()

    def add(self, key: str, pool: Pool, node: PoolNode, position: int) -> None:
        """Fence a device for `key`: the first fence takes its free share out of the pool."""
        spot = (node, position)
        covers = self.covers.get(spot)
        if covers is None:
            covers = self.covers[spot] = []
            self.in_pool[pool].append(spot)
            free = node.free[position]
            self.taken[spot] = free
            if free:
                pool.take(node, [(position, free)])
        covers.append(key)
        self.of_key.setdefault(key, (pool, []))[1].append(spot)

    def taken_in(self, pool: Pool) -> int:
        """The thousandths fenced out of `pool` now: at most what opening its fences gives back."""
        return sum(self.taken[spot] for spot in self.in_pool.get(pool, ()))

    def open(self, pool: Pool, opens: Callable[[list[str]], bool]) -> list[Spot]:
        """Give back to `pool` the fenced devices whose keys `opens` lets through; `close` them again."""
        opened = [spot for spot in self.in_pool.get(pool, ()) if opens(self.covers[spot])]
        for spot in opened:
            taken = self.taken[spot]
            if taken:
                self.taken[spot] = 0
                pool.give(spot[0], [(spot[1], taken)])
        return opened

    def close(self, pool: Pool, opened: list[Spot]) -> None:
        """Fence again what is left free of the `opened` devices."""
        for node, position in opened:
            free = node.free[position]
            if free:
                pool.take(node, [(position, free)])
                self.taken[node, position] += free

    def free_of(self, key: str) -> tuple[Pool | None, list[tuple[PoolNode, int, int]]]:
        """`key`'s pool and its fenced devices with a free share: (node, position, thousandths)."""
        pool, spots = self.of_key.get(key, (None, []))
        return pool, [(n, p, self.taken[n, p]) for n, p in spots if self.taken[n, p]]

    def use(self, placed: Placed) -> None:
        """Work placed on fenced shares (`place_apart`) holds them now: they are no longer the fence's."""
        for node, devices in placed:
            for position, share in devices:
                self.taken[node, position] -= share
