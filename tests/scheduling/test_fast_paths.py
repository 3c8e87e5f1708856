"""The pass's shortcuts decide exactly as the plain pass: cycles that refuse a workspace's hopeless
queue at once, reuse a refusal's reason and remember shapes that found no placement admit and
evict the same workloads, and explain the rest in the same words with the same estimates, as
cycles that examine every workload one by one, cycle after cycle on a crowded cluster."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import pytest

from apps.scheduling.engine import Engine, _Queue
from apps.scheduling.ledger import Ledger
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


def _stream(seed: int, count: int, start: int, now: float, backoff: bool = False) -> list[Workload]:
    """Workloads of the SHAPES; with `backoff`, about one in five requeued with backoff, eligible one
    to five cycles later."""
    rng = random.Random(seed * 100_003 + start)
    out = []
    for seq in range(start, start + count):
        gpus, replicas = rng.choice(SHAPES)
        eligible_at = now + rng.choice((0.0, 0.0, 0.0, 0.0, 90.0, 300.0)) if backoff else 0.0
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
                eligible_at=eligible_at,
            )  # fmt: skip
        )
    return out


Explained = list[tuple[str, str, int, int, float | None]]


def _run(
    seed: int,
    explain: bool,
    calls: list[bool],
    shortcuts: bool = True,
    backoff: bool = False,
    refused: list[bool] | None = None,
) -> tuple[list[tuple[list[str], list[str]]], list[Explained]]:
    """Twelve cycles on a crowded cluster. `calls` gets whether `_refused_run` found work to refuse at
    once; `refused`, for each run refused at once, whether some of its queue's work was still in its
    backoff. With `backoff`, some of the work submitted before the fourth cycle is requeued with backoff."""
    workspaces, nodes = _cluster()
    engine = Engine(workspaces, nodes, Policy(min_runtime_s=120.0, starvation_s=10_000.0))
    engine.shortcuts = engine.ledger.remember = shortcuts
    original = engine._refused_run
    refuse_all = engine._refuse_all

    def spy(*args: object) -> int:
        answer = original(*args)  # type: ignore[arg-type]
        calls.append(answer > 0)
        return answer

    def spy_refusals(queue: _Queue, start: int, stop: int, now: float, *rest: Any) -> None:
        if refused is not None:
            refused.append(queue.waiting_out_backoff(now))
        refuse_all(queue, start, stop, now, *rest)

    engine._refused_run = spy  # type: ignore[method-assign]
    engine._refuse_all = spy_refusals  # type: ignore[method-assign]
    for workload in _stream(seed, 600, 0, 0.0, backoff):
        engine.submit(workload)
    seq, history, explained = 600, [], []
    for step in range(12):
        now = step * 60.0
        for key in sorted(engine.running)[:10]:
            engine.finish(key, now)
        decisions = engine.cycle(now, explain=explain)
        history.append(([a.key for a in decisions.admitted], [p.key for p in decisions.preempted]))
        explained.append([tuple(p) for p in decisions.pending])
        for workload in _stream(seed, 40, seq, now, backoff and step < 3):
            engine.submit(workload)
        seq += 40
    return history, explained


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cycles_without_explanations_decide_as_explained_ones(seed: int) -> None:
    quick_calls: list[bool] = []
    quick, _ = _run(seed, explain=False, calls=quick_calls)
    plain, _ = _run(seed, explain=True, calls=[], shortcuts=False)

    assert quick == plain
    assert any(quick_calls), "the shortcut was never taken: the test checks nothing"
    assert sum(len(admitted) for admitted, _ in quick) > 100


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_explained_cycles_with_shortcuts_say_what_the_plain_pass_says(seed: int) -> None:
    calls: list[bool] = []
    fast, fast_explained = _run(seed, explain=True, calls=calls)
    plain, plain_explained = _run(seed, explain=True, calls=[], shortcuts=False)

    assert fast == plain
    assert fast_explained == plain_explained
    assert any(calls), "the shortcut was never taken: the test checks nothing"
    assert sum(len(cycle) for cycle in fast_explained) > 1000


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_queues_refused_at_once_with_work_in_backoff_say_what_the_plain_pass_says(seed: int) -> None:
    """A queue refused at once gives work still in its backoff that reason, the rest their refusal's,
    and a queue whose backoffs have all passed (or left it) takes the quicker way, with the same result."""
    refused: list[bool] = []
    fast, fast_explained = _run(seed, explain=True, calls=[], backoff=True, refused=refused)
    plain, plain_explained = _run(seed, explain=True, calls=[], shortcuts=False, backoff=True)

    assert fast == plain
    assert fast_explained == plain_explained
    assert True in refused and False in refused, "both ways of refusing at once must be taken"
    assert any(reason.startswith("requeued with backoff") for cycle in fast_explained for _, reason, *_ in cycle)


def test_a_queue_knows_when_its_last_backoff_ends_as_work_comes_and_goes() -> None:
    workspaces, nodes = _cluster()
    engine = Engine(workspaces, nodes, Policy())
    late, early = (
        Workload(f"job:{n}", "w0", "h100", Decimal(1), seq=n, eligible_at=at) for n, at in ((1, 300.0), (2, 90.0))
    )
    engine.submit(late)
    engine.submit(early)
    queue = engine.queues["w0"]
    assert queue.waiting_out_backoff(100.0) and queue.waiting_out_backoff(200.0)

    engine.withdraw(late.key)
    assert queue.waiting_out_backoff(60.0) and not queue.waiting_out_backoff(100.0)

    engine.cycle(100.0)  # admitted: its queue is empty
    assert not queue.items and not queue.waiting_out_backoff(0.0)


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


def test_the_ledger_answers_anew_once_quota_is_owed_or_repaid() -> None:
    """check's remembered answers hold only while nothing changes: quota owed to an owner is not lent
    again, and once repaid it may be lent again."""
    owner = WorkspaceInfo("owner", (Quota("h100", Decimal(8)),), cohort="k", can_borrow=True)
    borrower = WorkspaceInfo("borrower", (Quota("h100", Decimal(0)),), cohort="k", can_borrow=True)
    ledger = Ledger({"owner": owner, "borrower": borrower}, borrowing=True)
    for name in ("owner", "borrower"):
        ledger.register(name, "h100")
    asks = Workload("job:b", "borrower", "h100", Decimal(4))
    assert ledger.check(asks, asks.units)[0]

    ledger.owe("owner", "h100", 6 * UNIT)
    assert not ledger.check(asks, asks.units)[0]

    ledger.repaid("owner", "h100", 6 * UNIT)
    assert ledger.check(asks, asks.units)[0]

    ledger.owe("owner", "h100", 6 * UNIT)
    assert not ledger.check(asks, asks.units)[0]
    ledger.forget_owed()  # a new pass
    assert ledger.check(asks, asks.units)[0]


@pytest.mark.parametrize("seed", range(5))
def test_the_nodes_held_for_work_are_the_freest_whatever_the_buckets_say(seed: int) -> None:
    """`Pool.to_hold` orders only the buckets it takes from: the same nodes as ordering every node by
    whole free devices, then the largest free share of a partly used device, then name."""
    rng = random.Random(seed)
    nodes = [
        PoolNode(NodeInfo(f"n{n:02d}", "c", "h100", tuple(Device(i, Decimal(1)) for i in range(rng.choice((4, 8))))))
        for n in range(30)
    ]
    pool = Pool("c", "h100", nodes, spread=False)
    for node in nodes:
        for position in range(node.capacity):
            taken = rng.choice((0, 0, UNIT, UNIT, 250, 500, 750))
            if taken:
                pool.take(node, [(position, taken)])

    def freest(node: PoolNode) -> tuple[int, int, str]:
        return (-node.whole, -max((f for f in node.free if f < UNIT), default=0), node.name)

    for count, replicas in ((1, 1), (1, 5), (4, 3), (8, 2), (8, 40), (2, 30)):
        expected = [n for n in sorted(nodes, key=freest) if n.capacity >= count][:replicas]
        assert [n.name for n in pool.to_hold(count, replicas)] == [n.name for n in expected]
