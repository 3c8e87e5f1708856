"""The pass's shortcuts decide exactly as the plain pass: a cycle without explanations (which refuses a
workspace's hopeless queue at once, and remembers shapes that found no placement) admits and
evicts the same workloads as an explained cycle, which examines every workload, cycle after cycle
on a crowded cluster."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from apps.scheduling.engine import Engine
from apps.scheduling.placement import Pool, PoolNode
from apps.scheduling.types import UNIT, Device, NodeInfo, Policy, Quota, Workload, WorkspaceInfo

SHAPES = (("0.25", 1), ("0.5", 1), ("1", 1), ("1", 1), ("1", 1), ("2", 1), ("4", 1), ("8", 1), ("8", 2))


def _cluster() -> tuple[tuple[WorkspaceInfo, ...], tuple[NodeInfo, ...]]:
    devices = tuple(Device(i, Decimal(1)) for i in range(8))
    nodes = tuple(NodeInfo(f"n{n:02d}", "c", "h100", devices) for n in range(12))
    workspaces = tuple(
        WorkspaceInfo(f"w{w}", (Quota("h100", Decimal(4 + 8 * (w % 3))),), cohort=f"k{w % 2}", can_borrow=True)
        for w in range(8)
    )
    return workspaces, nodes


def _stream(seed: int, count: int, start: int, now: float) -> list[Workload]:
    rng = random.Random(seed * 100_003 + start)
    out = []
    for seq in range(start, start + count):
        gpus, replicas = rng.choice(SHAPES)
        out.append(
            Workload(
                f"job:{seq}",
                f"w{rng.randrange(8)}",
                "h100",
                Decimal(gpus),
                replicas,
                priority=1 if rng.random() < 0.1 else 0,
                seq=seq,
                submitted_at=now,
            )  # fmt: skip
        )
    return out


def _run(seed: int, explain: bool, calls: list[bool]) -> list[tuple[list[str], list[str]]]:
    workspaces, nodes = _cluster()
    engine = Engine(workspaces, nodes, Policy(min_runtime_s=120.0, starvation_s=10_000.0))
    original = engine._nothing_fits

    def spy(*args: object) -> bool:
        answer = original(*args)  # type: ignore[arg-type]
        calls.append(answer)
        return answer

    engine._nothing_fits = spy  # type: ignore[method-assign]
    for workload in _stream(seed, 600, 0, 0.0):
        engine.submit(workload)
    seq, history = 600, []
    for step in range(12):
        now = step * 60.0
        for key in sorted(engine.running)[:10]:
            engine.finish(key, now)
        decisions = engine.cycle(now, explain=explain)
        history.append(([a.key for a in decisions.admitted], [p.key for p in decisions.preempted]))
        for workload in _stream(seed, 40, seq, now):
            engine.submit(workload)
        seq += 40
    return history


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cycles_without_explanations_decide_as_explained_ones(seed: int) -> None:
    quick_calls: list[bool] = []
    quick = _run(seed, explain=False, calls=quick_calls)
    explained = _run(seed, explain=True, calls=[])

    assert quick == explained
    assert any(quick_calls), "the shortcut was never taken: the test checks nothing"
    assert sum(len(admitted) for admitted, _ in quick) > 100


def test_devices_given_back_leave_no_trace_on_where_work_goes() -> None:
    """A preemption search gives devices back and takes them again: the node chosen next is the one
    with the least name among those that fit, whatever the order devices were freed in."""
    devices = tuple(Device(i, Decimal(1)) for i in range(4))
    nodes = [PoolNode(NodeInfo(name, "c", "h100", devices)) for name in ("n2", "n0", "n1")]
    pool = Pool("c", "h100", nodes, spread=False)
    n0 = pool.nodes["n0"]
    whole, half = UNIT, UNIT // 2
    pool.take(n0, [(0, whole), (1, whole), (2, whole), (3, whole)])
    pool.give(n0, [(0, whole), (1, whole), (2, whole), (3, whole)])
    pool.take(n0, [(0, half)])  # a half device on n0, then given back: n0 is whole again
    pool.give(n0, [(0, half)])

    placed = pool.place(4 * whole, 1)

    assert placed is not None and placed[0][0].name == "n0"
    halves = pool.place(half, 2)  # two halves: the same device of the least node with room
    assert halves is not None
    assert [(node.name, devices) for node, devices in halves] == [("n1", [(0, half)]), ("n1", [(0, half)])]
