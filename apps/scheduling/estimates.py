"""Estimated starts: when each pending workload should start if everything ahead of it runs its
expected time. Part of the pure scheduling core (no Django), worked out by the engine's cycles
with `explain` and by the trace replay's `--estimates`."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Protocol

from apps.scheduling.ledger import Ledger
from apps.scheduling.placement import Pool
from apps.scheduling.types import Workload, units_of

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
        counts: dict[tuple[str, str], tuple[list[Scope], list[Scope]]] = {}
        ends = self._running_ends(now, counts)
        free: dict[Scope, int] = {}
        clocks: dict[Scope, float] = defaultdict(lambda: now)
        estimates: dict[str, float] = {}
        for workload in order:
            need = units_of(workload.total_gpus)
            if not need:
                continue
            waits_on, takes_from = self._counts(workload.workspace, workload.gpu_type, counts)
            start = max(now, workload.eligible_at)
            for scope in waits_on:
                if scope not in free:
                    free[scope] = self._room(scope)
                events = ends[scope]
                while free[scope] < need and events:
                    end, units = heapq.heappop(events)
                    free[scope] += units
                    clocks[scope] = max(clocks[scope], end)
                start = max(start, clocks[scope])
            if any(free[scope] < need for scope in waits_on):
                continue  # more than could ever be free at once: no estimate
            if start <= now:
                # The counts have room now, yet it did not start: what they leave out (placement, a
                # node held, the cluster it asked for) holds it until at least the next end of its type.
                events = ends[waits_on[0]]
                start = events[0][0] if events else math.inf
                for scope in waits_on:
                    clocks[scope] = max(clocks[scope], start)
            end = start + self._runtime(workload)
            for scope in takes_from:
                if scope not in free:
                    free[scope] = self._room(scope)
                free[scope] -= need
                heapq.heappush(ends[scope], (end, need))
            if start < math.inf:
                estimates[workload.key] = start
        return estimates

    def _running_ends(
        self, now: float, counts: dict[tuple[str, str], tuple[list[Scope], list[Scope]]]
    ) -> dict[Scope, list[tuple[float, int]]]:
        """Per count, a heap of (expected end, thousandths of a GPU) of the running work it holds."""
        ends: dict[Scope, list[tuple[float, int]]] = defaultdict(list)
        for running in self.engine.running.values():
            w = running.workload
            if running.units:
                end = self._expected_end(w, now)
                for scope in self._counts(w.workspace, w.gpu_type, counts)[1]:
                    ends[scope].append((end, running.units))
        for events in ends.values():
            heapq.heapify(events)
        return ends

    def _counts(
        self, name: str, gpu_type: str, known: dict[tuple[str, str], tuple[list[Scope], list[Scope]]]
    ) -> tuple[list[Scope], list[Scope]]:
        """(the counts a workload of this workspace and type must find room in, those its GPUs take
        from): the cluster's GPUs of the type, first; its workspace's quota, up to all it could ever
        borrow; and, where it may borrow, its cohort's quotas together, which bound what the cohort's
        workspaces hold however they lend and borrow (work of all of them takes from that count).

        A quota count at least as large as the cluster's GPUs of the type is left out: it always has
        at least as much room as the GPUs' count (it starts with as much, and what runs outside it
        only lowers the GPUs' count), so it could never be the one to wait for."""
        if (name, gpu_type) not in known:
            capacity = self.engine.capacity.get(gpu_type, 0)
            gpus: Scope = ("type", gpu_type)
            quota: list[Scope] = []
            if self.ledger.ceiling(name, gpu_type, self.lendable) < capacity:
                quota.append(("workspace", name, gpu_type))
            ws = self.ledger.workspace(name)
            cohort: list[Scope] = []
            if ws.cohort is not None and self.ledger.borrowing and self._cohort_quota(ws.cohort, gpu_type) < capacity:
                cohort.append(("cohort", ws.cohort, gpu_type))
            known[name, gpu_type] = [gpus, *quota, *(cohort if ws.can_borrow else [])], [gpus, *quota, *cohort]
        return known[name, gpu_type]

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
