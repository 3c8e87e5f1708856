"""Estimated starts: when each pending workload should start if all work runs its expected time and
the line is admitted as the portal admits it. Part of the pure scheduling core (no Django), worked
out by the engine's cycles with `explain` and by the trace replay's `--estimates`."""

from __future__ import annotations

import heapq
import math
from bisect import insort
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from apps.scheduling.ledger import Ledger
from apps.scheduling.placement import Fences, Pool, PoolNode
from apps.scheduling.types import UNIT, Policy, Reservation, Workload

# How much longer a run that has passed its expected runtime is expected to go on, as a share of how
# long it has run. Set on the Philly trace (docs/benchmarks.md) so that about as many jobs start
# before their estimate as after it: 0.75 puts 50% of the first 20,000 jobs' waiters before it and
# 56% of the whole trace's; 1 (as long again) put 56% and 61%, 0.5 put 40% of the first 20,000.
OVERRUN = 0.75

# How far down the line starts are estimated: the first LINE workloads, the rest none. A wait behind
# this many has no estimate worth the time (at 150,000 pending all of them cost an explained pass
# about 0.9 s, the first 20,000 about a tenth of that); work later in line that the portal would
# admit first by fair share is then left out of the play, which makes the estimates of the last of
# the LINE a little early at worst.
LINE = 20_000

BACKOFF = ("", "")  # the group of an event at which a backoff ends (no workspace is named "")

Shape = tuple[int, int, int]  # what a workload asks for: (units, its widest pod set's units, replicas)
Scope = tuple[str, ...]  # a count of GPUs that estimates follow: ("type", t), ("workspace", w, t), ("cohort", c, t)


class RunningWork(Protocol):
    @property
    def workload(self) -> Workload: ...

    @property
    def units(self) -> int: ...

    @property
    def held(self) -> Sequence[tuple[PoolNode, Sequence[tuple[int, int]]]]: ...


class EngineView(Protocol):
    """What estimates read of the engine's state, and never change."""

    @property
    def ledger(self) -> Ledger: ...

    @property
    def capacity(self) -> Mapping[str, int]: ...

    @property
    def cohort_lendable(self) -> Mapping[tuple[str, str], int]: ...

    @property
    def pools_by_type(self) -> Mapping[str, list[Pool]]: ...

    @property
    def fences(self) -> Fences: ...

    @property
    def running(self) -> Mapping[str, RunningWork]: ...

    @property
    def pending(self) -> Mapping[str, Workload]: ...

    @property
    def history(self) -> Mapping[tuple[str, str], float]: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def reservations(self) -> Sequence[Reservation]: ...


def _shape(workload: Workload) -> Shape:
    return (workload.units, workload.widest_units, workload.all_replicas)


def _several(workload: Workload) -> bool:
    """Whether it asks for several whole devices (on one node, or one per replica)."""
    return workload.widest_units >= UNIT and (workload.widest_units > UNIT or workload.all_replicas > 1)


class _Group:
    """The pending work of one workspace and GPU type in a pass of estimates: the counts it waits on
    and takes from, its workloads (indexes in the line, in line order) by how much each asks, and
    what ranks it."""

    __slots__ = (
        "by_need", "first", "key", "needs", "nominal", "past", "scale", "takes_from", "kept", "version", "waits_on",
    )  # fmt: skip

    def __init__(self, key: tuple[str, str], waits_on: list[Scope], takes_from: list[Scope]) -> None:
        self.key = key
        self.waits_on, self.takes_from = waits_on, takes_from
        # Its workloads by shape: (units, the widest pod set's units, replicas), in line order.
        self.by_need: dict[Shape, deque[int]] = {}
        self.needs: list[Shape] = []  # the keys of `by_need`, ascending (the least units first)
        self.nominal = 0
        self.past = 0.0  # decayed past use, in thousandths of a GPU over the half-life
        self.kept = 0  # the use it keeps up with work not yet submitted: its use now, within its nominal quota
        self.scale = 0.0  # 1 / (GPUs of its type x its workspace's weight), for its share
        self.version = 0  # an entry of it in its type's heap with another version is an old one
        self.first = -1  # the first of its workloads in line (-1: none left)

    def add(self, index: int, need: Shape) -> None:
        line = self.by_need.get(need)
        if line is None:
            line = self.by_need[need] = deque()
            insort(self.needs, need)
        line.append(index)
        if self.first < 0:
            self.first = index  # workloads are added in line order

    def first_fitting(self, space: int, moment: float, order: list[Workload], fits: Callable[[int], bool]) -> int:
        """The first of its workloads in line that asks for no more than `space`, may start at
        `moment` and `fits` the nodes (-1: none), taken out of the group. Of the workloads of one
        shape, only the first that may start is asked whether it fits the nodes."""
        best, best_need = -1, (0, 0, 0)
        first = self.first
        if first >= 0 and order[first].units <= space and order[first].eligible_at <= moment and fits(first):
            best, best_need = first, _shape(order[first])  # the first in line fits: none can come before it
        for need in self.needs if best < 0 else ():
            if need[0] > space:
                break
            line = self.by_need[need]
            for index in line:
                if order[index].eligible_at <= moment:
                    if (best < 0 or index < best) and fits(index):
                        best, best_need = index, need
                    break
                if best >= 0 and index > best:
                    break
        if best >= 0:
            line = self.by_need[best_need]
            if line[0] == best:
                line.popleft()
            else:
                line.remove(best)
            if not line:
                del self.by_need[best_need]
                self.needs.remove(best_need)
            if best == self.first:
                self.first = min((line[0] for line in self.by_need.values()), default=-1)
        return best


class _Nodes:
    """The whole free devices of one pool's nodes in a play of estimates, by node, and the nodes
    bucketed by how many they have; those held for a starving gang (`holder`, an index in the line)
    are in no bucket: no other work starts there."""

    __slots__ = ("buckets", "cluster", "free", "holder", "held", "spread", "whole")

    def __init__(self, pool: Pool, fenced: Counter[tuple[str, str]]) -> None:
        self.cluster, self.spread = pool.cluster, pool.spread
        # Devices fenced for reservations count as free: what a workload may not use of them,
        # `StartEstimates._after_reservations` says.
        self.whole = {name: node.whole + fenced[node.cluster, name] for name, node in pool.nodes.items()}
        self.buckets: list[dict[str, None]] = [{} for _ in range(pool.max_devices + 1)]
        for name in sorted(self.whole):
            self.buckets[self.whole[name]][name] = None
        self.held: list[str] = []
        self.holder = -1
        self.free = sum(self.whole.values())  # whole free devices on the nodes not held

    def room_for(self, count: int, replicas: int) -> bool:
        """Whether the nodes not held have room for `replicas` replicas of `count` whole devices."""
        found = 0
        for whole in range(len(self.buckets) - 1, count - 1, -1):
            found += len(self.buckets[whole]) * (whole // count)
            if found >= replicas:
                return True
        return False

    def held_room_for(self, count: int, replicas: int) -> bool:
        return sum(self.whole[name] // count for name in self.held) >= replicas

    def take(self, count: int, replicas: int) -> list[tuple[_Nodes, str, int]]:
        """Place the replicas (there is room: `room_for`), each on the fullest node it fits (the
        emptiest where the pool spreads work), as the portal places them; [(pool, node, devices)]."""
        taken = []
        buckets = self.buckets
        order = range(len(buckets) - 1, count - 1, -1) if self.spread else range(count, len(buckets))
        for _ in range(replicas):
            for whole in order:
                if buckets[whole]:
                    name = next(iter(buckets[whole]))
                    del buckets[whole][name]
                    buckets[whole - count][name] = None
                    self.whole[name] = whole - count
                    self.free -= count
                    taken.append((self, name, count))
                    break
        return taken

    def take_held(self, count: int, replicas: int) -> list[tuple[_Nodes, str, int]]:
        """Place the holder on its held nodes (there is room: `held_room_for`) and end the hold."""
        taken = []
        for name in self.held:
            while replicas and self.whole[name] >= count:
                self.whole[name] -= count
                taken.append((self, name, count))
                replicas -= 1
            self.buckets[self.whole[name]][name] = None
            self.free += self.whole[name]
        self.held, self.holder = [], -1
        return taken

    def hold(self, holder: int, count: int, replicas: int) -> None:
        """Hold nodes for a starving gang: those with the most whole free devices, one per replica
        (as the portal holds them), taken out of the buckets."""
        for whole in range(len(self.buckets) - 1, -1, -1):
            while self.buckets[whole] and len(self.held) < replicas:
                name = min(self.buckets[whole])  # the least name, as the portal chooses
                del self.buckets[whole][name]
                self.held.append(name)
                self.free -= whole
            if len(self.held) == replicas:
                break
        if len(self.held) < replicas:
            self.release()
            return
        self.holder = holder

    def release(self) -> None:
        for name in self.held:
            self.buckets[self.whole[name]][name] = None
            self.free += self.whole[name]
        self.held, self.holder = [], -1

    def give(self, name: str, count: int) -> None:
        whole = self.whole[name]
        self.whole[name] = more = min(whole + count, len(self.buckets) - 1)
        if name not in self.held:
            del self.buckets[whole][name]
            self.buckets[more][name] = None
            self.free += more - whole


class _Fits:
    """Whether a workload of the line fits the nodes the play follows at its moment, and where it
    goes: whole devices of one node per replica, in the first of its pools with room (as the
    portal places it). A gang that has waited `starvation_s`, whose counts have room for it but
    whose nodes have none, has nodes held for it as the portal holds them, where none are held yet:
    no other work starts there, and it starts there once they have room."""

    __slots__ = ("found", "gangs", "moment", "nodes", "order", "starvation_s")

    def __init__(self, order: list[Workload], nodes: dict[str, list[_Nodes]], starvation_s: float) -> None:
        self.order, self.nodes, self.starvation_s = order, nodes, starvation_s
        self.moment = 0.0
        # Per type followed, how many of its waiting workloads ask for several whole devices: once
        # all of them have started, its nodes are no longer followed (its count says the rest).
        self.gangs = Counter(w.gpu_type for w in order if w.gpu_type in nodes and _several(w)) if nodes else Counter()
        self.found: tuple[int, _Nodes | None] = (-1, None)  # the last workload found to fit, and where

    def _pools(self, workload: Workload) -> list[_Nodes]:
        pools = self.nodes[workload.gpu_type]
        return [p for p in pools if p.cluster == workload.cluster] if workload.cluster else pools

    def __call__(self, index: int) -> bool:
        workload = self.order[index]
        if workload.gpu_type not in self.nodes or workload.widest_units < UNIT:
            return True  # a share of a device: its count says where it fits
        if workload.widest_units == UNIT and workload.all_replicas == 1 and not workload.cluster:
            for pool in self.nodes[workload.gpu_type]:  # one device, anywhere
                if pool.free:
                    self.found = (index, pool)
                    return True
            return False
        count, replicas = workload.widest_units // UNIT, workload.all_replicas
        pools = self._pools(workload)
        holding = False
        for pool in pools:
            if pool.holder == index:
                holding = True
                if pool.held_room_for(count, replicas):
                    self.found = (index, pool)
                    return True
            elif pool.room_for(count, replicas):
                self.found = (index, pool)
                return True
        starving = _several(workload) and self.moment - workload.submitted_at >= self.starvation_s
        if starving and not holding:
            for pool in pools:
                if pool.holder < 0:
                    pool.hold(index, count, replicas)
                    if pool.holder == index:
                        break
        return False

    def place(self, index: int) -> list[tuple[_Nodes, str, int]]:
        """Take the devices of a workload that fits (see `__call__`); [(pool, node, devices)]."""
        workload = self.order[index]
        if workload.widest_units < UNIT:
            return []
        if self.found[0] != index and not self(index):
            return []  # not asked before it was chosen (it fits: `starts` asks first); nothing to place
        pool = self.found[1]
        if pool is None:
            return []
        count, replicas = workload.widest_units // UNIT, workload.all_replicas
        several = count > 1 or replicas > 1 or workload.widest_units > UNIT
        if pool.holder == index:
            taken = pool.take_held(count, replicas)
        else:
            for other in self._pools(workload) if several else ():
                if other.holder == index:
                    other.release()  # it found room elsewhere
            taken = pool.take(count, replicas)
        if several:
            self.gangs[workload.gpu_type] -= 1
            if not self.gangs[workload.gpu_type]:
                del self.nodes[workload.gpu_type]
        return taken


class StartEstimates:
    """One pass of estimates over the engine's state as it is now."""

    def __init__(self, engine: EngineView) -> None:
        self.engine = engine
        self.ledger = engine.ledger
        self.lendable = engine.cohort_lendable

    @staticmethod
    def _runtime(workload: Workload) -> float:
        """How long a run should last: its expected runtime capped by its declared limit, else that
        limit; unknown (inf) without either."""
        expected, limit = workload.expected_runtime_s, workload.max_runtime_s
        if expected is None:
            return math.inf if limit is None else limit
        return expected if limit is None else min(expected, limit)

    def _expected_end(self, workload: Workload, now: float) -> float:
        """When running work should end: at start + its runtime while that is ahead. A run past it
        goes on for OVERRUN (three quarters) of the time it has run so far (runtimes are heavy-tailed:
        the longer a run has lasted, the longer it is likely to last), but never past its declared
        limit; once that has passed too, or with no runtime at all, its end is unknown (inf). Never
        `now` or before."""
        started = now if workload.started_at is None else workload.started_at
        end = started + self._runtime(workload)
        if end > now:
            return end
        end = now + max(OVERRUN * (now - started), 1.0)
        if workload.max_runtime_s is not None:
            end = min(end, started + workload.max_runtime_s)
        return end if end > now else math.inf

    def estimate(self, now: float, order: list[Workload]) -> dict[str, float]:
        """When each workload of `order` (the start of the line: priority, then submission) should
        start, as `starts` works it out over the line: work later in line takes GPUs before work
        ahead of it where it goes first, so all of it is played forward, down to the first `LINE`."""
        order = order[:LINE]
        keys = {workload.key for workload in order}
        rest = sorted(
            (w for w in self.engine.pending.values() if w.key not in keys), key=lambda w: (-w.priority, w.seq, w.key)
        )
        starts = self.starts(now, [*order, *rest[: LINE - len(order)]])
        return {workload.key: start for workload, start in zip(order, starts, strict=False) if start is not None}

    def starts(self, now: float, order: list[Workload]) -> list[float | None]:
        """When each workload of the line `order` should start if everything runs its expected time:
        None where it gives none.

        The line is played forward as the portal admits it. Running work ends as `_expected_end`
        says. At each moment work ends, the waiting work of each workspace and GPU type goes in the
        order of the portal's pass (work within its workspace's nominal quota first, then the lower
        fair share), and in line order within it; every workload that its counts (`_counts`) have
        room for starts, holds its GPUs for its `_runtime`, and adds to its workspace's use, and so
        to its share; one that does not fit does not stop the ones behind it (backfill). Where work
        of several whole devices waits, it must also fit the nodes of its type (`_Fits`), which the
        play follows. A workspace none of whose work waits keeps what it uses now, within its nominal
        quota, for its next work: what of that ends is kept as long again as the longest run that
        ended then, and only then given to others. A workload that never
        finds room (behind work of unknown end) has no estimate. Preemption is not modelled:
        reclaimed quota may come back earlier.
        """
        inf = math.inf
        room: dict[Scope, int] = {}
        used: dict[tuple[str, str], int] = {}
        groups: dict[tuple[str, str], _Group] = {}
        # When work ends, or waits out a backoff (group ("", "")): (moment, group); the units that
        # end then, per (moment, group), are added up in `ending`.
        events: list[tuple[float, tuple[str, str]]] = []
        ending: dict[tuple[float, tuple[str, str]], int] = {}
        lasted: dict[tuple[float, tuple[str, str]], float] = {}  # how long the longest run ending then ran
        # The units kept by a workspace for its next work (see below) that end then.
        replaced: dict[tuple[float, tuple[str, str]], int] = {}
        soonest: dict[str, float] = {}  # per type: the next end of running work
        nodes = self._nodes(order)
        # The whole devices that work of the types whose nodes are followed gives back, per moment.
        giving: dict[float, list[tuple[_Nodes, str, int]]] = {}
        for running in self.engine.running.values():
            w = running.workload
            if running.units:
                end = self._expected_end(w, now)
                if end < inf:
                    if w.gpu_type in nodes:
                        self._gives_back(running, nodes[w.gpu_type], giving.setdefault(end, []))
                    key = (w.workspace, w.gpu_type)
                    if key not in groups:
                        self._make_group(key, room, used, groups)
                    length = end - (now if w.started_at is None else w.started_at)
                    if (end, key) in ending:
                        ending[end, key] += running.units
                        lasted[end, key] = max(lasted[end, key], length)
                    else:
                        ending[end, key] = running.units
                        lasted[end, key] = length
                        events.append((end, key))
                    if end < soonest.get(w.gpu_type, inf):
                        soonest[w.gpu_type] = end
        for index, workload in enumerate(order):
            need = workload.units
            if need:
                key = (workload.workspace, workload.gpu_type)
                group = groups.get(key) or self._make_group(key, room, used, groups)
                group.add(index, _shape(workload))
                if workload.eligible_at > now:
                    events.append((workload.eligible_at, BACKOFF))
        heapq.heapify(events)
        starts: list[float | None] = [None] * len(order)
        heappush, heappop = heapq.heappush, heapq.heappop
        # Per GPU type, the groups with work waiting, by rank (an entry whose version is not its
        # group's is an old one); those a count other than their type's GPUs has no room for are
        # parked on it, out of the heap, until work it holds ends.
        heaps: dict[str, list[tuple[int, float, tuple[str, str], int]]] = {}
        parked: dict[Scope, list[_Group]] = {}
        # Per type, the least any waiting workload asks: with less room than that, none can start (the
        # least only grows as work starts), and the groups are not looked at.
        least_need: dict[str, int] = {}
        for group in groups.values():
            if group.needs:
                heaps.setdefault(group.key[1], []).append(self._rank(group, order, used))
                gpu_type = group.key[1]
                least_need[gpu_type] = min(least_need.get(gpu_type, group.needs[0][0]), group.needs[0][0])
        for heap in heaps.values():
            heapq.heapify(heap)
        moment = now
        fits = _Fits(order, nodes, self.engine.policy.starvation_s)
        while True:
            fits.moment = moment
            for gpu_type, heap in heaps.items():
                gpus: Scope = ("type", gpu_type)
                skipped = []
                entry: tuple[int, float, tuple[str, str], int] | None = None
                floor = least_need[gpu_type]
                while entry is not None or heap:
                    if room[gpus] < floor:  # no waiting workload of the type fits: none starts now
                        if entry is not None:
                            skipped.append(entry)
                        break
                    if entry is None:
                        entry = heappop(heap)
                    group = groups[entry[2]]
                    if entry[3] != group.version:
                        entry = None
                        continue
                    waits_on, least = group.waits_on, group.needs[0][0]
                    space = room[gpus]
                    short: Scope | None = None
                    for scope in waits_on[1:]:
                        if room[scope] < least:
                            short = scope
                            break
                        if room[scope] < space:
                            space = room[scope]
                    if short is not None:
                        parked.setdefault(short, []).append(group)
                        entry = None
                        continue
                    index = group.first_fitting(space, moment, order, fits) if space >= least else -1
                    if index < 0:
                        skipped.append(entry)
                        entry = None
                        continue
                    workload = order[index]
                    start = moment
                    if start <= now:
                        # The counts have room now, yet it did not start: what they leave out (placement,
                        # a node held, the cluster it asked for) holds it until at least the next end of
                        # its type.
                        start = soonest.get(gpu_type, inf)
                    need = workload.units
                    for scope in group.takes_from:
                        room[scope] -= need
                    used[group.key] += need
                    placed = fits.place(index) if gpu_type in nodes else []
                    if start < inf:
                        starts[index] = start
                        end = start + self._runtime(workload)
                        if end < inf:
                            if placed:
                                giving.setdefault(end, []).extend(placed)
                            at = (end, group.key)
                            if at in ending:
                                ending[at] += need
                                lasted[at] = max(lasted[at], end - start)
                            else:
                                ending[at] = need
                                lasted[at] = end - start
                                heappush(events, at)
                    entry = None
                    if group.needs:
                        entry = self._rank(group, order, used)
                        if heap and heap[0] < entry:  # another group goes next
                            heappush(heap, entry)
                            entry = None
                for old in skipped:
                    heappush(heap, old)
            if not events:
                break
            moment = events[0][0]
            changed: dict[tuple[str, str], _Group] = {}  # groups woken, or whose share changed
            while events and events[0][0] <= moment:
                at = heappop(events)
                freed = at[1]
                if freed is BACKOFF:
                    continue
                units = ending.pop(at, 0)
                back = units + replaced.pop(at, 0)
                group = changed[freed] = groups[freed]
                used[freed] -= back
                if units and not group.needs and used[freed] < group.kept:
                    # None of its work waits: its next work, not submitted yet, takes what ends first
                    # (within its nominal quota, it goes before any borrower), and runs as long as the
                    # longest of those that ended.
                    kept = min(units, group.kept - used[freed])
                    used[freed] += kept
                    back -= kept
                    again = (moment + lasted.get(at, 0.0), freed)
                    if again in replaced:
                        replaced[again] += kept
                    else:
                        replaced[again] = kept
                        heappush(events, again)
                lasted.pop(at, None)
                for scope in group.takes_from:
                    room[scope] += back
                    for woken in parked.pop(scope, ()):
                        changed[woken.key] = woken
            for pool, name, count in giving.pop(moment, ()):
                pool.give(name, count)
            for group in changed.values():
                if group.needs:
                    heappush(heaps[group.key[1]], self._rank(group, order, used))
        if self.engine.reservations:
            self._after_reservations(now, order, starts)
        return starts

    def _nodes(self, order: list[Workload]) -> dict[str, list[_Nodes]]:
        """The pools whose nodes the play follows: those of the types some waiting work of several
        whole devices asks for (where all work asks for one device, or a share of one, the count
        of GPUs says where it fits)."""
        types = {w.gpu_type for w in order if _several(w)}
        if not types:
            return {}
        taken = self.engine.fences.taken
        fenced = Counter((node.cluster, node.name) for (node, _), units in taken.items() if units == UNIT)
        return {t: [_Nodes(pool, fenced) for pool in self.engine.pools_by_type.get(t, [])] for t in types}

    @staticmethod
    def _gives_back(running: RunningWork, pools: list[_Nodes], into: list[tuple[_Nodes, str, int]]) -> None:
        """The whole devices that running work gives back to the nodes when it ends (a share of a
        device is not followed: the device is taken to stay in use)."""
        for node, devices in running.held:
            count = sum(1 for _, units in devices if units == UNIT)
            for pool in pools:
                if count and pool.cluster == node.cluster and node.name in pool.whole:
                    into.append((pool, node.name, count))
                    break

    def _after_reservations(self, now: float, order: list[Workload], starts: list[float | None]) -> None:
        """No estimate earlier than the end of the reservations a workload needs: those of other
        workspaces, not ended, that it is not declared to end before, whose devices it could not do
        without (counted on the empty nodes; see `reserved_until`)."""
        known: dict[tuple[str, str, str | None, int, int, float | None], float] = {}
        for index, workload in enumerate(order):
            start = starts[index]
            if start is None or not workload.units:
                continue
            shape = (workload.workspace, workload.gpu_type, workload.cluster, workload.widest_units,
                     workload.all_replicas, workload.max_runtime_s)  # fmt: skip
            until = known.get(shape)
            if until is None:
                pools = self.engine.pools_by_type.get(workload.gpu_type, [])
                if workload.cluster:
                    pools = [pool for pool in pools if pool.cluster == workload.cluster]
                until = known[shape] = reserved_until(workload, now, self.engine.reservations, pools)
            if until > start:
                starts[index] = until

    def _make_group(
        self,
        key: tuple[str, str],
        room: dict[Scope, int],
        used: dict[tuple[str, str], int],
        groups: dict[tuple[str, str], _Group],
    ) -> _Group:
        """The group of a workspace and type, its counts' room now and its use (made on first use)."""
        name, gpu_type = key
        waits_on, takes_from = self._counts(name, gpu_type)
        for scope in takes_from:
            if scope not in room:
                room[scope] = self._room(scope)
        group = groups[key] = _Group(key, waits_on, takes_from)
        used[key] = self.ledger.used.get(key, 0)
        group.nominal = self.ledger.nominal(name, gpu_type)
        capacity = self.engine.capacity.get(gpu_type, 0)
        weight = max(self.ledger.workspace(name).weight, 1e-6)
        group.scale = 1.0 / (capacity * weight) if capacity else 0.0  # no GPUs of the type: nothing fits
        group.past = self.engine.history.get(key, 0.0) * UNIT / self.engine.policy.half_life_s
        group.kept = min(group.nominal, used[key])
        return group

    @staticmethod
    def _rank(
        group: _Group, order: list[Workload], used: dict[tuple[str, str], int]
    ) -> tuple[int, float, tuple[str, str], int]:
        """Where the group's next workload goes in the portal's pass: within its workspace's nominal
        quota before borrowing, then the lower share of the GPUs of its type (use now and past use);
        with a new version of the group's entry, which makes any earlier one old."""
        key = group.key
        use = used[key]
        within = use + order[group.first].units <= group.nominal
        group.version += 1
        return (0 if within else 1, (use + group.past) * group.scale, key, group.version)

    def _counts(self, name: str, gpu_type: str) -> tuple[list[Scope], list[Scope]]:
        """(the counts a workload of this workspace and type must find room in, those its GPUs take
        from): the cluster's GPUs of the type, first; its workspace's quota, up to all it could ever
        borrow; and, where it may borrow, its cohort's quotas together, which bound what the cohort's
        workspaces hold however they lend and borrow (work of all of them takes from that count).

        A quota count at least as large as the cluster's GPUs of the type is left out: it always has
        at least as much room as the GPUs' count (it starts with as much, and what runs outside it
        only lowers the GPUs' count), so it could never be the one to wait for. So is the quota count
        of a workspace that borrows within its cohort and could hold all of the cohort's quotas: the
        cohort's count has at most as much room at any time (it starts with no more, and the other
        workspaces' work takes from it alone), so it is always the one waited for."""
        capacity = self.engine.capacity.get(gpu_type, 0)
        gpus: Scope = ("type", gpu_type)
        ws = self.ledger.workspace(name)
        cohort: list[Scope] = []
        cohort_quota = 0
        if ws.cohort is not None and self.ledger.borrowing:
            cohort_quota = self._cohort_quota(ws.cohort, gpu_type)
            if cohort_quota < capacity:
                cohort.append(("cohort", ws.cohort, gpu_type))
        quota: list[Scope] = []
        ceiling = self.ledger.ceiling(name, gpu_type, self.lendable)
        if ceiling < capacity and not (cohort and ws.can_borrow and ceiling >= cohort_quota):
            quota.append(("workspace", name, gpu_type))
        return [gpus, *quota, *(cohort if ws.can_borrow else [])], [gpus, *quota, *cohort]

    def _members(self, cohort: str) -> list[str]:
        return [ws.name for ws in self.ledger.workspaces.values() if ws.cohort == cohort]

    def _cohort_quota(self, cohort: str, gpu_type: str) -> int:
        return sum(self.ledger.nominal(m, gpu_type) for m in self._members(cohort))

    def _room(self, scope: Scope) -> int:
        """What a count has free now: idle GPUs of the type; what the workspace may still take (up to
        all it could ever borrow: the idle quota lent to it grows as others' work ends, which the
        cohort's count follows); the cohort's quotas less their use."""
        if scope[0] == "type":
            return sum(p.free_units for p in self.engine.pools_by_type.get(scope[1], []))
        if scope[0] == "workspace":
            _, name, gpu_type = scope
            return self.ledger.ceiling(name, gpu_type, self.lendable) - self.ledger.used[name, gpu_type]
        _, cohort, gpu_type = scope
        return self._cohort_quota(cohort, gpu_type) - sum(self.ledger.used[m, gpu_type] for m in self._members(cohort))


def reserved_until(workload: Workload, now: float, reservations: Sequence[Reservation], pools: list[Pool]) -> float:
    """The earliest moment from which `workload` fits one of `pools` (counted on their empty nodes,
    its pod sets as replicas of the widest) without the devices of the reservations that stand in
    its way then: other workspaces' reservations not yet ended that it is not declared to end
    before. `now` if it fits beside all of them; `now` too if it never fits (that is said
    elsewhere)."""
    limit = workload.max_runtime_s
    blocking = [
        r for r in reservations
        if r.end > now and r.workspace != workload.workspace and r.gpu_type == workload.gpu_type
        and not (limit is not None and now + limit <= r.start)
    ]  # fmt: skip
    share, replicas = workload.widest_units, workload.all_replicas
    for moment in sorted({now, *(r.end for r in blocking)}):
        for pool in pools:
            reserved = Counter(
                name for r in blocking if r.end > moment and r.cluster == pool.cluster for name, _ in set(r.devices)
            )
            if _holds(pool, reserved, share, replicas):
                return moment
    return now


def _holds(pool: Pool, reserved: Counter[str], share: int, replicas: int) -> bool:
    """Whether the pool's nodes, empty but for `reserved` devices (a count per node), hold `replicas`
    replicas of `share` thousandths: whole devices on one node each, or shares of one device."""
    per_device = UNIT // share if share < UNIT else 0
    per_replica = max(1, share // UNIT)
    held = 0
    for node in pool.nodes.values():
        devices = max(0, node.capacity - reserved.get(node.name, 0))
        held += devices * per_device if per_device else devices // per_replica
    return held >= replicas
