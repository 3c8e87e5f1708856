"""Estimated starts are worked out with fewer counts, fewer events and less searching than the plain
model states, and must come out the same: a workspace's own quota count is left out where its
cohort's count is always the one waited for, work that ends at the same moment is freed at once, a
workspace that had no room at a moment is not asked again before the next, and the ranks are kept
in a heap. Checked here against the plain model, written out in full, over random clusters."""

from __future__ import annotations

import math
import random
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.scheduling.engine import Engine
from apps.scheduling.estimates import Scope, StartEstimates, _Fits, _Nodes
from apps.scheduling.types import UNIT, Device, NodeInfo, Policy, ReplicaPlacement, Workload
from tests.scheduling.builders import ws

D = Decimal
NOW = 10_000.0
RUNTIMES = (None, 60.0, 600.0, 600.0, 3600.0, 3600.0)  # few, so that many runs end at the same moment


def plain_estimates(estimates: StartEstimates, now: float, order: list[Workload]) -> dict[str, float]:
    """The model as docs/scheduler.md states it: every count; at each moment, of all the waiting work
    its counts have room for and that fits the nodes, the workload of the workspace and type that
    ranks first (within its nominal quota, then the lower share, then the name), the first of them
    in line, starts, again and again; then on to the next moment work ends or becomes eligible,
    where what a workspace with no work waiting had in use, within its nominal quota, is kept for
    its work not yet submitted, as long again as the longest of its runs that ended then. The nodes
    are followed as the estimates follow them (`_Fits`), with no gang starving (the order in which
    gangs are asked decides which one nodes are held for)."""
    engine, ledger = estimates.engine, estimates.ledger
    assert engine.policy.starvation_s == math.inf

    def counts(name: str, gpu_type: str) -> tuple[list[Scope], list[Scope]]:
        capacity = engine.capacity.get(gpu_type, 0)
        quota: list[Scope] = []
        if ledger.ceiling(name, gpu_type, estimates.lendable) < capacity:
            quota.append(("workspace", name, gpu_type))
        info = ledger.workspace(name)
        cohort: list[Scope] = []
        if info.cohort is not None and ledger.borrowing and estimates._cohort_quota(info.cohort, gpu_type) < capacity:
            cohort.append(("cohort", info.cohort, gpu_type))
        gpus: Scope = ("type", gpu_type)
        return [gpus, *quota, *(cohort if info.can_borrow else [])], [gpus, *quota, *cohort]

    def share(key: tuple[str, str]) -> float:
        capacity = engine.capacity.get(key[1], 0)
        if not capacity:
            return 0.0  # no GPUs of the type: nothing of it fits anyway
        past = engine.history.get(key, 0.0) * UNIT / engine.policy.half_life_s
        return (used.get(key, 0) + past) * (1.0 / (capacity * max(ledger.workspace(key[0]).weight, 1e-6)))

    room: dict[Scope, int] = {}
    used = {key: units for key, units in ledger.used.items() if units}
    kept = {key: min(units, ledger.nominal(*key)) for key, units in used.items()}
    nodes = estimates._nodes(order)
    fits = _Fits(order, nodes, math.inf)
    giving: list[tuple[float, _Nodes, str, int]] = []
    # (moment, whose, units, how long the run lasted, whether it was kept for work not yet submitted)
    ends: list[tuple[float, tuple[str, str], int, float, bool]] = []
    for running in engine.running.values():
        w = running.workload
        for scope in counts(w.workspace, w.gpu_type)[1]:
            room.setdefault(scope, estimates._room(scope))
        end = estimates._expected_end(w, now)
        if running.units and end < math.inf:
            ends.append((end, (w.workspace, w.gpu_type), running.units, end - (w.started_at or now), False))
            given: list[tuple[_Nodes, str, int]] = []
            if w.gpu_type in nodes:
                estimates._gives_back(running, nodes[w.gpu_type], given)
            giving.extend((end, *item) for item in given)
    soonest = {t: min((e[0] for e in ends if e[1][1] == t), default=math.inf) for t in engine.capacity}
    waiting = [w for w in order if w.units]
    for w in waiting:
        for scope in counts(w.workspace, w.gpu_type)[1]:
            room.setdefault(scope, estimates._room(scope))
    out: dict[str, float] = {}
    moment = now
    fits.moment = now
    while True:
        while True:  # every workload that fits at this moment, the first-ranked first
            fitting = [
                w
                for w in waiting
                if w.eligible_at <= moment
                and all(room[s] >= w.units for s in counts(w.workspace, w.gpu_type)[0])
                and fits(order.index(w))
            ]
            if not fitting:
                break

            def rank(w: Workload) -> tuple[int, float, tuple[str, str]]:
                key = (w.workspace, w.gpu_type)
                head = next(x for x in waiting if (x.workspace, x.gpu_type) == key)
                within = used.get(key, 0) + head.units <= ledger.nominal(*key)
                return (0 if within else 1, share(key), key)

            chosen = min(fitting, key=rank)  # min keeps the first in line among equal ranks
            waiting.remove(chosen)
            key = (chosen.workspace, chosen.gpu_type)
            for scope in counts(*key)[1]:
                room[scope] -= chosen.units
            used[key] = used.get(key, 0) + chosen.units
            placed = fits.place(order.index(chosen)) if chosen.gpu_type in nodes else []
            start = moment if moment > now else soonest.get(chosen.gpu_type, math.inf)
            if start < math.inf:
                out[chosen.key] = start
                ends.append((start + estimates._runtime(chosen), key, chosen.units, estimates._runtime(chosen), False))
                giving.extend((start + estimates._runtime(chosen), *item) for item in placed)
        later = [e[0] for e in ends if e[0] > moment] + [w.eligible_at for w in waiting if w.eligible_at > moment]
        if not later or min(later) == math.inf:
            return out
        moment = min(later)
        by_key: dict[tuple[str, str], list[tuple[int, float, bool]]] = {}
        for _end, key, units, length, again in [e for e in ends if e[0] == moment]:
            by_key.setdefault(key, []).append((units, length, again))
        for key, runs in by_key.items():
            units = sum(u for u, _, again in runs if not again)
            back = sum(u for u, _, _ in runs)
            used[key] -= back
            if units and not any((w.workspace, w.gpu_type) == key for w in waiting) and used[key] < kept.get(key, 0):
                held = min(units, kept[key] - used[key])  # for its next work, not yet submitted
                used[key] += held
                back -= held
                ends.append((moment + max(length for _, length, again in runs if not again), key, held, 0.0, True))
            for scope in counts(*key)[1]:
                room[scope] += back
        fits.moment = moment
        for _end, pool, name, count in [g for g in giving if g[0] == moment]:
            pool.give(name, count)


def random_engine(seed: int, policy: str, starvation_s: float = Policy.starvation_s) -> Engine:
    """Up to 5 workspaces with quotas, cohorts and limits; whole GPUs running on 4 nodes x 8 (a
    workspace may run beyond its quota: quotas change); up to 60 more waiting."""
    rng = random.Random(seed)
    infos = tuple(
        ws(
            f"w{i}",
            rng.choice(["2", "4", "8", "16", "24"]),
            cohort=rng.choice([None, "k1", "k2", "k2"]),
            can_borrow=rng.random() < 0.7,
            borrowing_limit=rng.choice([None, None, "4"]),
            lending_limit=rng.choice([None, None, "2"]),
        )
        for i in range(rng.randint(1, 5))
    )
    nodes = tuple(NodeInfo(f"n{n}", "c", "h100", tuple(Device(i, D(1)) for i in range(8))) for n in range(4))
    engine = Engine(infos, nodes, Policy(name=policy, starvation_s=starvation_s))  # type: ignore[arg-type]
    slots = [(node.name, index) for node in nodes for index in range(8)]
    rng.shuffle(slots)
    for seq in range(rng.randint(0, 28)):
        gpus = min(len(slots), rng.choice([1, 1, 2, 4, 8]))
        if not gpus:
            break
        taken, slots = slots[:gpus], slots[gpus:]
        placement = tuple(
            ReplicaPlacement(node, tuple((index, D(1)) for n, index in taken if n == node))
            for node in sorted({n for n, _ in taken})
        )
        engine.add_running(Workload(
            f"run:{seq}", rng.choice(infos).name, "h100", D(gpus), started_at=NOW - rng.choice([10.0, 900.0, 5000.0]),
            expected_runtime_s=rng.choice(RUNTIMES), max_runtime_s=rng.choice([None, None, 1800.0]), cluster="c",
            placement=placement,
        ))  # fmt: skip
    for seq in range(rng.randint(1, 60)):
        engine.submit(Workload(
            f"job:{seq}", rng.choice(infos).name, "h100", rng.choice([D("0.5"), D(1), D(1), D(2), D(4), D(8)]),
            rng.choice([1, 1, 2]), priority=int(rng.random() < 0.1), seq=seq, submitted_at=NOW - 5000.0,
            expected_runtime_s=rng.choice(RUNTIMES), max_runtime_s=rng.choice([None, None, 1800.0]),
            eligible_at=rng.choice([0.0, 0.0, 0.0, NOW + 120.0]),
        ))  # fmt: skip
    engine.clock = NOW
    return engine


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(0, 2**32), st.sampled_from(["portal", "portal", "fifo", "shared"]))
def test_estimates_are_those_of_the_plain_model(seed: int, policy: str) -> None:
    engine = random_engine(seed, policy, starvation_s=math.inf)
    order = engine._line()

    assert StartEstimates(engine).estimate(NOW, order) == plain_estimates(StartEstimates(engine), NOW, order)


def test_a_workspace_that_cannot_borrow_waits_for_its_own_quota() -> None:
    """Its quota count is kept: the cohort and the GPUs have room before its own quota does."""
    infos = (ws("a", "4", cohort="k"), ws("b", "12", cohort="k", can_borrow=True))
    nodes = (NodeInfo("n0", "c", "h100", tuple(Device(i, D(1)) for i in range(16))),)
    engine = Engine(infos, nodes, Policy())
    for key, name, devices, runtime in (("run:a", "a", range(4), 100.0), ("run:b", "b", range(4, 12), 30.0)):
        placement = (ReplicaPlacement("n0", tuple((i, D(1)) for i in devices)),)
        engine.add_running(Workload(key, name, "h100", D(len(devices)), started_at=NOW - 10,
                                    expected_runtime_s=runtime, cluster="c", placement=placement))  # fmt: skip
    engine.submit(Workload("job:1", "a", "h100", D(2), seq=1, expected_runtime_s=100.0))
    engine.clock = NOW

    assert StartEstimates(engine).estimate(NOW, engine._line()) == {"job:1": NOW + 90}


@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(st.integers(0, 2**32), st.sampled_from(["portal", "portal", "fifo", "shared"]))
def test_the_engine_estimates_what_an_explained_cycle_says(seed: int, policy: str) -> None:
    """`Engine.estimates` after a cycle without explanations gives the estimates an explained cycle
    gives, for all the line or down to the last workload asked about."""
    explained, quick = random_engine(seed, policy), random_engine(seed, policy)
    pending = list(explained.cycle(NOW, explain=True).pending)
    quick.cycle(NOW, explain=False)
    said = {p.key: p.estimated_start for p in pending if p.estimated_start is not None}

    assert quick.estimates(NOW) == said
    asked = [p.key for p in pending[::3]]
    down_to = {p.key for p in pending[: max((i for i, p in enumerate(pending) if p.key in asked), default=-1) + 1]}
    assert quick.estimates(NOW, asked) == {key: start for key, start in said.items() if key in down_to}


@pytest.mark.parametrize("seed", [1595056285, 2842878215, 2949135314, 1815741284])
def test_the_unexplained_pass_makes_the_explained_passs_decisions(seed: int) -> None:
    """Seeds where the unexplained (quick) pass, refusing a workload at once for the quota an earlier
    one was refused, went on to evict victims for it although a starving gang of its workspace was
    owed that quota: the eviction then made no room (engine.py, `_preempt_for`). It is held, as the
    explained pass says, and both passes decide the same."""
    explained = random_engine(seed, "portal").cycle(NOW, explain=True)
    quick = random_engine(seed, "portal").cycle(NOW, explain=False)

    assert [(a.key, a.placement) for a in quick.admitted] == [(a.key, a.placement) for a in explained.admitted]
    assert [p.key for p in quick.preempted] == [p.key for p in explained.preempted]


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(st.integers(0, 2**32), st.sampled_from(["portal", "portal", "fifo", "shared"]))
def test_both_passes_decide_the_same(seed: int, policy: str) -> None:
    explained = random_engine(seed, policy).cycle(NOW, explain=True)
    quick = random_engine(seed, policy).cycle(NOW, explain=False)

    assert [(a.key, a.placement) for a in quick.admitted] == [(a.key, a.placement) for a in explained.admitted]
    assert [p.key for p in quick.preempted] == [p.key for p in explained.preempted]
