"""Preemption: which running workloads to evict so that a pending one fits. Part of the pure
scheduling core (no Django): the engine asks, and does the evictions and the admission itself.

Bounded on purpose: only for work within its workspace's nominal quota (reclaiming what others
borrowed) or above lower-priority work of its own workspace; never non-preemptible work or work
younger than `Policy.min_runtime_s`. As in Kueue's reclaim within a cohort, any workload of another
workspace that uses more than its nominal quota may be evicted for work within its own nominal
quota, as long as that workspace is still above its nominal quota when it is evicted (the cheaper
victims gone): what it uses above its quota is its "budget", and its last victim may take it
below. The search first tries the `Policy.max_victims` cheapest candidates (the fewest and cheapest
of them that make room); where they do not, it chooses
node by node, and on each node device by device, among all candidates, so that the devices it frees
form the placement the workload needs, whole devices or a share of one: no cap makes a legal
reclaim impossible.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from apps.scheduling.ledger import Ledger
from apps.scheduling.placement import Pool, PoolNode
from apps.scheduling.types import UNIT, Policy, Preempt, Workload

EMPTY: frozenset[str] = frozenset()
# How many of the cheapest victims `_fewest_for_quota` tries one at a time before a binary search.
FIRST_ONE_BY_ONE = 2
Search = tuple[str, str, int, bool, str | None, float | None, bool]  # what a search's candidates depend on
Placed = list[tuple[PoolNode, list[tuple[int, int]]]]  # (node, [(device position, thousandths)]) per replica


# (priority, minus when it started, key, when it started, the work): in cost order as it stands (see _ranked)
Ranked = tuple[int, float, str, "float | None", "RunningWork"]


def _started_by(ranked: list[Ranked], latest: float) -> list[Ranked]:
    """The part of one workspace's `ranked` work (see Preemption._ranked) started by `latest`, in its
    order: in each priority, what started later comes first, and is cut off by a binary search."""
    if latest < 0:  # work with no start time counts as started at 0, yet is never too young
        return [r for r in ranked if r[3] is None or r[3] <= latest]
    kept: list[Ranked] = []
    at, end = 0, len(ranked)
    while at < end:
        priority = ranked[at][0]
        following = bisect_left(ranked, (priority, math.inf), at, end)  # the first of a higher priority
        kept += ranked[bisect_left(ranked, (priority, -latest), at, following) : following]
        at = following
    return kept


class _Placeable:
    """How many replicas of `count` whole devices each pool places, as victims are given back, counted
    without giving anything back. A pool places `n` replicas of `count` devices exactly when its nodes
    that are not held have that many whole free devices in all, counted node by node in multiples of
    `count`: each replica takes `count` of one node's, whichever node it takes."""

    __slots__ = ("count", "places", "free", "whole", "overfull")

    def __init__(self, pools: list[Pool], count: int) -> None:
        self.count = count
        self.places: dict[int, int] = {}  # per pool (its id): the replicas its free devices hold
        for pool in pools:
            buckets = pool.buckets
            self.places[id(pool)] = sum(len(buckets[w].members) * (w // count) for w in range(count, len(buckets)))
        self.free: dict[tuple[int, int], int] = {}  # per (node's id, position): its free share once given back
        self.whole: dict[int, int] = {}  # per node's id: its whole free devices once given back
        # Whether a device would have more free than a whole one (a snapshot whose running work holds
        # devices its nodes count as free): the count no longer says what placing would, and callers
        # place to find out.
        self.overfull = False

    def fits(self, replicas: int) -> bool:
        return any(n >= replicas for n in self.places.values())

    def give(self, running: RunningWork) -> None:
        """Count `running`'s devices as given back."""
        pool = running.pool
        if pool is None or id(pool) not in self.places:
            return
        count, free, whole = self.count, self.free, self.whole
        for node, devices in running.held:
            if node.name in pool.held:
                continue
            before = after = whole.get(id(node), node.whole)
            for position, units in devices:
                device = (id(node), position)
                left = free.get(device, node.free[position])
                free[device] = left + units
                if left + units > UNIT:
                    self.overfull = True
                elif left + units == UNIT:
                    after += 1
            if after != before:
                whole[id(node)] = after
                self.places[id(pool)] += after // count - before // count

    def take(self, running: RunningWork) -> None:
        """Count `running`'s devices, given back (`give`), as held again."""
        pool = running.pool
        if pool is None or id(pool) not in self.places:
            return
        count, free, whole = self.count, self.free, self.whole
        for node, devices in running.held:
            if node.name in pool.held:
                continue
            before = after = whole.get(id(node), node.whole)
            for position, units in devices:
                device = (id(node), position)
                left = free[device]
                free[device] = left - units
                if left == UNIT:
                    after -= 1
            if after != before:
                whole[id(node)] = after
                self.places[id(pool)] += after // count - before // count


class RunningWork(Protocol):
    """A running workload as the engine keeps it: what it holds, and where."""

    @property
    def workload(self) -> Workload: ...

    @property
    def units(self) -> int: ...

    @property
    def pool(self) -> Pool | None: ...

    @property
    def held(self) -> Placed: ...


class Preemption:
    """The victim search over one engine's state, which it reads and leaves as it found it.

    `running_by` and `priorities` are the engine's running workloads and their priorities per
    (workspace, GPU type); `place` is the engine's placement of a workload on the free devices
    (taking them: what it returns is given back here), and `pools` the pools it places it in."""

    def __init__(
        self,
        policy: Policy,
        ledger: Ledger,
        running_by: Mapping[tuple[str, str], Mapping[str, RunningWork]],
        priorities: Mapping[tuple[str, str], Counter[int]],
        place: Callable[[Workload], tuple[Pool, Placed] | None],
        pools: Callable[[Workload], list[Pool]],
    ) -> None:
        self.policy = policy
        self.pools = pools
        self.ledger = ledger
        self.running_by = running_by
        self.priorities = priorities
        self.place = place
        self._borrowers: tuple[int, dict[str, frozenset[str]]] = (-1, {})  # (ledger version, per GPU type)
        # Searches that found no victims that make room, per kind of search (see choose), as (thousandths
        # per replica, replicas, the borrowers and their budgets then): within a pass (one `now`; work admitted in it is
        # spared) a search as large or larger finds none either while the borrowers are the same and
        # nothing was evicted. The engine clears it every pass and after every eviction.
        self.failed: dict[Search, list[tuple[int, int, frozenset[tuple[str, int]]]]] = defaultdict(list)
        # Each workspace's victims in cost order, per GPU type, until its running work changes (see _ranked).
        self.ranked: dict[tuple[str, str], list[Ranked]] = {}
        # The victims found per kind of search in this pass, less those evicted since (see changed).
        self.found: dict[tuple[str, str, int, bool, frozenset[str], float], list[RunningWork]] = {}
        # Running work that is never a victim (the engine's, per pass): on devices fenced for a
        # reservation, what it gives back goes to the reservation, not to the work it is evicted for.
        self.kept: Collection[str] = EMPTY

    def may_preempt_for(self, workload: Workload) -> bool:
        """Preemption is for work within its workspace's nominal quota, or above lower-priority
        work of its own workspace."""
        name, gpu_type = workload.workspace, workload.gpu_type
        units = workload.units
        if self.ledger.used[name, gpu_type] + units <= self.ledger.nominal(name, gpu_type):
            return True
        return any(priority < workload.priority for priority in self.priorities[name, gpu_type])

    def choose(self, workload: Workload, now: float, spared: Collection[str]) -> list[RunningWork]:
        """The fewest, cheapest running workloads whose eviction makes room for `workload`; none if
        no choice does. `spared` are the keys of workloads that may not be evicted (those admitted
        in this cycle)."""
        budget = self.budget(workload)
        borrowers = frozenset(budget.items())  # who may lose work, and how much
        name, gpu_type = workload.workspace, workload.gpu_type
        entitled = self.ledger.used[name, gpu_type] + workload.units <= self.ledger.nominal(name, gpu_type)
        # The candidates depend on these; whether they make room grows harder with the shape (a
        # fraction of a device is searched otherwise than whole devices).
        search = (
            name, gpu_type, workload.priority, entitled, workload.cluster, workload.max_runtime_s,
            workload.widest_units < UNIT,
        )  # fmt: skip
        share, replicas = workload.widest_units, workload.all_replicas
        if any(s <= share and r <= replicas and b == borrowers for s, r, b in self.failed.get(search, ())):
            return []
        everyone = self.victims(workload, now, spared)
        victims = self._within(everyone, budget, self.policy.max_victims)
        needed = self._fewest_that_fit(workload, victims) if victims else None
        if needed is None:  # the cheapest few cannot: choose node by node
            chosen = []
            if (
                victims
                and (not self._monotone(workload, everyone) or self._quota_fits_without(workload, everyone))
                and self._may_place_without(workload, everyone)
            ):
                chosen = self._minimal(workload, self.by_node(workload, everyone, budget))
            if not chosen:
                self.failed[search].append((share, replicas, borrowers))
            return chosen
        chosen = victims[:needed]
        if len(chosen) > 1:  # one costlier victim of no higher class may make room alone: evict fewer
            worst = self.victim_class(workload, chosen[-1])
            for running in victims[len(chosen) :]:
                if self.victim_class(workload, running) != worst:
                    break
                if self.fits_without(workload, [running]):
                    chosen = [running]
                    break
        return self._minimal(workload, chosen)

    def _minimal(self, workload: Workload, chosen: list[RunningWork]) -> list[RunningWork]:
        """`chosen` without the victims the others already make room without (costliest first); each
        is given back and taken again a constant number of times."""
        kept = list(chosen)
        if len(kept) < 2:
            return kept
        counted = self._counted(workload)
        if counted is not None:
            for running in chosen:
                counted.give(running)
            if not counted.overfull:
                return self._minimal_counted(workload, chosen, counted)
        for running in chosen:
            self._give_back(running)
        try:
            for running in reversed(chosen):
                if len(kept) < 2:
                    break
                self._take_again(running)  # not evicted: does the workload still fit?
                if self._fits(workload):
                    kept.remove(running)
                else:
                    self._give_back(running)
            return kept
        finally:
            for running in kept:
                self._take_again(running)

    def _minimal_counted(self, workload: Workload, chosen: list[RunningWork], counted: _Placeable) -> list[RunningWork]:
        """`_minimal` for work whose devices are counted (`counted`, with every one of `chosen` given
        back and no device overfull): each victim taken again in the count and in the ledger alone,
        the pools left as they are."""
        ledger, gpu_type, replicas = self.ledger, workload.gpu_type, workload.replicas
        kept = list(chosen)  # given back, in the count and the ledger
        for running in chosen:
            ledger.add(running.workload.workspace, gpu_type, -running.units)
        try:
            for running in reversed(chosen):
                if len(kept) < 2:
                    break
                counted.take(running)  # not evicted: does the workload still fit?
                ledger.add(running.workload.workspace, gpu_type, running.units)
                if counted.fits(replicas) and ledger.check(workload, workload.units)[0]:
                    kept.remove(running)
                else:
                    counted.give(running)
                    ledger.add(running.workload.workspace, gpu_type, -running.units)
            return kept
        finally:
            for running in kept:
                ledger.add(running.workload.workspace, gpu_type, running.units)

    def budget(self, workload: Workload) -> dict[str, int]:
        """What each other workspace uses above its nominal quota: its work may be evicted for
        `workload` while some of that is left (Kueue's reclaim rule)."""
        gpu_type, used, nominal = workload.gpu_type, self.ledger.used, self.ledger.nominal
        return {
            ws: used[ws, gpu_type] - nominal(ws, gpu_type)
            for ws in self.borrowers(gpu_type)
            if ws != workload.workspace
        }

    @staticmethod
    def _within(victims: list[RunningWork], budget: Mapping[str, int], most: int | None = None) -> list[RunningWork]:
        """`victims` (cheapest first) less those of a workspace no longer above its nominal quota
        once the cheaper ones are gone (every prefix keeps to the rule), the first `most` of them if
        given (those that follow do not change which come first). Work of a workspace without a
        budget (the workload's own, for priority) is not limited."""
        spent: dict[str, int] = {}  # of the budgets, by the victims kept so far (the budget is not copied)
        kept: list[RunningWork] = []
        for running in victims:
            if len(kept) == most:
                break
            ws = running.workload.workspace
            left = budget.get(ws)
            if left is not None:
                so_far = spent.get(ws, 0)
                if left - so_far <= 0:
                    continue  # no longer above its nominal quota once the cheaper ones are gone
                spent[ws] = so_far + running.units
            kept.append(running)
        return kept

    def by_node(
        self, workload: Workload, victims: list[RunningWork], budget: Mapping[str, int] | None = None
    ) -> list[RunningWork]:
        """Victims chosen node by node (`victims` cheapest first, each workspace's victims together
        within its `budget`): on each node, the cheapest that free a replica's devices there (whole
        devices, or one device's share for a fraction); the nodes that take the fewest and
        cheapest; then, if quota still refuses, the cheapest others. [] if no choice makes room."""
        share = workload.widest_units
        if not victims:
            return []
        budget = budget or {}
        on_node: dict[int, dict[PoolNode, list[RunningWork]]] = defaultdict(lambda: defaultdict(list))
        pools: dict[int, Pool] = {}
        for running in victims:
            if running.pool is None:
                continue
            pools[id(running.pool)] = running.pool
            on_pool = on_node[id(running.pool)]
            for held_node, _ in running.held:
                on_held = on_pool[held_node]
                if not on_held or on_held[-1] is not running:  # once per node it holds devices on
                    on_held.append(running)
        best: tuple[tuple[int, ...], list[RunningWork]] | None = None
        for pool_id, pool in pools.items():
            plans: list[tuple[tuple[int, int], list[RunningWork]]] = []
            on_pool = on_node[pool_id]
            # The nodes with victims, and those with room already, in the pool's order (the others
            # have nothing to evict and not enough free).
            for node in sorted(on_pool.keys() | pool.roomy(share), key=pool.order.__getitem__):
                plan = self._free_on(node, share, on_pool.get(node, []), budget)
                if plan is not None:
                    plans.append(((len(plan), -node.whole), plan))
            plans.sort(key=lambda pair: pair[0])
            picked = self._together(plans, workload.all_replicas, budget)
            if picked is None:
                continue
            cost = (sum(c[0] for c, _ in picked),)
            if best is None or cost < best[0]:
                chosen: list[RunningWork] = []
                for _, plan in picked:
                    chosen.extend(r for r in plan if r not in chosen)
                best = (cost, chosen)
        if best is None:
            return []
        chosen = best[1]
        order = {id(running): n for n, running in enumerate(victims)}
        if self.fits_without(workload, chosen):
            return sorted(chosen, key=lambda r: order[id(r)])
        # Quota: evicting on those nodes may not give enough back. The fewest of the cheapest others
        # that do, found with a logarithmic number of checks (more victims never fit less).
        taken = {id(running) for running in chosen}
        left = dict(budget)
        for running in chosen:
            if running.workload.workspace in left:
                left[running.workload.workspace] -= running.units
        others = self._within([running for running in victims if id(running) not in taken], left)
        needed = self._fewest_more(workload, chosen, others) if others else None
        if needed is None:
            return []
        return sorted(chosen + others[:needed], key=lambda r: order[id(r)])

    def _fewest_more(self, workload: Workload, chosen: list[RunningWork], others: list[RunningWork]) -> int | None:
        """How many of `others`, cheapest first, must go too for `workload` to fit once `chosen` are
        gone (None if all of them do not do): a binary search (more victims never fit less) that
        gives back and takes again only what changes between its checks. Where more victims never
        let quota take the workload less (`_monotone`) and its devices are counted (`_counted`), quota
        and devices are each asked for their shortest start, nothing given back to the pools."""
        if not workload.more and self._monotone(workload, chosen + others):
            counted = self._fewest_more_counted(workload, chosen, others)
            if counted != -1:
                return counted
        given = 0  # others[:given] are given back

        def move(to: int) -> None:
            nonlocal given
            while given < to:
                self._give_back(others[given])
                given += 1
            while given > to:
                given -= 1
                self._take_again(others[given])

        for running in chosen:
            self._give_back(running)
        try:
            move(len(others))
            if not self._fits(workload):
                return None
            low, high = 0, len(others)  # chosen + others[:high] fits; chosen + others[:low] does not
            while high - low > 1:
                middle = (low + high) // 2
                move(middle)
                if self._fits(workload):
                    high = middle
                else:
                    low = middle
            return high
        finally:
            move(0)
            for running in chosen:
                self._take_again(running)

    def _fewest_more_counted(
        self, workload: Workload, chosen: list[RunningWork], others: list[RunningWork]
    ) -> int | None:
        """`_fewest_more` by counting devices and asking the ledger alone, for work of one shape of
        whole devices whose quota more victims never make refuse: the longer of the shortest start
        of `others` that places it and that quota takes (None if all of them do not do); -1 where
        devices cannot be counted. Every one of `others` is counted: the binary search it stands for
        looks at any start of them, and with a device overfull (see `_Placeable`) in any, more
        victims may place less."""
        counted = self._counted(workload)
        if counted is None:
            return -1
        replicas = workload.replicas
        for running in chosen:
            counted.give(running)
        placed = 0 if counted.fits(replicas) else None  # the shortest start that places it
        for at, running in enumerate(others, 1):
            counted.give(running)
            if placed is None and counted.fits(replicas):
                placed = at
        if counted.overfull:
            return -1
        if placed is None:
            return None
        ledger, gpu_type = self.ledger, workload.gpu_type
        for running in chosen:
            ledger.add(running.workload.workspace, gpu_type, -running.units)
        try:
            quota = self._fewest_for_quota(workload, others)
        finally:
            for running in chosen:
                ledger.add(running.workload.workspace, gpu_type, running.units)
        return None if quota is None else max(quota, placed)

    @staticmethod
    def _together(
        plans: list[tuple[tuple[int, int], list[RunningWork]]], replicas: int, budget: Mapping[str, int]
    ) -> list[tuple[tuple[int, int], list[RunningWork]]] | None:
        """The cheapest `replicas` of the nodes' `plans` (cheapest first) whose victims together keep
        every workspace within its budget, or None: a node whose plan would overdraw one is passed."""
        left = dict(budget)
        picked = []
        for plan in plans:
            after = dict(left)
            if any(not Preemption._spend(after, running) for running in plan[1]):
                continue
            left = after
            picked.append(plan)
            if len(picked) == replicas:
                return picked
        return None

    @staticmethod
    def _spend(left: dict[str, int], running: RunningWork) -> bool:
        """Take `running` out of its workspace's budget in `left`; False if that workspace is no
        longer above its nominal quota (Kueue evicts from a workspace while it still borrows)."""
        ws = running.workload.workspace
        if ws not in left:
            return True
        if left[ws] <= 0:
            return False
        left[ws] -= running.units
        return True

    @staticmethod
    def _free_on(
        node: PoolNode, share: int, victims: list[RunningWork], budget: Mapping[str, int]
    ) -> list[RunningWork] | None:
        """The cheapest of `victims` (those `_within` their `budget` keeps) whose eviction frees a
        replica of `share` thousandths on `node` (what they hold there given back): that many whole
        devices, or for a fraction one device whose free share reaches it, choosing the device that
        takes the fewest victims; None if all of them do not."""
        if share < UNIT:
            return Preemption._free_share_on(node, share, Preemption._within(victims, budget))
        count = share // UNIT
        free = node.free
        whole = sum(1 for f in free if f >= UNIT)  # whole free devices, counted as victims free more
        if whole >= count:
            return []
        freed: dict[int, int] = {}  # per device position, what the victims so far hold there
        plan: list[RunningWork] = []
        spent: dict[str, int] = {}  # of the budgets, by the victims in the plan (as `_within`)
        for running in victims:
            ws = running.workload.workspace
            left = budget.get(ws)
            if left is not None:
                so_far = spent.get(ws, 0)
                if left - so_far <= 0:
                    continue
                spent[ws] = so_far + running.units
            plan.append(running)
            for held_node, devices in running.held:
                if held_node is node:
                    for position, units in devices:
                        before = free[position] + freed.get(position, 0)
                        freed[position] = before + units - free[position]
                        if before < UNIT <= before + units:
                            whole += 1
            if whole >= count:
                return plan
        return None

    @staticmethod
    def _free_share_on(node: PoolNode, share: int, victims: list[RunningWork]) -> list[RunningWork] | None:
        """A fraction: on each device of `node`, the cheapest of `victims` holding a share of it until
        its free share reaches `share`; the device that takes the fewest (then the cheapest)."""
        if any(f >= share for f in node.free):
            return []
        on_device: dict[int, list[tuple[int, RunningWork]]] = defaultdict(list)
        for running in victims:
            for held_node, devices in running.held:
                if held_node is node:
                    for position, units in devices:
                        on_device[position].append((units, running))
        best: list[RunningWork] | None = None
        for position in sorted(on_device):
            free, plan = node.free[position], []
            for units, running in on_device[position]:
                plan.append(running)
                free += units
                if free >= share:
                    if best is None or len(plan) < len(best):
                        best = plan
                    break
        return best

    def victims(self, workload: Workload, now: float, spared: Collection[str]) -> list[RunningWork]:
        """Who may be evicted for `workload`, cheapest first: borrowers from other workspaces when it
        is within its nominal quota, then lower-priority work of its own workspace; never
        non-preemptible work, work younger than `min_runtime_s` or work in `spared` (the work admitted
        in this pass, which only grows within it). The list is shared: not to be changed."""
        name, gpu_type = workload.workspace, workload.gpu_type
        entitled = self.ledger.used[name, gpu_type] + workload.units <= self.ledger.nominal(name, gpu_type)
        asked = (name, gpu_type, workload.priority, entitled, self.borrowers(gpu_type), now)
        found = self.found.get(asked)
        if found is None:
            found = self.found[asked] = self._victims(workload, entitled, now, spared)
        return found

    def _victims(self, workload: Workload, entitled: bool, now: float, spared: Collection[str]) -> list[RunningWork]:
        name, gpu_type = workload.workspace, workload.gpu_type
        cohort = self.ledger.workspace(name).cohort
        # Cheapest first: other workspaces' borrowers (of the same cohort, whose loan this is, first),
        # then lower-priority work of its own; in each, lower priority, then the most recently started
        # (least work lost). Each workspace's work is kept in that order (see _ranked), so that the
        # groups are merged rather than sorted anew.
        latest = now - self.policy.min_runtime_s  # started later: too young to evict
        same: list[Ranked] = []
        elsewhere: list[Ranked] = []
        for ws in self.borrowers(gpu_type) if entitled else ():
            if ws != name:
                group = same if self.ledger.workspace(ws).cohort == cohort else elsewhere
                group += _started_by(self._ranked(ws, gpu_type), latest)
        own: list[Ranked] = []
        if any(priority < workload.priority for priority in self.priorities[name, gpu_type]):
            own = [r for r in _started_by(self._ranked(name, gpu_type), latest) if r[0] < workload.priority]
        chosen: list[RunningWork] = []
        for group in (same, elsewhere, own):
            group.sort()  # runs already in order: merged
            chosen += [ranked[4] for ranked in group]
        if self.policy.min_runtime_s <= 0:  # work admitted in this pass is not too young: spare it
            chosen = [running for running in chosen if running.workload.key not in spared]
        if self.kept:
            chosen = [running for running in chosen if running.workload.key not in self.kept]
        return chosen

    def changed(self, running: RunningWork, stopped: bool) -> None:
        """`running` started or stopped: its workspace's victims of its type are ranked again, and once
        it stopped (evicted), it leaves every search's victims found (what is left is what finding
        them again would give: each workspace's work in the same order, less it). Work started in a
        pass is never a victim in it (too young, and spared): what was found holds until then."""
        workload = running.workload
        self.ranked.pop((workload.workspace, workload.gpu_type), None)
        if stopped:
            for found in self.found.values():
                if running in found:
                    found.remove(running)

    def new_pass(self) -> None:
        """A pass begins: nothing it knew of failed searches or victims holds any longer."""
        self.failed.clear()
        self.found.clear()

    def _ranked(self, name: str, gpu_type: str) -> list[Ranked]:
        """`name`'s running preemptible `gpu_type` work holding GPUs, cheapest first: by priority, then
        the latest started (least work lost), then key."""
        ranked = self.ranked.get((name, gpu_type))
        if ranked is None:
            ranked = [
                (w.priority, -(w.started_at or 0.0), w.key, w.started_at, running)
                for running in self.running_by[name, gpu_type].values()
                if (w := running.workload).preemptible and running.units
            ]
            ranked.sort()
            self.ranked[name, gpu_type] = ranked
        return ranked

    def borrowers(self, gpu_type: str) -> frozenset[str]:
        """The workspaces using more `gpu_type` than their nominal quota (worked out again only when
        the ledger changed)."""
        version, by_type = self._borrowers
        if version != self.ledger.version:
            found: dict[str, set[str]] = defaultdict(set)
            for (ws, t), used in self.ledger.used.items():
                if used > self.ledger.nominal(ws, t):
                    found[t].add(ws)
            by_type = {t: frozenset(names) for t, names in found.items()}
            self._borrowers = (self.ledger.version, by_type)
        return by_type.get(gpu_type, EMPTY)

    def victim_class(self, workload: Workload, running: RunningWork) -> tuple[int, int, int]:
        """The cost order of `victims` before recency: other workspaces' borrowers (of the same cohort
        first), then priority."""
        victim = running.workload
        cohort = self.ledger.workspace(workload.workspace).cohort
        elsewhere = int(self.ledger.workspace(victim.workspace).cohort != cohort)
        return (0 if victim.workspace != workload.workspace else 1, elsewhere, victim.priority)

    def fits_without(self, workload: Workload, victims: list[RunningWork]) -> bool:
        """Whether `workload` would fit, quota and devices, were `victims` gone; nothing changes."""
        counted = self._fits_without_counted(workload, victims)
        if counted is not None:
            return counted
        for running in victims:
            self._give_back(running)
        try:
            return self._fits(workload)
        finally:
            for running in victims:
                self._take_again(running)

    def _monotone(self, workload: Workload, victims: list[RunningWork]) -> bool:
        """Whether evicting more of `victims` never lets quota take `workload` less: it is within its
        workspace's nominal quota already, or it would still be above it with all of its own
        workspace's work among them gone. Other workspaces' work given back only adds to what its
        cohort has idle and takes from what it has borrowed, and its own, given back while it is
        within its nominal quota, leaves more of that quota idle, or, while it stays above, asks
        less of what the others lend; but its own, given back while it borrows, may bring it within
        its nominal quota, where it is refused while that quota is lent to others."""
        name, gpu_type = workload.workspace, workload.gpu_type
        used, nominal = self.ledger.used[name, gpu_type] + workload.units, self.ledger.nominal(name, gpu_type)
        if used <= nominal:
            return True
        return used - sum(running.units for running in victims if running.workload.workspace == name) > nominal

    def _quota_fits_without(self, workload: Workload, victims: list[RunningWork]) -> bool:
        """Whether quota would let `workload` in were all of `victims` gone, whatever their budgets:
        where it would not and they are `_monotone`, no choice among them does, and no search succeeds.
        Only the ledger is asked, with what each workspace would give back added up; nothing changes."""
        ledger, gpu_type = self.ledger, workload.gpu_type
        freed: dict[str, int] = defaultdict(int)
        for running in victims:
            freed[running.workload.workspace] += running.units
        for ws, units in freed.items():
            ledger.add(ws, gpu_type, -units)
        try:
            return ledger.check(workload, workload.units)[0]
        finally:
            for ws, units in freed.items():
                ledger.add(ws, gpu_type, units)

    def _fewest_that_fit(self, workload: Workload, victims: list[RunningWork]) -> int | None:
        """The shortest start of `victims` whose eviction makes room for `workload` (its length), or
        None if all of them do not: one more victim given back at a time, until it fits.

        Where none of them is the workload's own workspace's (`_monotone`), more victims never let
        quota take it less: quota is asked first, of the ledger alone (`_fewest_for_quota`), and no
        shorter start makes room. Then devices are counted, nothing given back, where they can be
        (`_fewest_to_place`): the longer of the two starts is the answer. Otherwise one victim at
        a time from there, as before."""
        least = 1
        if not workload.more and self._monotone(workload, victims):
            found = self._fewest_for_quota(workload, victims)
            if found is None:
                return None
            least = found
            counted = self._fewest_to_place(workload, victims)
            if counted is not None:
                return None if counted < 0 else max(least, counted)
        given = 0
        try:
            for running in victims:
                self._give_back(running)
                given += 1
                if given >= least and self._fits(workload):
                    return given
            return None
        finally:
            for running in victims[:given]:
                self._take_again(running)

    def _counted(self, workload: Workload) -> _Placeable | None:
        """What counts the devices freed for `workload`, if it is work of one shape of whole devices
        that may not backfill held nodes; None for other work (it is placed to find out)."""
        share = workload.replica_units
        if workload.more or share < UNIT or share % UNIT:
            return None
        pools = self.pools(workload)
        if workload.max_runtime_s is not None and any(pool.held for pool in pools):
            return None
        return _Placeable(pools, share // UNIT)

    def _fewest_to_place(self, workload: Workload, victims: list[RunningWork]) -> int | None:
        """The shortest start of `victims` (at least one) whose eviction leaves room to place
        `workload`, -1 if all of them do not, by counting (`_Placeable`), with nothing given back;
        None for work that is placed to find out."""
        counted = self._counted(workload)
        if counted is None:
            return None
        for at, running in enumerate(victims, 1):
            counted.give(running)
            if counted.overfull:
                return None
            if counted.fits(workload.replicas):
                return at
        return -1

    def _may_place_without(self, workload: Workload, victims: list[RunningWork]) -> bool:
        """False where counting (`_Placeable`) shows that `workload`'s devices are not found even with
        every one of `victims` gone: then no choice among them places it, and a search node by node
        finds nothing. True where they may be, or where the count cannot tell (work placed to find out)."""
        counted = self._counted(workload)
        if counted is None:
            return True
        replicas = workload.replicas
        for running in victims:
            counted.give(running)
            if counted.overfull or counted.fits(replicas):
                return True
        return counted.fits(replicas)

    def _fits_without_counted(self, workload: Workload, victims: list[RunningWork]) -> bool | None:
        """`fits_without` by counting, nothing given back; None for work that is placed to find out."""
        counted = self._counted(workload)
        if counted is None:
            return None
        for running in victims:
            counted.give(running)
        if counted.overfull:
            return None
        return counted.fits(workload.replicas) and self._quota_fits_without(workload, victims)

    def _fewest_for_quota(self, workload: Workload, victims: list[RunningWork]) -> int | None:
        """The shortest start of `victims` (at least one) whose eviction lets quota take `workload`,
        or None if all of them do not; the ledger alone is changed, and left as it was. All of them
        first (`_quota_fits_without`), then the first few one by one, then a binary search."""
        if not self._quota_fits_without(workload, victims):
            return None
        ledger, gpu_type, units = self.ledger, workload.gpu_type, workload.units
        given = 0

        def move(to: int) -> None:
            nonlocal given
            while given < to:
                ledger.add(victims[given].workload.workspace, gpu_type, -victims[given].units)
                given += 1
            while given > to:
                given -= 1
                ledger.add(victims[given].workload.workspace, gpu_type, victims[given].units)

        try:
            low, high = 0, len(victims)  # victims[:high] make room for quota; victims[:low] do not
            while low < min(high - 1, FIRST_ONE_BY_ONE):  # the first few one by one: the common answer
                move(low + 1)
                if ledger.check_units(workload.workspace, gpu_type, units)[0]:
                    return given
                low += 1
            while high - low > 1:
                middle = (low + high) // 2
                move(middle)
                if ledger.check_units(workload.workspace, gpu_type, units)[0]:
                    high = middle
                else:
                    low = middle
            return high
        finally:
            move(0)

    def _fits(self, workload: Workload) -> bool:
        fits, _, _ = self.ledger.check(workload, workload.units)
        if not fits:
            return False
        found = self.place(workload)
        if found is None:
            return False
        pool, placed = found
        for node, devices in reversed(placed):
            pool.give(node, devices)
        return True

    def _give_back(self, running: RunningWork) -> None:
        if running.pool is not None:
            for node, devices in running.held:
                running.pool.give(node, devices)
        if running.units:
            self.ledger.add(running.workload.workspace, running.workload.gpu_type, -running.units)

    def _take_again(self, running: RunningWork) -> None:
        if running.pool is not None:
            for node, devices in running.held:
                running.pool.take(node, devices)
        if running.units:
            self.ledger.add(running.workload.workspace, running.workload.gpu_type, running.units)

    def decision(self, victim: Workload, workload: Workload) -> Preempt:
        """The engine's decision to evict `victim` for `workload`: checkpoint-aware work gets `grace_s`."""
        grace = self.policy.grace_s if victim.checkpointable else 0.0
        return Preempt(victim.key, preempt_reason(victim, workload), workload.key, grace)


def preempt_reason(victim: Workload, workload: Workload) -> str:
    """What the victim is told."""
    if victim.workspace != workload.workspace:
        return (
            f"preempted to give workspace {workload.workspace} back its quota: workspace {victim.workspace} "
            f"was borrowing {victim.gpu_type} GPUs"
        )
    return f"preempted for higher-priority {workload.key} (priority {workload.priority} > {victim.priority})"
