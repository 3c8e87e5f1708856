"""Preemption searches that count devices instead of placing: each answer is the one placing gives.

Where a workload's devices can be counted (`_Placeable`: one shape of whole devices), `_minimal`,
`_fewest_more` and the check before a search node by node count what victims give back instead of
giving it back to the pools and placing. These compare each of them, on random engines, with the
same search made by placing, and check that nothing is left changed: engines whose nodes' free
devices are what their running work leaves (counted), and those of `test_estimate_counts`, whose
running work holds devices that its nodes count as free (where counting cannot tell).
"""

from __future__ import annotations

import random
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from apps.scheduling.engine import Engine
from apps.scheduling.preemption import Preemption, RunningWork, _Placeable
from apps.scheduling.types import Device, NodeInfo, Policy, ReplicaPlacement, Workload
from tests.scheduling.builders import ws
from tests.scheduling.test_estimate_counts import NOW, random_engine


def counted_engine(seed: int) -> Engine:
    """Up to 5 workspaces of two cohorts; running work of whole devices and halves of one, on 4 nodes
    x 8 whose free devices are what it leaves; up to 30 more waiting, up to 2 x 8 GPUs."""
    rng = random.Random(seed)
    infos = tuple(
        ws(f"w{i}", rng.choice(["2", "4", "8", "16"]), cohort=rng.choice(["k1", "k2"]), can_borrow=rng.random() < 0.8)
        for i in range(rng.randint(2, 5))
    )
    free = {(n, i): 1000 for n in range(4) for i in range(8)}
    running = []
    for seq in range(rng.randint(0, 30)):
        share = rng.choice([500, 1000, 1000])
        count = 1 if share < 1000 else rng.choice([1, 1, 2, 4, 8])
        devices = [d for d in sorted(free) if free[d] >= share]
        rng.shuffle(devices)
        taken = devices[:count]
        if len(taken) < count:
            continue
        for device in taken:
            free[device] -= share
        placement = tuple(
            ReplicaPlacement(f"n{node}", tuple((i, Decimal(share) / 1000) for n, i in taken if n == node))
            for node in sorted({n for n, _ in taken})
        )
        running.append(Workload(
            f"run:{seq}", rng.choice(infos).name, "h100", Decimal(share * count) / 1000, cluster="c",
            started_at=NOW - rng.choice([900.0, 5000.0]), priority=rng.choice([0, 0, 1]), placement=placement,
        ))  # fmt: skip
    nodes = tuple(
        NodeInfo(f"n{n}", "c", "h100", tuple(Device(i, Decimal(free[n, i]) / 1000) for i in range(8))) for n in range(4)
    )
    engine = Engine(infos, nodes, Policy(name="portal", min_runtime_s=600.0))
    for workload in running:
        engine.add_running(workload)
    for seq in range(rng.randint(1, 30)):
        engine.submit(Workload(
            f"job:{seq}", rng.choice(infos).name, "h100", Decimal(rng.choice([1, 1, 2, 4, 8])), rng.choice([1, 1, 2]),
            priority=rng.choice([0, 1, 2]), seq=seq, submitted_at=NOW - 100.0,
        ))  # fmt: skip
    engine.clock = NOW
    return engine


def state(engine: Engine) -> tuple[object, ...]:
    """What a search must leave as it found it: the ledger's use and every pool's devices."""
    pools = [pool for by_type in engine.pools_by_type.values() for pool in by_type]
    return (
        dict(engine.ledger.used),
        [
            (pool.free_units, [(node.name, list(node.free), node.whole) for node in pool.nodes.values()])
            for pool in pools
        ],
    )


def placing(preemption: Preemption) -> Preemption:
    """The same search over the same state, with devices always placed to find out."""
    other = Preemption.__new__(Preemption)
    other.__dict__ = dict(preemption.__dict__)
    other._counted = lambda workload: None  # type: ignore[method-assign]
    return other


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.integers(0, 2**32), st.booleans())
def test_counted_searches_answer_as_placing_does(seed: int, counted: bool) -> None:
    engine = counted_engine(seed) if counted else random_engine(seed, "portal")
    rng = random.Random(seed)
    preemption = engine.preemption
    running: list[RunningWork] = sorted(engine.running.values(), key=lambda r: r.workload.key)
    before = state(engine)
    for workload in sorted(engine.pending.values(), key=lambda w: w.key):
        victims = rng.sample(running, rng.randint(0, len(running)))
        cut = rng.randint(0, len(victims))
        chosen, others = victims[:cut], victims[cut:]

        assert preemption._minimal(workload, victims) == placing(preemption)._minimal(workload, victims)
        if not preemption.fits_without(workload, chosen):
            assert preemption._fewest_more(workload, chosen, others) == placing(preemption)._fewest_more(
                workload, chosen, others
            )
        if not preemption._may_place_without(workload, victims):
            assert preemption.by_node(workload, victims, preemption.budget(workload)) == []
        assert state(engine) == before


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(st.integers(0, 2**32))
def test_taking_again_undoes_giving_back(seed: int) -> None:
    """`_Placeable.take` after `give`: the count is what it was without the victim."""
    engine = counted_engine(seed)
    rng = random.Random(seed)
    running: list[RunningWork] = sorted(engine.running.values(), key=lambda r: r.workload.key)
    pools = engine.pools_by_type["h100"]
    for count in (1, 2, 4, 8):
        victims = rng.sample(running, rng.randint(0, len(running)))
        kept = [r for r in victims if rng.random() < 0.5]
        counted, expected = _Placeable(pools, count), _Placeable(pools, count)
        for victim in victims:
            counted.give(victim)
        for victim in victims:
            if victim in kept:
                expected.give(victim)
        for victim in reversed(victims):
            if victim not in kept:
                counted.take(victim)
        if counted.overfull:
            continue  # a device given back beyond whole: not counted (callers place instead)
        assert counted.places == expected.places
        assert {k: v for k, v in counted.whole.items() if k in expected.whole} == expected.whole
