"""The scheduling engine: plain data in, decisions out.

Pure on purpose: no Django, ORM or backend imports, so it can be tested on its own and replayed
on traces in simulated time. The same snapshot always gives the same decisions.

`schedule(snapshot)` is one cycle over a snapshot. `Engine` is the same scheduler kept alive
between cycles (the trace replay feeds it submissions and completions as they happen).

Policies:
- ``portal``: quotas per workspace and GPU type, borrowing of a cohort's idle quota, fair share
  across workspaces (dominant-resource shares divided by weight, with decayed history), priority
  within a workspace, bounded preemption (reclaiming borrowed GPUs, or making room for higher
  priority work in the same workspace), backfill with a reservation for starving gangs.
- ``fifo``: what labs run today: each workspace a hard quota and its own FIFO queue that stops
  at the first workload that does not fit; no borrowing, no preemption.
- ``shared``: what a default Slurm backfill scheduler does: one cluster-wide queue in submission
  order, no quotas and no fairness; a workload that does not fit does not block those behind it,
  except that a starving gang has nodes held for it. No preemption.

Quantities are kept internally in thousandths of a GPU (ints), so fractional GPUs add up exactly.
"""

from __future__ import annotations

import heapq
import itertools
import time
from bisect import bisect_left, insort
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import cast

from apps.scheduling.estimates import LINE as ESTIMATED_LINE
from apps.scheduling.estimates import StartEstimates
from apps.scheduling.ledger import Ledger
from apps.scheduling.placement import Fences, Placed, Pool, PoolNode, place_apart, place_shapes
from apps.scheduling.preemption import Preemption
from apps.scheduling.types import (
    UNIT,
    Admit,
    Decisions,
    Device,
    NodeInfo,
    Pending,
    PendingList,
    Policy,
    Preempt,
    Quota,
    Reject,
    ReplicaPlacement,
    Reservation,
    Snapshot,
    Workload,
    WorkspaceInfo,
    fmt_units,
    gpus_of,
    units_of,
)


@dataclass(eq=False)  # one per running workload: compared by identity
class _Running:
    workload: Workload
    pool: Pool | None
    held: list[tuple[PoolNode, list[tuple[int, int]]]]
    units: int


Item = tuple[int, int, str, int]  # (-priority, seq, key, the number of its shape in its queue)


@dataclass
class _Queue:
    """One workspace's pending workloads, in (priority, submission) order."""

    items: list[Item] = field(default_factory=list)
    shapes: Counter[Shape] = field(default_factory=Counter)  # how many of each shape it holds
    # Each shape the queue has held, numbered in the order first seen (kept: a few per queue), so
    # that its items say their shape without a lookup of the workload. Work of several pod sets is
    # numbered by its pod sets as well (its refusals differ from a plain shape's): see `grouped`.
    numbers: dict[tuple[Shape, PodSets], int] = field(default_factory=dict)
    kinds: list[tuple[Shape, bool]] = field(default_factory=list)  # per number: its shape, several pod sets
    counts: Counter[int] = field(default_factory=Counter)  # how many of each number it holds
    gangs_since: list[float] = field(default_factory=list)  # the gangs' submission times, in order
    eligible: list[float] = field(default_factory=list)  # every workload's eligible_at, in order
    declared: int = 0  # how many declare a limit (max_runtime_s): those may backfill held nodes

    def number(self, workload: Workload) -> int:
        shape = shape_of(workload)
        key = (shape, workload.shapes if workload.more else ())
        number = self.numbers.get(key)
        if number is None:
            number = self.numbers[key] = len(self.numbers)
            self.kinds.append((shape, bool(workload.more)))
        return number

    def add(self, workload: Workload) -> None:
        number = self.number(workload)
        insort(self.items, (-workload.priority, workload.seq, workload.key, number))
        self.shapes[self.kinds[number][0]] += 1
        self.counts[number] += 1
        insort(self.eligible, workload.eligible_at)
        if is_gang(workload):
            insort(self.gangs_since, workload.submitted_at)
        if workload.max_runtime_s is not None:
            self.declared += 1

    def remove(self, workload: Workload) -> None:
        items = self.items
        # The items are in order, and no two have the same key: its item is the first at or after
        # (-priority, seq, key), found by bisection rather than a scan; its number says its shape.
        at = bisect_left(items, (-workload.priority, workload.seq, workload.key))
        if at == len(items) or items[at][2] != workload.key:
            raise ValueError(f"{workload.key} is not in its queue")
        number = items[at][3]
        del items[at]
        shape = self.kinds[number][0]
        self.shapes[shape] -= 1
        if not self.shapes[shape]:
            del self.shapes[shape]
        self.counts[number] -= 1
        if not self.counts[number]:
            del self.counts[number]
        del self.eligible[bisect_left(self.eligible, workload.eligible_at)]
        if is_gang(workload):
            del self.gangs_since[bisect_left(self.gangs_since, workload.submitted_at)]
        if workload.max_runtime_s is not None:
            self.declared -= 1

    def waiting_out_backoff(self, now: float) -> bool:
        """Whether any of its workloads is still requeued with backoff at `now` (eligible later)."""
        return bool(self.eligible) and self.eligible[-1] > now


class _Line:
    """The pending workloads in the cluster's queue order (priority, then submission), kept as they
    come instead of sorted at each explained pass: per priority, those that came in order in a dict
    (its order is theirs), and those that came out of order (work evicted back to its old place, or
    submitted behind later work) aside, merged in when the line is read and folded in once many."""

    FOLD = 512  # out-of-order workloads of one priority kept aside before they are folded in

    def __init__(self) -> None:
        self.in_order: dict[int, dict[str, Workload]] = {}
        self.aside: dict[int, dict[str, Workload]] = {}
        self.last: dict[int, tuple[int, str]] = {}  # per priority, the latest (seq, key) in order

    def add(self, workload: Workload) -> None:
        priority, place = workload.priority, (workload.seq, workload.key)
        if priority not in self.in_order:
            self.in_order[priority], self.aside[priority] = {}, {}
        if place > self.last.get(priority, (-1 << 62, "")):
            self.in_order[priority][workload.key] = workload
            self.last[priority] = place
        else:
            self.aside[priority][workload.key] = workload

    def remove(self, workload: Workload) -> None:
        in_order = self.in_order[workload.priority]
        if in_order.pop(workload.key, None) is None:
            del self.aside[workload.priority][workload.key]

    def workloads(self) -> list[Workload]:
        return self.with_keys()[0]

    def with_keys(self) -> tuple[list[Workload], list[str]]:
        """The line, and its workloads' keys in the same order."""
        line: list[Workload] = []
        keys: list[str] = []
        for priority in sorted(self.in_order, reverse=True):
            if self.aside[priority]:
                merged = self._merged(priority)
                line += merged
                keys += [workload.key for workload in merged]
            else:
                line += self.in_order[priority].values()
                keys += self.in_order[priority]  # its keys, in the same order
        return line, keys

    def _merged(self, priority: int) -> list[Workload]:
        """The workloads of one priority in order: those aside put in their places among the others."""
        in_order, aside = list(self.in_order[priority].values()), sorted(self.aside[priority].values(), key=_place)
        merged: list[Workload] = []
        start = 0
        for workload in aside:
            at = bisect_left(in_order, _place(workload), lo=start, key=_place)
            merged += in_order[start:at]
            merged.append(workload)
            start = at
        merged += in_order[start:]
        if len(aside) >= self.FOLD:
            self.in_order[priority] = {w.key: w for w in merged}
            self.aside[priority] = {}
            self.last[priority] = _place(merged[-1])
        return merged


def _place(workload: Workload) -> tuple[int, str]:
    return (workload.seq, workload.key)


Shape = tuple[str, str | None, int, int]  # GPU type, cluster asked for, thousandths per replica, replicas
PodSets = tuple[tuple[int, int], ...]  # (thousandths per replica, replicas) per pod set; () for one


def shape_of(workload: Workload) -> Shape:
    """Its shape; several pod sets count as replicas of the widest (as preemption makes room)."""
    if workload.more:
        return (workload.gpu_type, workload.cluster, workload.widest_units, workload.all_replicas)
    return (workload.gpu_type, workload.cluster, workload.replica_units, workload.replicas)


_NONE: frozenset[int] = frozenset()
_item_key: Callable[[Item], str] = itemgetter(2)
_item_shape: Callable[[Item], int] = itemgetter(3)


def is_gang(workload: Workload) -> bool:
    """Several replicas, or more than one GPU: what may starve behind smaller work."""
    return workload.all_replicas > 1 or workload.widest_units > UNIT


class _Settled:
    """The workspaces whose whole queue left in a pass is of shapes refused without side effects
    (see Engine._refused_shapes), for what the pass knows now (`known`: use, what it remembers of
    refusals, whether preemption searches are left). Once every workspace still in line is, the
    rest of a pass without explain would refuse item after item and change nothing."""

    __slots__ = ("known", "names")

    def __init__(self) -> None:
        self.known: tuple[int, int, bool] | None = None
        self.names: set[str] = set()

    def add(self, name: str, known: tuple[int, int, bool]) -> None:
        if known != self.known:
            self.known, self.names = known, set()
        self.names.add(name)

    def covers(self, heap: list[tuple[int, float, str]], known: tuple[int, int, bool]) -> bool:
        names = self.names
        return known == self.known and len(heap) <= len(names) and all(entry[2] in names for entry in heap)


# --- The engine ----------------------------------------------------------------------------------


class Engine:
    """The scheduler's state between cycles: nodes, running workloads, per-workspace queues."""

    def __init__(
        self, workspaces: tuple[WorkspaceInfo, ...], nodes: tuple[NodeInfo, ...], policy: Policy | None = None
    ):
        policy = policy or Policy()
        self.policy = policy
        self.fifo = policy.name == "fifo"
        self.shared = policy.name == "shared"  # no quotas: see _try_admit
        self.ledger = Ledger({w.name: w for w in workspaces}, borrowing=policy.name == "portal")
        groups: dict[tuple[str, str], list[PoolNode]] = defaultdict(list)
        for info in nodes:
            groups[info.cluster, info.gpu_type].append(PoolNode(info))
        placement = dict(policy.placement_by_cluster)
        self.pools = {
            key: Pool(key[0], key[1], group, placement.get(key[0], policy.placement) == "spread")
            for key, group in sorted(groups.items())
        }
        self.pools_by_type: dict[str, list[Pool]] = defaultdict(list)
        for pool in self.pools.values():
            self.pools_by_type[pool.gpu_type].append(pool)
        self.capacity: dict[str, int] = defaultdict(int)
        for pool in self.pools.values():
            self.capacity[pool.gpu_type] += pool.capacity
        self.cohort_lendable: dict[tuple[str, str], int] = defaultdict(int)
        for ws in workspaces:
            for quota in ws.quotas:
                self.ledger.register(ws.name, quota.gpu_type)
                if ws.cohort is not None:
                    self.cohort_lendable[ws.cohort, quota.gpu_type] += self.ledger.most_lent(ws.name, quota.gpu_type)
        self.history: dict[tuple[str, str], float] = defaultdict(float)
        for ws in workspaces:
            for gpu_type, gpu_seconds in ws.history:
                self.history[ws.name, gpu_type] = gpu_seconds
        self.clock: float | None = None
        self.shares: dict[str, float] = {}  # see _share
        self.running: dict[str, _Running] = {}
        self.running_by: dict[tuple[str, str], dict[str, _Running]] = defaultdict(dict)  # (workspace, type)
        self.on_node: dict[PoolNode, dict[str, _Running]] = defaultdict(dict)  # what runs on each node
        self.priorities: dict[tuple[str, str], Counter[int]] = defaultdict(Counter)  # of running, per same key
        self.pending: dict[str, Workload] = {}
        self.line = _Line()  # the same workloads in the line's order
        self.queues: dict[str, _Queue] = defaultdict(_Queue)
        self.slot_counts: dict[tuple[str, str, int], int] = {}  # see _slots
        self.rejected: list[Reject] = []
        self.admitted_now: set[str] = set()  # admitted in the current cycle: never its victims
        # Held for starving gangs in the current cycle (see _hold_for): a workspace's quota of a type,
        # (gang key, latest declared end of what it waits for); and pools' held nodes, the same end.
        self.held_quota: dict[tuple[str, str], tuple[str, float | None]] = {}
        self.held_until: dict[tuple[str, str], float | None] = {}  # per pool (cluster, type)
        # Shapes no placement was found for in the current pass, per (GPU type, cluster asked for), as
        # (thousandths per replica, replicas): a shape at least as large in both fits no better, until
        # evictions give devices back (see _unplaceable).
        self.unplaceable: dict[tuple[str, str | None], list[tuple[int, int]]] = defaultdict(list)
        # The same for the second try on reservations' fenced devices (_try_place_fenced), per (GPU type,
        # cluster asked for, preemptible): the devices a workload may open depend on that alone when
        # it declares no limit.
        self.fenced_unplaceable: dict[tuple[str, str | None, bool], list[tuple[int, int]]] = defaultdict(list)
        self.memos = 0  # changes with what a pass knows of refusals: see _refused_shapes
        # Per workspace, the shapes of its queue known to be refused, and what that holds for: see _refused_shapes.
        self.fits_something: dict[str, tuple[tuple[int, int, bool, int], frozenset[int]]] = {}
        # False: every workload is examined one by one, as the pass would without its shortcuts (a
        # queue refused at once, a refusal's reason reused); the same decisions and reasons, slower
        # (tests compare the two, with the ledger's remembered answers off too).
        self.shortcuts = True
        self.preemption = Preemption(
            policy, self.ledger, self.running_by, self.priorities, self._try_place, self._pools_for
        )
        # Whether the last cycle left work that may preempt without a search, its searches used up
        # (max_preemption_tries): a later cycle may decide otherwise even if nothing else changes.
        self.cut_short = False
        self.wanting: dict[str, frozenset[str]] | None = None  # per pass, see _would_borrow
        # Reservations (see set_reservations): all of them, by key, those not yet ended in the current
        # pass, their fenced devices, and the running work placed on one (uncounted while it is active).
        self.reservations: tuple[Reservation, ...] = ()
        self.reservation_by_key: dict[str, Reservation] = {}
        self.unended: tuple[Reservation, ...] = ()
        self.fences = Fences()
        self.reserved_runs: dict[str, _Running] = {}
        # Per reservation under way: the largest of its holder's waiting work that fits it (see
        # _claim), which the holder's smaller work may not crowd out of it.
        self.claims: dict[str, Workload] = {}

    # -- feeding it --------------------------------------------------------------------------------

    def set_reservations(self, reservations: Sequence[Reservation]) -> None:
        """The approved reservations, ended ones included or not (those are ignored); they take
        effect at the next `cycle`. Call it before `submit`, so that work only a reservation of its
        workspace can hold is not rejected as never fitting."""
        self.reservations = tuple(sorted(reservations, key=lambda r: (r.start, r.key)))
        self.reservation_by_key = {r.key: r for r in self.reservations}

    def add_running(self, workload: Workload) -> None:
        """A workload already running: its placement's shares are already out of the nodes' free.
        One placed on a reservation (`workload.reservation`) is uncounted against its workspace's
        quota while that reservation is active."""
        pool = self.pools.get((workload.cluster or "", workload.gpu_type))
        held = []
        if pool is not None:
            for replica in workload.placement:
                node = pool.nodes.get(replica.node)
                if node is None:
                    continue
                positions = {index: p for p, index in enumerate(node.indexes)}
                held.append((node, [(positions[i], units_of(s)) for i, s in replica.devices if i in positions]))
        running = _Running(workload, pool, held, workload.units)
        if workload.reservation is not None:
            self.reserved_runs[workload.key] = running
            if self._active(workload.reservation):
                running.units = 0
        self._start(running)

    def _start(self, running: _Running) -> None:
        w = running.workload
        if running.units:
            self.ledger.add(w.workspace, w.gpu_type, running.units)
            self.shares.pop(w.workspace, None)
        self.running[w.key] = running
        self.running_by[w.workspace, w.gpu_type][w.key] = running
        for node, _ in running.held:
            self.on_node[node][w.key] = running
        self.preemption.changed(running, stopped=False)
        self.priorities[w.workspace, w.gpu_type][w.priority] += 1

    def _stop(self, key: str) -> _Running:
        running = self.running.pop(key)
        if self.reserved_runs:
            self.reserved_runs.pop(key, None)
        del self.running_by[running.workload.workspace, running.workload.gpu_type][key]
        for node, _ in running.held:
            self.on_node[node].pop(key, None)
        self.preemption.changed(running, stopped=True)
        priorities = self.priorities[running.workload.workspace, running.workload.gpu_type]
        priorities[running.workload.priority] -= 1
        if not priorities[running.workload.priority]:
            del priorities[running.workload.priority]
        self._release(running)
        return running

    def submit(self, workload: Workload) -> None:
        """Queue a workload, or reject it at once if no policy could ever give it what it asks."""
        never = self._never_fits(workload)
        if never:
            self.rejected.append(Reject(workload.key, never))
            return
        if workload.key in self.pending:
            self.withdraw(workload.key)  # submitted again: its new terms replace the old
        self.pending[workload.key] = workload
        self.line.add(workload)
        self.queues[workload.workspace].add(workload)

    def withdraw(self, key: str) -> None:
        """A pending workload cancelled by its owner."""
        workload = self.pending.pop(key, None)
        if workload is not None:
            self.line.remove(workload)
            self.queues[workload.workspace].remove(workload)

    def finish(self, key: str, now: float | None = None) -> None:
        """A running workload ended: give back its devices and its quota."""
        if now is not None:
            self._advance(now)
        self._stop(key)

    def _release(self, running: _Running) -> None:
        if running.pool is not None:
            for node, devices in running.held:
                running.pool.give(node, devices)
        if running.units:
            self.ledger.add(running.workload.workspace, running.workload.gpu_type, -running.units)
            self.shares.pop(running.workload.workspace, None)

    def _never_fits(self, workload: Workload) -> str:
        units = workload.replica_units
        if units == 0:
            return ""
        gpu_type, total = workload.gpu_type, units * workload.replicas
        ceiling = self.ledger.ceiling(workload.workspace, gpu_type, self.cohort_lendable)
        if total > ceiling and not self.shared and not self._reservation_may_hold(workload):
            return (
                f"can never run: asks for {fmt_units(total)} {gpu_type} but workspace {workload.workspace} "
                f"can hold at most {fmt_units(ceiling)}"
            )
        for pool in self._pools_for(workload):
            if all(self._slots(pool, share) >= replicas for share, replicas in workload.shapes if share):
                return ""
        where = f"cluster {workload.cluster}" if workload.cluster else "no cluster"
        return f"can never run: {where} has room for {workload.replicas} x {fmt_units(units)} {gpu_type} at once"

    def _pools_for(self, workload: Workload) -> list[Pool]:
        """The pools a workload may be placed in: of its GPU type, on the cluster it asked for if any."""
        pools = self.pools_by_type.get(workload.gpu_type, [])
        return [p for p in pools if p.cluster == workload.cluster] if workload.cluster else pools

    def _slots(self, pool: Pool, units: int) -> int:
        """How many replicas of `units` thousandths the pool's nodes hold when empty (counted once:
        capacities do not change in an engine's life)."""
        key = (pool.cluster, pool.gpu_type, units)
        if key not in self.slot_counts:
            self.slot_counts[key] = sum(
                n.capacity * (UNIT // units) if units < UNIT else n.capacity // (units // UNIT)
                for n in pool.nodes.values()
            )
        return self.slot_counts[key]

    # -- fair share --------------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        """Decay past use and add what ran since the last call."""
        if self.clock is None or now <= self.clock:
            self.clock = now if self.clock is None else max(self.clock, now)
            return
        elapsed = now - self.clock
        self.shares.clear()
        decay = 0.5 ** (elapsed / self.policy.half_life_s)
        for key in list(self.history):
            self.history[key] *= decay
        for (name, gpu_type), used in self.ledger.used.items():
            if used:
                self.history[name, gpu_type] += used / UNIT * elapsed
        self.clock = now

    def _share(self, name: str) -> float:
        """Dominant share: the largest over GPU types of (use now + recent use) / capacity, / weight.
        Kept until the workspace's use or the clock changes."""
        share = self.shares.get(name)
        if share is None:
            share = self.shares[name] = self._dominant_share(name)
        return share

    def _dominant_share(self, name: str) -> float:
        ws = self.ledger.workspace(name)
        share = 0.0
        for gpu_type, capacity in self.capacity.items():
            if capacity:
                used = self.ledger.used.get((name, gpu_type), 0) / UNIT
                past = self.history.get((name, gpu_type), 0.0) / self.policy.half_life_s
                share = max(share, (used + past) / (capacity / UNIT))
        return share / max(ws.weight, 1e-6)

    # -- one cycle ---------------------------------------------------------------------------------

    def cycle(self, now: float, *, explain: bool = True, estimate: bool = True) -> Decisions:
        """Admit, preempt or explain: one pass over the pending workloads. An explained pass gives
        each workload still pending its reason and positions, and with `estimate` its estimated start."""
        self._advance(now)
        self.admitted_now = set()
        decisions = Decisions(rejected=self.rejected)
        self.rejected = []
        reasons: dict[str, str] = {}
        if self.reservations or self.fences or self.reserved_runs:
            self._fence_reservations(now, decisions)
        if self.fifo:
            self._fifo_pass(now, decisions, reasons)
        elif self.shared:
            self._shared_pass(now, decisions, reasons)
        else:
            self._portal_pass(now, decisions, reasons, quick=not explain)
        for pool in self.pools.values():
            pool.release_held()
        self.held_quota.clear()
        self.held_until.clear()
        self.unplaceable.clear()
        self.fenced_unplaceable.clear()
        self.fits_something.clear()
        self.preemption.new_pass()  # what its searches found holds in this pass only
        if explain:
            self._explain(now, decisions, reasons, estimate)
        return decisions

    def _admit(self, workload: Workload, pool: Pool | None, placed: list[tuple[PoolNode, list[tuple[int, int]]]],
               borrowed: int, decisions: Decisions, reservation: str | None = None) -> None:  # fmt: skip
        """Start `workload` where it was placed; on a reservation's devices, uncounted against quota."""
        del self.pending[workload.key]
        self.line.remove(workload)
        self.queues[workload.workspace].remove(workload)
        started = workload.started(self.clock)  # so min_runtime_s protects it in later cycles
        self.admitted_now.add(workload.key)
        self.ledger.repaid(workload.workspace, workload.gpu_type, workload.units)
        if reservation is None:
            self._start(_Running(started, pool, placed, workload.units))
        else:
            started = replace(started, reservation=reservation)
            self.reserved_runs[workload.key] = running = _Running(started, pool, placed, 0)
            self._start(running)
        placement = tuple(
            ReplicaPlacement(node.name, tuple([(node.indexes[p], gpus_of(s)) for p, s in devices]))
            for node, devices in placed
        )
        decisions.admitted.append(
            Admit(workload.key, pool.cluster if pool else None, placement, gpus_of(borrowed), reservation)
        )

    def _try_place(self, workload: Workload) -> tuple[Pool, list[tuple[PoolNode, list[tuple[int, int]]]]] | None:
        if workload.more:
            return self._try_place_pod_sets(workload)
        share = workload.replica_units
        for pool in self._pools_for(workload):
            if pool.free_units < share * workload.replicas:
                continue
            placed = pool.place(share, workload.replicas)
            if placed is not None:
                return pool, placed
        for pool in self._pools_for(workload):  # backfill: held nodes, for work that leaves them in time
            if pool.held and self._ends_by(workload, self.held_until.get((pool.cluster, pool.gpu_type))):
                placed = pool.place_on_held_too(share, workload.replicas)
                if placed is not None:
                    return pool, placed
        return None

    def _try_place_pod_sets(
        self, workload: Workload
    ) -> tuple[Pool, list[tuple[PoolNode, list[tuple[int, int]]]]] | None:
        """Every pod set of the workload in one pool, each by its own shape, or none: its replicas
        in order, the first pod set's first."""
        for pool in self._pools_for(workload):
            if pool.free_units < workload.units:
                continue
            placed: list[tuple[PoolNode, list[tuple[int, int]]]] = []
            for share, replicas in workload.shapes:
                if not share:
                    continue
                more = pool.place(share, replicas)
                if more is None:
                    for node, devices in reversed(placed):
                        pool.give(node, devices)
                    placed = []
                    break
                placed.extend(more)
            else:
                return pool, placed
        return None

    def _ends_by(self, workload: Workload, moment: float | None) -> bool:
        """Whether `workload`, started now, is sure to end by `moment`: its declared limit says so."""
        limit = workload.max_runtime_s
        return moment is not None and limit is not None and (self.clock or 0.0) + limit <= moment

    def _try_admit(self, workload: Workload, decisions: Decisions) -> tuple[str, str]:
        """Admit the workload if quota and placement fit; otherwise ("quota", "placement" or "held", why
        not): "held" when a starving gang of its workspace is owed the quota first."""
        if workload.units == 0:
            self._admit(workload, None, [], 0, decisions)
            return "", ""
        if self.unended and self._admit_in_reservation(workload, decisions):
            return "", ""
        held = self._held_for_another(workload)
        if held:
            return "held", held
        units = workload.units
        fits, borrowed, reason = (True, 0, "") if self.shared else self.ledger.check(workload, units)
        if not fits:
            return "quota", reason
        if self._unplaceable(workload):
            return "placement", self._placement_refused(workload)
        found = self._try_place(workload)
        if found is None and self.unended:
            found = self._try_place_fenced(workload)
        if found is None:
            if not workload.more:
                shape = (workload.replica_units, workload.replicas)
                self.unplaceable[workload.gpu_type, workload.cluster].append(shape)
            self.memos += 1
            return "placement", self._placement_refused(workload)
        self._admit(workload, found[0], found[1], borrowed, decisions)
        return "", ""

    def _held_for_another(self, workload: Workload) -> str:
        """Why the workload may not take its workspace's quota, which a starving gang is owed first
        (see _hold_for); "" if it may."""
        held = self.held_quota.get((workload.workspace, workload.gpu_type))
        if held is None or held[0] == workload.key or self._ends_by(workload, held[1]):
            return ""
        return (
            f"waiting behind gang {held[0]}: it has waited longest, and workspace {workload.workspace}'s "
            f"{workload.gpu_type} quota goes to it first"
        )

    def _unplaceable(self, workload: Workload) -> bool:
        """Whether a shape no larger than the workload's found no placement earlier in this pass. Each
        replica placed takes one from the count of replicas of its size the free devices can hold, so
        a placement exists exactly when there are enough: a larger shape fits no better. Not for work
        that may backfill held nodes."""
        if workload.more or (workload.max_runtime_s is not None and self.held_until):
            return False
        if self.unended and (workload.preemptible or workload.max_runtime_s is not None):
            return False  # it may backfill fenced devices
        share, replicas = workload.replica_units, workload.replicas
        return any(
            s <= share and r <= replicas for s, r in self.unplaceable.get((workload.gpu_type, workload.cluster), ())
        )

    def _try_admit_unless_blocked(
        self, workload: Workload, decisions: Decisions, blocked: dict[tuple[str, str], tuple[int, str]], quick: bool
    ) -> tuple[str, str]:
        """`_try_admit`, remembering in `blocked` the fewest GPUs of a type each workspace's quota refused
        in this pass: within a pass use only grows until evictions, which clear `blocked`, so as many or
        more are refused too. Without explain (`quick`), such a workload is refused at once, with that
        refusal's reason, unless a starving gang is owed its quota: then it is "held", as `_try_admit`
        says (which no eviction changes)."""
        known = blocked.get((workload.workspace, workload.gpu_type))
        units = workload.units
        if quick and known is not None and units >= known[0] and not self.unended:
            held = self._held_for_another(workload)
            return ("held", held) if held else ("quota", known[1])
        kind, reason = self._try_admit(workload, decisions)
        if kind == "quota" and (known is None or units < known[0]):
            blocked[workload.workspace, workload.gpu_type] = (units, reason)
            self.memos += 1
        return kind, reason

    def _placement_refused(self, workload: Workload) -> str:
        """Why placement refused it; naming the reservations whose devices it would have fit on."""
        reason = self._shortage(workload)
        return reason + self._fenced_note(workload) if self.unended else reason

    def _shortage(self, workload: Workload) -> str:
        nodes = "a node" if workload.replicas == 1 else f"{workload.replicas} nodes"
        if workload.replica_units < UNIT:
            nodes = "a device" if workload.replicas == 1 else f"{workload.replicas} device shares"
        return f"waiting for {nodes} with {fmt_units(workload.replica_units)} free {workload.gpu_type}"

    def _fifo_pass(self, now: float, decisions: Decisions, reasons: dict[str, str]) -> None:
        for name in sorted(self.queues):
            for _, _, key, _ in list(self.queues[name].items):
                workload = self.pending[key]
                if workload.eligible_at > now:
                    reasons[key] = f"requeued with backoff: eligible again in {workload.eligible_at - now:.0f} s"
                    continue
                _, reason = self._try_admit(workload, decisions)
                if reason:
                    reasons[key] = reason
                    break  # the queue blocks at its first workload that does not fit

    def _shared_pass(self, now: float, decisions: Decisions, reasons: dict[str, str]) -> None:
        for workload in self._line()[: self.policy.max_scan]:
            if workload.eligible_at > now:
                reasons[workload.key] = f"requeued with backoff: eligible again in {workload.eligible_at - now:.0f} s"
                continue
            kind, reason = self._try_admit(workload, decisions)
            if kind:
                reasons[workload.key] = reason
                if self._starving(workload):
                    self._hold_for(workload, kind, reason, reasons)

    def _portal_pass(self, now: float, decisions: Decisions, reasons: dict[str, str], quick: bool = False) -> None:
        """Progressive filling: the workspace furthest below its fair share goes next.

        Work within a workspace's nominal quota goes before work that must borrow. A blocked
        workload does not block the ones behind it (backfill), except that a gang blocked for
        longer than `starvation_s` gets a reservation of what it waits for (see _hold_for), and
        quota refused to work within its nominal quota is owed to it (see _owe).
        """
        self.ledger.forget_owed()
        self._owe_up_front()
        self.preemption.new_pass()
        self.cut_short = False
        self.wanting = None
        cursor: dict[str, int] = {}
        heap: list[tuple[int, float, str]] = []
        for name, queue in self.queues.items():
            if queue.items:
                cursor[name] = 0
                heap.append(self._rank(name, queue.items[0][2]))
        heapq.heapify(heap)
        scanned = 0
        # The scan budget is shared: a workspace's refusals use up at most its slice of it, so that
        # one workspace's queue of blocked work never keeps another's fitting work from being seen.
        slice_ = max(1, self.policy.max_scan // max(1, len(heap)))
        refused: dict[str, int] = defaultdict(int)
        preemption_tries = self.policy.max_preemption_tries if self.policy.preemption else 0
        blocked: dict[tuple[str, str], tuple[int, str]] = {}
        settled = _Settled()
        # Work of a workspace's queue that would be refused without side effects, one after another
        # (shapes at least as large as one refused, see _refused_shapes), is refused all at once where
        # it would be popped again and again; with explain, each of those workloads is given the
        # reason it would have been given one by one.
        while heap and scanned < self.policy.max_scan:
            _, _, name = heapq.heappop(heap)
            items = self.queues[name].items
            position = cursor[name]
            if position >= len(items):
                continue
            key = items[position][2]
            workload = self.pending[key]
            scanned += 1
            if workload.eligible_at > now:
                reasons[key] = f"requeued with backoff: eligible again in {workload.eligible_at - now:.0f} s"
                cursor[name] = position + 1
            else:
                kind, reason = self._try_admit_unless_blocked(workload, decisions, blocked, quick and self.shortcuts)
                if (
                    kind in ("quota", "placement")
                    and preemption_tries > 0
                    and self.preemption.may_preempt_for(workload)
                ):
                    preemption_tries -= 1
                    if self._preempt_for(workload, now, decisions):
                        kind = reason = ""
                        blocked.clear()  # the evictions gave quota back
                elif kind in ("quota", "placement") and self.policy.preemption and not self.cut_short:
                    # No search left for it in this cycle: the next one must come on the period.
                    self.cut_short = self.preemption.may_preempt_for(workload)
                    if self.cut_short:
                        self.memos += 1  # refusals no longer say so: see _work_out_refused
                if kind:
                    reasons[key] = reason
                    if kind == "quota":
                        self._owe(workload)
                    if kind != "held" and (self._starving(workload) or self._entitled(workload)):
                        self._hold_for(workload, kind, reason, reasons)
                    cursor[name] = position + 1
                    refused[name] += 1
                    if self.shortcuts and cursor[name] < len(items):
                        left = self._refused_run(name, cursor[name], blocked, preemption_tries > 0)
                        if quick and left == len(items) - cursor[name]:
                            settled.add(name, (self.ledger.version, self.memos, preemption_tries > 0))
                        # Each ranks at most (3, share, name): if that is ahead of every other
                        # workspace, they would be refused item after item; else as long as each is.
                        if left and (not heap or (3, self._share(name), name) < heap[0]):
                            left = eligible = min(left, slice_ - refused[name], self.policy.max_scan - scanned)
                        elif left:
                            budget = (self.policy.max_scan - scanned, slice_ - refused[name])
                            left, eligible = self._refused_in_turn(name, cursor[name], left, heap, budget, now)
                        if left:
                            if not quick:
                                queue = self.queues[name]
                                self._refuse_all(queue, cursor[name], cursor[name] + left, now, decisions, reasons)
                            scanned += left
                            refused[name] += eligible
                            cursor[name] += left
            if cursor[name] < len(items) and refused[name] < slice_:
                heapq.heappush(heap, self._rank(name, items[cursor[name]][2]))
                if settled.covers(heap, (self.ledger.version, self.memos, preemption_tries > 0)):
                    break  # what is left would be refused item after item, changing nothing
        if not quick:
            self._say_unexamined(now, cursor, refused, slice_, reasons)

    def _say_unexamined(
        self, now: float, cursor: dict[str, int], refused: dict[str, int], slice_: int, reasons: dict[str, str]
    ) -> None:
        """The reason of the workloads the pass did not reach, past each queue's cursor: their
        workspace's share of the scan budget was spent on refusals, or the whole budget was."""
        for name, position in cursor.items():
            items = self.queues[name].items
            if position >= len(items):
                continue
            if refused[name] >= slice_:
                reason = (
                    f"not examined in this pass: a pass refuses at most {slice_:,} workloads of one workspace's "
                    f"queue (max_scan {self.policy.max_scan:,} shared by the {len(cursor)} with work waiting), "
                    f"and this one is further back in workspace {name}'s"
                )
            else:
                reason = f"not examined in this pass: a pass examines at most {self.policy.max_scan:,} workloads"
            reasons.update(dict.fromkeys(map(_item_key, items[position:]), reason))
            if self.queues[name].waiting_out_backoff(now):  # those say so as they would if examined
                for _, _, key, _ in items[position:]:
                    eligible_at = self.pending[key].eligible_at
                    if eligible_at > now:
                        reasons[key] = f"requeued with backoff: eligible again in {eligible_at - now:.0f} s"

    def _refused_run(
        self, name: str, start: int, blocked: dict[tuple[str, str], tuple[int, str]], preempting: bool
    ) -> int:
        """How many workloads of the workspace's queue from `start` on, one after another, are of
        shapes `_refused_shapes` says are refused: each would be refused in turn, changing nothing."""
        items = self.queues[name].items
        refused = self._refused_shapes(name, blocked, preempting, -items[start][0])
        if not refused or items[start][3] not in refused:
            return 0
        if len(refused) == len(self.queues[name].counts):
            return len(items) - start  # all of them
        stop = start + 1
        while stop < len(items) and items[stop][3] in refused:
            stop += 1
        return stop - start

    def _refused_in_turn(
        self, name: str, start: int, run: int, heap: list[tuple[int, float, str]], budget: tuple[int, int], now: float
    ) -> tuple[int, int]:
        """How many of the `run` workloads of the workspace's queue from `start` on, which
        `_refused_run` says are refused, the pass would pop one after another, each still ranked
        ahead of every other workspace (`heap`) and within the budget (`budget`: what is left of
        the scan, and of the workspace's slice of it, which workloads in backoff do not use), and
        how many of those are eligible now."""
        items, pending, used, nominal = self.queues[name].items, self.pending, self.ledger.used, self.ledger.nominal
        scan, slice_ = budget
        # Each one's rank (see _rank) is (class, share, name), the share and name the workspace's: it is
        # ahead of the next other workspace's rank when its class is lower, or the same and the rest is.
        ahead_of, tie = (heap[0][0], (self._share(name), name) < heap[0][1:]) if heap else (4, True)
        clock, starvation_s = self.clock or 0.0, self.policy.starvation_s
        # Per shape number (its GPU type, thousandths and gang-ness fixed), its rank unless it is a
        # starving gang, and whether it is a gang: use does not change while they are counted.
        by_number: dict[int, tuple[int, bool]] = {}
        taken = eligible = 0
        while taken < run and taken < scan and eligible < slice_:
            _, _, key, number = items[start + taken]
            workload = pending[key]
            known = by_number.get(number)
            if known is None:
                gpu_type = workload.gpu_type
                within = used[name, gpu_type] + workload.units <= nominal(name, gpu_type)
                known = by_number[number] = (1 if within else 3, is_gang(workload))
            rank, gang = known
            if gang and clock - workload.submitted_at >= starvation_s:  # see _starving
                rank -= 1
            if rank > ahead_of or (rank == ahead_of and not tie):
                break
            taken += 1
            if workload.eligible_at <= now:
                eligible += 1
        return taken, eligible

    def _refused_shapes(
        self, name: str, blocked: dict[tuple[str, str], tuple[int, str]], preempting: bool, top: int
    ) -> frozenset[int]:
        """The shapes (their numbers in the workspace's queue) whose every workload of priority `top`
        or lower would be refused for what is known in this pass, its refusal changing nothing.
        Worked out again only when what it depends on changed: use, what is owed, what the pass
        remembers of refusals, held nodes, whether preemption searches are left, `top` (the queue
        is in priority order: the workloads from a position on are of its priority or lower)."""
        known = (self.ledger.version, self.memos, preempting, top)
        remembered = self.fits_something.get(name)
        if remembered is not None and remembered[0] == known:
            return remembered[1]
        refused = self._work_out_refused(name, blocked, preempting, top)
        self.fits_something[name] = (known, refused)
        return refused

    def _refuse_all(self, queue: _Queue, start: int, stop: int, now: float, decisions: Decisions,
                    reasons: dict[str, str]) -> None:  # fmt: skip
        """The reasons of the workloads in `queue.items[start:stop]`, which `_refused_shapes` says are
        refused, as each would be given alone: the same for the same shape, as nothing changes while
        they are refused. The first of each shape is asked, in the order they come."""
        items = queue.items[start:stop]
        pending = self.pending
        said: dict[int, str] = {}  # per shape number
        if queue.waiting_out_backoff(now):  # some are not eligible yet: one by one
            for _, _, key, number in items:
                workload = pending[key]
                if workload.eligible_at > now:
                    reasons[key] = f"requeued with backoff: eligible again in {workload.eligible_at - now:.0f} s"
                    continue
                reason = said.get(number)
                if reason is None:
                    said[number] = reason = self._refusal(workload, decisions)
                reasons[key] = reason
            return
        numbers = list(map(_item_shape, items))
        for number in dict.fromkeys(numbers):  # each shape, in the order first met
            first = items[numbers.index(number)]
            said[number] = self._refusal(pending[first[2]], decisions)
        reasons.update(zip(map(_item_key, items), map(said.__getitem__, numbers), strict=True))

    def _refusal(self, workload: Workload, decisions: Decisions) -> str:
        kind, reason = self._try_admit(workload, decisions)
        assert kind, "a workload _refused_shapes refuses must not be admitted"
        return reason

    def _work_out_refused(
        self, name: str, blocked: dict[tuple[str, str], tuple[int, str]], preempting: bool, top: int
    ) -> frozenset[int]:
        """See _refused_shapes. A shape is refused when its quota refused one no larger, or no
        placement was found for a shape no larger: a larger one fits no better, whether whole
        devices or a share of one (a share needs a device with that much free, which a whole free
        device has too); and every shape when the workspace's quota is held for a starving gang
        (`_queue_facts`). Its refusal changes nothing when: it is no gang while a gang of the
        queue starves (its refusal holds nodes), unless `_gang_refused` says so; while nodes are
        held, none declares a limit (it may backfill them); within the nominal quota, no
        preemption search is left (nor, with none left, has the cycle yet to say it cut them
        short), all the workspace has idle is owed unless quota lets it through (then placement
        refuses it, which owes nothing), and it is not entitled (`_entitled`) while one of its
        pools holds no nodes yet (its refusal may preempt, owe or hold nodes); above it, while
        searches are left, work of priority `top` does not outrank the workspace's running work
        (it may preempt that). Work of several pod sets is always examined."""
        queue = self.queues[name]
        # With a starving gang waiting, shapes of gangs are refused without side effects only as
        # `_gang_refused` says; and none where a workload declares a limit, which may take it past
        # the quota held for that gang (see _held_for_another) where others of its shape are refused.
        starving = bool(queue.gangs_since) and (self.clock or 0.0) - queue.gangs_since[0] >= self.policy.starvation_s
        if starving and queue.declared:
            return _NONE
        if self.unended:  # work may go into its workspace's reservation, or backfill fenced devices
            return _NONE
        if self.held_until and queue.declared:
            return _NONE
        # A refusal may start a preemption search, or, with none left, say that the cycle cut them short.
        searching = preempting or (self.policy.preemption and not self.cut_short)
        refused = []
        facts: dict[str, tuple[int, int, bool, bool]] = {}  # per GPU type, see _queue_facts
        for number in queue.counts:
            (gpu_type, cluster, share, replicas), several = queue.kinds[number]
            if several:
                continue
            known = facts.get(gpu_type)
            if known is None:
                known = facts[gpu_type] = self._queue_facts(name, gpu_type, searching, top)
            used, nominal, held_back, outranks = known
            units = share * replicas
            if units and held_back:
                refused.append(number)  # it waits behind the starving gang its quota is held for
                continue
            quota = blocked.get((name, gpu_type))
            if quota is None or units < quota[0]:
                unplaced = self.unplaceable.get((gpu_type, cluster), ())
                if not any(s <= share and r <= replicas for s, r in unplaced):
                    continue  # not known to be refused
            if starving and (replicas > 1 or share > UNIT) and not self._gang_refused(name, gpu_type, cluster, units):
                continue
            if used + units <= nominal:
                if searching or self._may_hold(name, gpu_type, cluster):
                    continue
                if not self.ledger.owes_all(name, gpu_type) and not self.ledger.check_units(name, gpu_type, units)[0]:
                    continue  # refused for quota, it is owed some (placement refusals owe nothing)
            elif outranks:
                continue
            refused.append(number)
        return frozenset(refused)

    def _queue_facts(self, name: str, gpu_type: str, searching: bool, top: int) -> tuple[int, int, bool, bool]:
        """What `_work_out_refused` asks of every shape of `gpu_type` in `name`'s queue: the workspace's
        use and nominal quota; whether all of it waits behind the starving gang its quota is held
        for (`_held_for_another`: a refusal that changes nothing and gives each the same reason),
        where none declares a limit (it may end before the gang's turn); that gang was refused at
        its place in the queue, which the pass is past; and whether, searching, work of priority
        `top` outranks its running work."""
        held_back = (name, gpu_type) in self.held_quota and not self.queues[name].declared
        outranks = searching and any(p < top for p in self.priorities[name, gpu_type])
        return self.ledger.used[name, gpu_type], self.ledger.nominal(name, gpu_type), held_back, outranks

    def _gang_refused(self, name: str, gpu_type: str, cluster: str | None, units: int) -> bool:
        """Whether refusing a starving gang of `units` in `name`'s queue, for quota or placement, would
        change nothing (`_owe`, `_hold_for`) while its workspace's quota is held for no gang (see
        `_queue_facts` for when it is): it asks more than the nominal quota (none is owed or held
        for it), and each of its pools holds nodes already."""
        if units <= self.ledger.nominal(name, gpu_type):
            return False
        pools = self.pools_by_type.get(gpu_type, ())
        return all(pool.held for pool in pools if not cluster or pool.cluster == cluster)

    def _may_hold(self, name: str, gpu_type: str, cluster: str | None) -> bool:
        """Whether refusing `name`'s work within its nominal quota may hold nodes for it (see _hold_for):
        it is entitled, and one of its pools holds none yet."""
        if not self._would_borrow(gpu_type) - {name}:
            return False
        pools = self.pools_by_type.get(gpu_type, ())
        return any(not pool.held for pool in pools if not cluster or pool.cluster == cluster)

    def _rank(self, name: str, key: str) -> tuple[int, float, str]:
        """Within nominal quota before borrowing; in each, a gang starving past `starvation_s` goes
        first (else work ranked before it takes the nodes it holds), then the lower fair share."""
        workload = self.pending[key]
        gpu_type = workload.gpu_type
        within = self.ledger.used[name, gpu_type] + workload.units <= self.ledger.nominal(name, gpu_type)
        share = self.shares.get(name)
        if share is None:
            share = self._share(name)
        return (2 * (0 if within else 1) + (0 if self._starving(workload) else 1), share, name)

    def _entitled(self, workload: Workload) -> bool:
        """Work that fits its workspace's nominal quota as it stands while another workspace uses, or
        waits for, more than its own: the owner's, which borrowed work gives way to (portal only:
        fifo and shared have no such claim). While no one borrows or waits to, it waits like any
        work, and backfill goes past it. Those that only wait to borrow count too: a borrower whose
        work ended a moment ago would otherwise take the owner's nodes again before they drain."""
        if self.fifo or self.shared:
            return False
        name, gpu_type = workload.workspace, workload.gpu_type
        if self.ledger.used[name, gpu_type] + workload.units > self.ledger.nominal(name, gpu_type):
            return False
        return bool(self._would_borrow(gpu_type) - {name})

    def _would_borrow(self, gpu_type: str) -> frozenset[str]:
        """The workspaces whose running and pending `gpu_type` work is more than their nominal quota:
        those that borrow, or would as soon as GPUs are free (a gang of pod sets counted at its widest).
        Worked out once a pass: admitting work moves it from pending to running, which leaves the
        sum as it is, and the portal requeues what it evicts."""
        if self.wanting is None:
            demand: Counter[tuple[str, str]] = Counter()
            for name, queue in self.queues.items():
                for (t, _, share, replicas), count in queue.shapes.items():
                    demand[name, t] += share * replicas * count
            for key, used in self.ledger.used.items():
                demand[key] += used
            found: dict[str, set[str]] = defaultdict(set)
            for (name, t), units in demand.items():
                if units > self.ledger.nominal(name, t):
                    found[t].add(name)
            self.wanting = {t: frozenset(names) for t, names in found.items()}
        return self.wanting.get(gpu_type, frozenset())

    def _starving(self, workload: Workload) -> bool:
        """A gang (several replicas, or more than one GPU) blocked for `starvation_s` or longer."""
        return is_gang(workload) and (self.clock or 0.0) - workload.submitted_at >= self.policy.starvation_s

    def _owe(self, workload: Workload) -> None:
        """Quota refused work within its nominal quota (or a starving gang that fits it): what it asks of
        its workspace's idle quota is not lent again in this pass, so what borrowers give back is its own."""
        name, gpu_type = workload.workspace, workload.gpu_type
        units, used, nominal = workload.units, self.ledger.used[name, gpu_type], self.ledger.nominal(name, gpu_type)
        if used + units <= nominal or (units <= nominal and self._starving(workload)):
            self.ledger.owe(name, gpu_type, units)

    def _owe_up_front(self) -> None:
        """Before the pass: what waiting work within its nominal quota asks of quota that borrowers
        hold is owed to it, wherever it stands in its workspace's queue (behind work that must
        borrow, it is examined after other workspaces' borrowers)."""
        for name, queue in self.queues.items():
            for (gpu_type, _, share, replicas), count in queue.shapes.items():
                units = share * replicas
                used, nominal = self.ledger.used[name, gpu_type], self.ledger.nominal(name, gpu_type)
                if units and used + units <= nominal and self.ledger.lent_out_for(name, gpu_type, units):
                    self.ledger.owe(name, gpu_type, units * count)

    def _hold_for(self, workload: Workload, kind: str, reason: str, reasons: dict[str, str]) -> None:
        """A starving gang, or work within its workspace's nominal quota while others borrow or wait
        to (`_entitled`): keep smaller work of its workspace off the quota a starving gang waits for,
        and all other work off the nodes it needs, except work declared to end before those free up.
        Nodes are held when placement refuses it, and, for entitled work, when quota does too: what
        ends there is then kept for it in a shape it can use (whole devices for whole GPUs, a
        device's share for a fraction) rather than taken again by the borrowers."""
        quota_key = (workload.workspace, workload.gpu_type)
        if kind == "quota" and workload.units > self.ledger.nominal(*quota_key):
            return  # a gang that must borrow has nothing kept for it
        if kind == "quota" and self._starving(workload) and quota_key not in self.held_quota:
            self.held_quota[quota_key] = (workload.key, self._declared_end(self.running_by[quota_key].values()))
            self.memos += 1  # the rest of its workspace's queue waits: see _queue_facts
        entitled = self._entitled(workload)
        if kind == "quota" and not entitled:
            # Its own workspace's work gives the quota back as it ends; nodes are held once it is
            # placement that refuses it (holding them for as long as that takes would keep every
            # other workspace off them for nothing).
            return
        # Work within its nominal quota may start sooner than what runs there ends, by preemption,
        # once that has run min_runtime_s: work that ends within min_runtime_s never stands in its way.
        self._hold_nodes(
            workload, reason, reasons, (self.clock or 0.0) + self.policy.min_runtime_s if entitled else None
        )

    def _hold_nodes(self, workload: Workload, reason: str, reasons: dict[str, str], cap: float | None) -> None:
        """Hold the nodes `workload` needs, in the first of its pools that holds none yet: those with
        the most whole free devices (then the freest device), one per replica. What may backfill
        them must end before what runs there has ended (by its declared limits), or by `cap` if
        that is sooner."""
        share = workload.widest_units
        for pool in self._pools_for(workload):
            if pool.held:
                continue
            chosen = pool.to_hold(max(1, share // UNIT), workload.all_replicas)
            if len(chosen) < workload.all_replicas:
                continue
            for node in chosen:
                pool.hold(node)
            self.memos += 1  # refusals no longer hold nodes in this pool: see _work_out_refused
            on_them = list({id(r): r for node in chosen for r in self.on_node[node].values()}.values())
            until = self._declared_end(on_them)
            if cap is not None:
                until = cap if until is None else min(until, cap)
            self.held_until[pool.cluster, pool.gpu_type] = until
            what = "node(s) for it while work there finishes" if on_them else "free node(s) for it"
            reasons[workload.key] = f"{reason}; holding {len(chosen)} {what}"
            return

    def _declared_end(self, running: Iterable[_Running]) -> float | None:
        """When all of `running` will have ended by their declared limits; None if one has none."""
        end = self.clock or 0.0
        for item in running:
            limit, started = item.workload.max_runtime_s, item.workload.started_at
            if limit is None or started is None:
                return None
            end = max(end, started + limit)
        return end

    # -- reservations ------------------------------------------------------------------------------

    def _active(self, key: str) -> bool:
        """Whether reservation `key` is known and under way at the engine's clock."""
        reservation = self.reservation_by_key.get(key)
        now = self.clock or 0.0
        return reservation is not None and reservation.start <= now < reservation.end

    def _reservation_may_hold(self, workload: Workload) -> bool:
        """Whether a reservation of its workspace, not yet ended, has as many devices as it asks for."""
        now = self.clock or 0.0
        return any(
            r.workspace == workload.workspace and r.gpu_type == workload.gpu_type and r.end > now
            and (not workload.cluster or workload.cluster == r.cluster) and r.gpus * UNIT >= workload.units
            for r in self.reservations
        )  # fmt: skip

    def _fence_reservations(self, now: float, decisions: Decisions) -> None:
        """At the start of a pass: give back the last pass's fences, count or uncount the work on
        reservations as they began or ended, evict other workspaces' work from reservations about to
        begin, and fence the devices of every reservation not yet ended (what is free of them is
        out of their pools until opened, see _opens). Work running on fenced devices is no victim of
        preemption: what it gives back would go to the reservation, not to the work it is evicted for."""
        self.fences.lift()
        self.unended = tuple(r for r in self.reservations if r.end > now)
        if self.reserved_runs:
            self._settle_reserved_runs()
        for reservation in self.unended:
            if now >= reservation.start - self.policy.grace_s:
                self._evict_for(reservation, decisions)
        kept: set[str] = set()
        for reservation in self.unended:
            for pool, node, position in self._devices_of(reservation):
                self.fences.add(reservation.key, pool, node, position)
                kept.update(running.workload.key for running in self._running_on(node, position))
        self.preemption.kept = frozenset(kept)
        self.claims = {}
        for reservation in self.unended:
            if reservation.start <= now:
                claim = self._claim(reservation, now)
                if claim is not None:
                    self.claims[reservation.key] = claim

    def _claim(self, reservation: Reservation, now: float) -> Workload | None:
        """The largest of the holder's waiting work that the reservation's devices could hold (the
        first in queue order of that size), or None: its smaller work goes in only where this one
        still fits afterwards, so that a big job is not kept out of the reservation made for it by
        the holder's own stream of small ones. It waits for the holder's running work there to end."""
        queue = self.queues.get(reservation.workspace)
        pool = self.pools.get((reservation.cluster, reservation.gpu_type))
        if queue is None or pool is None or not queue.items:
            return None
        whole = [(node, position, UNIT) for _, node, position in self._devices_of(reservation)]
        capacity = UNIT * len(whole)
        best: Workload | None = None
        for _, _, key, _ in queue.items:
            workload = self.pending[key]
            if (
                workload.units <= capacity
                and (best is None or workload.units > best.units)
                and workload.gpu_type == reservation.gpu_type
                and workload.eligible_at <= now
                and (not workload.cluster or workload.cluster == reservation.cluster)
                and place_apart(pool, whole, workload.shapes) is not None
            ):
                best = workload
        return best

    def _crowds_out(self, reservation: Reservation, workload: Workload, free: list[tuple[PoolNode, int, int]],
                    placed: Placed) -> bool:  # fmt: skip
        """Whether placing `workload` on the reservation's `free` shares as `placed` leaves no room
        for the reservation's claim (see _claim), when that is another workload."""
        claim = self.claims.get(reservation.key)
        if claim is None or claim.key == workload.key or claim.key not in self.pending:
            return False
        taken: dict[tuple[str, int], int] = defaultdict(int)
        for node, devices in placed:
            for position, share in devices:
                taken[node.name, position] += share
        left = [(node, position, units - taken[node.name, position]) for node, position, units in free]
        left = [spot for spot in left if spot[2] > 0]
        return place_apart(self.pools[reservation.cluster, reservation.gpu_type], left, claim.shapes) is None

    def _settle_reserved_runs(self) -> None:
        """Work placed on a reservation counts against its workspace's quota only while the
        reservation is not under way (once it ended, it is ordinary work)."""
        for running in self.reserved_runs.values():
            workload = running.workload
            units = 0 if workload.reservation is not None and self._active(workload.reservation) else workload.units
            if units != running.units:
                self.ledger.add(workload.workspace, workload.gpu_type, units - running.units)
                self.shares.pop(workload.workspace, None)
                running.units = units
                self.preemption.changed(running, stopped=False)

    def _devices_of(self, reservation: Reservation) -> list[tuple[Pool, PoolNode, int]]:
        """The reservation's devices the engine knows: (pool, node, position)."""
        pool = self.pools.get((reservation.cluster, reservation.gpu_type))
        if pool is None:
            return []
        found = []
        for name, index in reservation.devices:
            node = pool.nodes.get(name)
            if node is not None and index in node.indexes:
                found.append((pool, node, node.indexes.index(index)))
        return found

    def _running_on(self, node: PoolNode, position: int) -> list[_Running]:
        """The running work holding a share of one device."""
        return [
            running
            for running in self.on_node[node].values()
            if any(held is node and any(p == position for p, _ in devices) for held, devices in running.held)
        ]

    def _evict_for(self, reservation: Reservation, decisions: Decisions) -> None:
        """From `grace_s` before it begins: evict the work on the reservation's devices that is not
        its own (the holder's ordinary work too: it would keep the holder's larger work out of its own
        reservation; requeued, it may come back inside it), except work on another reservation under
        way that overlaps this one (the two were never to share devices: the first placed keeps
        them), and, until it begins, work declared to end by then (its limit stops it in time)."""
        now = self.clock or 0.0
        label = reservation.label or f"reservation {reservation.key}"
        for _, node, position in self._devices_of(reservation):
            for running in self._running_on(node, position):
                workload = running.workload
                if workload.reservation == reservation.key:
                    continue
                inside = self.reservation_by_key.get(workload.reservation or "")
                if inside is not None and self._active(inside.key) and inside.end > reservation.start:
                    continue
                limit, started = workload.max_runtime_s, workload.started_at
                declared_end = None if limit is None else (now if started is None else started) + limit
                if now < reservation.start and declared_end is not None and declared_end <= reservation.start:
                    continue
                self._stop(workload.key)
                grace = self.policy.grace_s if workload.checkpointable else 0.0
                reason = f"preempted: the devices it runs on are held for {label}"
                decisions.preempted.append(Preempt(workload.key, reason, reservation.key, grace))

    def _opens(self, workload: Workload, reservation: Reservation) -> bool:
        """Whether `workload` may be placed on the reservation's fenced devices the ordinary way:
        before it begins, if declared to end by then, or if preemptible and placed before it is
        evicted (`grace_s` before it begins)."""
        now = self.clock or 0.0
        if now >= reservation.start:
            return False
        return self._ends_by(workload, reservation.start) or (
            workload.preemptible and now < reservation.start - self.policy.grace_s
        )

    def _admit_in_reservation(self, workload: Workload, decisions: Decisions) -> bool:
        """Admit the workload on the free devices of a reservation of its workspace under way, alone
        (every replica and pod set, or none), uncounted against quota; False if none holds it. A later
        reservation of the same devices takes them back as from any other work (see _evict_for)."""
        now = self.clock or 0.0
        for reservation in self.unended:
            if (
                reservation.workspace != workload.workspace
                or reservation.gpu_type != workload.gpu_type
                or reservation.start > now
                or (workload.cluster and workload.cluster != reservation.cluster)
            ):
                continue
            pool, free = self.fences.free_of(reservation.key)
            if pool is None or sum(units for _, _, units in free) < workload.units:
                continue
            placed = place_apart(pool, free, workload.shapes)
            if placed is not None and not self._crowds_out(reservation, workload, free, placed):
                self.fences.use(placed)
                self._admit(workload, pool, placed, 0, decisions, reservation=reservation.key)
                return True
        return False

    def _try_place_fenced(self, workload: Workload) -> tuple[Pool, Placed] | None:
        """A second try, with the fenced devices of the reservations it may use (_opens) opened; what
        is left free of them is fenced again."""
        by_key = self.reservation_by_key
        # Shapes of workloads that open the same devices and found no room in this pass: a shape at
        # least as large fits no better until evictions give devices back (see _unplaceable).
        memo = None if workload.more or workload.max_runtime_s is not None else (
            workload.gpu_type, workload.cluster, workload.preemptible)  # fmt: skip
        share, replicas = workload.replica_units, workload.replicas
        if memo is not None and any(s <= share and r <= replicas for s, r in self.fenced_unplaceable.get(memo, ())):
            return None

        def opens(keys: list[str]) -> bool:
            return all(self._opens(workload, by_key[key]) for key in keys)

        for pool in self._pools_for(workload):
            if pool.free_units + self.fences.taken_in(pool) < workload.units:
                continue
            opened = self.fences.open(pool, opens)
            if not opened:
                continue
            try:
                placed = place_shapes(pool, workload.shapes)
            finally:
                self.fences.close(pool, opened)
            if placed is not None:
                return pool, placed
        if memo is not None:
            self.fenced_unplaceable[memo].append((share, replicas))
        return None

    def _fenced_note(self, workload: Workload) -> str:
        """How a refusal names the reservations whose devices the workload would have fit with:
        placed with every fence opened (then given back), the reservations of the fenced devices
        that placement took; "" if it would not have fit either."""
        for pool in self._pools_for(workload):
            opened = self.fences.open(pool, lambda keys: True)
            if not opened:
                continue
            try:
                placed = place_shapes(pool, workload.shapes)
                if placed is not None:
                    for node, devices in reversed(placed):
                        pool.give(node, devices)
            finally:
                self.fences.close(pool, opened)
            spots = set(opened)
            used = {(node, p) for node, devices in placed or () for p, _ in devices if (node, p) in spots}
            if used:
                keys = dict.fromkeys(key for spot in opened if spot in used for key in self.fences.covers[spot])
                labels = [r.label or f"reservation {r.key}" for r in map(self.reservation_by_key.__getitem__, keys)]
                held = " and ".join(dict.fromkeys(labels))
                return f": {len(used)} of them {'is' if len(used) == 1 else 'are'} held for {held}"
        return ""

    # -- preemption --------------------------------------------------------------------------------

    def _preempt_for(self, workload: Workload, now: float, decisions: Decisions) -> bool:
        """Evict the workloads preemption chooses for `workload` and admit it; False if none make room."""
        chosen = self.preemption.choose(workload, now, spared=self.admitted_now)
        if not chosen:
            return False
        for running in chosen:
            self._stop(running.workload.key)
            decisions.preempted.append(self.preemption.decision(running.workload, workload))
        self.unplaceable.clear()  # the evictions gave devices back
        self.fenced_unplaceable.clear()
        self.preemption.failed.clear()
        kind, _ = self._try_admit(workload, decisions)
        assert not kind, "preemption must make room for the workload it was made for"
        return True

    # -- explaining --------------------------------------------------------------------------------

    def _explain(self, now: float, decisions: Decisions, reasons: dict[str, str], estimate: bool) -> None:
        """Reason, positions and (with `estimate`) estimated start for every workload still pending."""
        order, keys = self.line.with_keys()
        starts: list[float | None] = []
        if estimate:
            began = time.process_time()
            starts = StartEstimates(self).starts(now, order[:ESTIMATED_LINE])
            decisions.estimated, decisions.estimate_s = True, time.process_time() - began
        starts.extend([None] * (len(order) - len(starts)))  # beyond the first ESTIMATED_LINE: none
        said = list(map(reasons.get, keys))
        if not all(said):
            for ahead, reason in enumerate(said):
                if not reason:
                    said[ahead] = f"in line: {ahead} workload{'s' if ahead != 1 else ''} ahead of it"
        if self.unended:
            self._explain_awaited(now, order, said, starts)
        counters = {name: itertools.count(1).__next__ for name in self.queues}  # each workspace's positions
        positions = [counters[workload.workspace]() for workload in order]
        decisions.pending = PendingList(keys, cast(list[str], said), positions, starts)

    def _explain_awaited(
        self, now: float, order: list[Workload], said: list[str | None], starts: list[float | None]
    ) -> None:
        """Work its workspace's reservation, not begun yet, could hold: it waits for that reservation
        (where nothing admits it sooner), and should start when the reservation begins."""
        upcoming = [r for r in self.unended if r.start > now]
        if not upcoming:
            return
        for at, workload in enumerate(order):
            awaited = min(
                (r for r in upcoming if r.workspace == workload.workspace and r.gpu_type == workload.gpu_type
                 and (not workload.cluster or workload.cluster == r.cluster) and r.gpus * UNIT >= workload.units),
                key=lambda r: (r.start, r.key), default=None,
            )  # fmt: skip
            if awaited is None:
                continue
            start = starts[at]
            if start is None or start > awaited.start:
                starts[at] = awaited.start
                label = awaited.label or f"reservation {awaited.key}"
                said[at] = f"{said[at]}; it runs in {label} once that begins, in {awaited.start - now:.0f} s"

    def _line(self) -> list[Workload]:
        """The pending workloads in the cluster's queue order: priority, then submission."""
        return self.line.workloads()

    def estimates(self, now: float, keys: Collection[str] = ()) -> dict[str, float]:
        """The estimated starts `cycle(now, explain=True)` would give after this cycle, for the pending
        workloads of the line down to the last of `keys` (all if empty)."""
        order = self._line()[:ESTIMATED_LINE]
        starts = StartEstimates(self).starts(now, order)
        if keys:
            wanted = set(keys)
            last = max((i for i, w in enumerate(order) if w.key in wanted), default=-1)
            order = order[: last + 1]
        return {workload.key: start for workload, start in zip(order, starts, strict=False) if start is not None}


def schedule(snapshot: Snapshot) -> Decisions:
    """One cycle over a snapshot: admit what fits, preempt where the rules call for it, explain the rest."""
    engine = Engine(snapshot.workspaces, snapshot.nodes, snapshot.policy)
    engine.clock = snapshot.now
    if snapshot.reservations:
        engine.set_reservations(snapshot.reservations)
    for workload in sorted(snapshot.running, key=lambda w: w.key):
        engine.add_running(workload)
    for workload in sorted(snapshot.pending, key=lambda w: (w.seq, w.key)):
        engine.submit(workload)
    return engine.cycle(snapshot.now, estimate=snapshot.estimate)


__all__ = [
    "Admit", "Decisions", "Device", "Engine", "NodeInfo", "Pending", "Policy", "Preempt", "Quota", "Reject",
    "ReplicaPlacement", "Reservation", "Snapshot", "Workload", "WorkspaceInfo", "schedule",
]  # fmt: skip
