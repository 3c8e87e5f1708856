"""Estimated starts: when each pending workload should start if everything ahead of it runs its
expected time. Part of the pure scheduling core (no Django), worked out by the engine's cycles
with `explain` and by the trace replay's `--estimates`."""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from typing import Protocol

from apps.scheduling.ledger import Ledger
from apps.scheduling.placement import Pool
from apps.scheduling.types import Workload

Scope = tuple[str, ...]  # a count of GPUs that estimates follow: ("type", t), ("workspace", w, t), ("cohort", c, t)


class RunningWork(Protocol):
    @property
    def workload(self) -> Workload: ...

    @property
    def units(self) -> int: ...


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
    def running(self) -> Mapping[str, RunningWork]: ...


class _Count:
    """A count of GPUs in a pass of estimates: what it has free, the latest end waited for in it, and
    when the work it holds is expected to end: a heap of the moments, and the thousandths of a GPU
    that end at each. (Work that ends at the same moment is freed at once; freed a part at a time,
    the rest would be taken later without moving the clock, which is the same.)"""

    __slots__ = ("at", "clock", "ends", "room")

    def __init__(self, room: int, clock: float) -> None:
        self.room = room
        self.clock = clock
        self.ends: list[float] = []
        self.at: dict[float, int] = {}

    def hold(self, end: float, units: int) -> None:
        """`units` more of it are held until `end` (the heap is made or kept by the caller)."""
        if end in self.at:
            self.at[end] += units
        else:
            self.at[end] = units
            self.ends.append(end)


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
        goes on, as far as anyone knows, for as long again as it has run (runtimes are heavy-tailed:
        the longer a run has lasted, the longer it is likely to last), but never past its declared
        limit; once that has passed too, or with no runtime at all, its end is unknown (inf). Never
        `now` or before."""
        started = now if workload.started_at is None else workload.started_at
        end = started + self._runtime(workload)
        if end > now:
            return end
        end = now + max(now - started, 1.0)
        if workload.max_runtime_s is not None:
            end = min(end, started + workload.max_runtime_s)
        return end if end > now else math.inf

    def estimate(self, now: float, order: list[Workload]) -> dict[str, float]:
        """When each pending workload should start if everything ahead runs its expected time.

        Counts of GPUs (see `_counts`), and the latest wins: each must have room for it. Running work
        ends as `_expected_end` says; pending work starts in queue order as soon as its counts have
        room and runs `_runtime`. An unknown end (inf) that a workload must wait for leaves it without
        an estimate, and so every one after it in the same count. Neither placement nor preemption is
        modelled: a gang may start later than its estimate, reclaimed quota earlier.
        """
        starts = self.starts(now, order)
        return {workload.key: start for workload, start in zip(order, starts, strict=True) if start is not None}

    def starts(self, now: float, order: list[Workload]) -> list[float | None]:
        """`estimate`'s figures as a list in the order of `order`: None where it gives none."""
        state: dict[Scope, _Count] = {}
        groups: dict[tuple[str, str], tuple[list[_Count], list[_Count]]] = {}  # per (workspace, type)
        self._running_ends(now, state, groups)
        starts: list[float | None] = []
        known = starts.append
        heappop, heappush, inf = heapq.heappop, heapq.heappush, math.inf
        for workload in order:
            need = workload.units
            if not need:
                known(None)
                continue
            group = groups.get((workload.workspace, workload.gpu_type))
            waits_on, takes_from = group or self._group(workload.workspace, workload.gpu_type, now, state, groups)
            start = workload.eligible_at if workload.eligible_at > now else now
            short = False
            for count in waits_on:
                if count.room < need:
                    room, clock, events, at = count.room, count.clock, count.ends, count.at
                    while room < need and events:
                        end = heappop(events)
                        room += at.pop(end)
                        if end > clock:
                            clock = end
                    count.room, count.clock = room, clock
                    short = short or room < need
                if count.clock > start:
                    start = count.clock
            if short:
                known(None)  # more than could ever be free at once: no estimate
                continue
            if start <= now:
                # The counts have room now, yet it did not start: what they leave out (placement, a
                # node held, the cluster it asked for) holds it until at least the next end of its type.
                events = waits_on[0].ends
                start = events[0] if events else inf
                for count in waits_on:
                    count.clock = max(count.clock, start)
            # start + _runtime(workload), worked out in place
            expected, limit = workload.expected_runtime_s, workload.max_runtime_s
            if expected is None:
                end = start + (inf if limit is None else limit)
            else:
                end = start + (expected if limit is None or not limit < expected else limit)
            for count in takes_from:
                count.room -= need
                at = count.at
                if end in at:
                    at[end] += need
                else:
                    at[end] = need
                    heappush(count.ends, end)
            known(start if start < inf else None)
        return starts

    def _running_ends(
        self, now: float, state: dict[Scope, _Count], groups: dict[tuple[str, str], tuple[list[_Count], list[_Count]]]
    ) -> None:
        """When the running work each count holds is expected to end, and how much of it."""
        for running in self.engine.running.values():
            w = running.workload
            if running.units:
                end = self._expected_end(w, now)
                for count in (
                    groups.get((w.workspace, w.gpu_type)) or self._group(w.workspace, w.gpu_type, now, state, groups)
                )[1]:
                    count.hold(end, running.units)
        for count in state.values():
            heapq.heapify(count.ends)

    def _group(
        self,
        name: str,
        gpu_type: str,
        now: float,
        state: dict[Scope, _Count],
        groups: dict[tuple[str, str], tuple[list[_Count], list[_Count]]],
    ) -> tuple[list[_Count], list[_Count]]:
        """`_counts` of a workspace and type, as the counts' states (made on first use)."""
        waits_on, takes_from = self._counts(name, gpu_type)
        for scope in takes_from:
            if scope not in state:
                state[scope] = _Count(self._room(scope), now)
        group = groups[name, gpu_type] = [state[s] for s in waits_on], [state[s] for s in takes_from]
        return group

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
