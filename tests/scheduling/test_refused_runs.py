"""Runs of refused work are refused without examining each workload where their refusal changes
nothing: behind a starving gang that its workspace's quota is held for, among starving gangs once
their quota and nodes are held, below a queue's higher-priority work, and while other workspaces'
work ranks between them. The same decisions and reasons as the plain pass, examined one by one."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from apps.scheduling.engine import Engine
from apps.scheduling.types import Device, NodeInfo, Policy, Quota, ReplicaPlacement, Workload, WorkspaceInfo
from tests.scheduling.test_fast_paths import SHAPES, _cluster
from tests.scheduling.test_pass_cost import _count_admission_tries

D = Decimal


def _held_behind_a_gang(shortcuts: bool) -> Engine:
    """Workspace a uses all of its 8 GPUs; its first waiting workload is a gang of 8 GPUs that has
    starved, then 200 single GPUs: quota refuses the gang, and is held for it."""
    teams = (
        WorkspaceInfo("a", (Quota("h100", D(8)),), cohort="lab", can_borrow=True),
        WorkspaceInfo("b", (Quota("h100", D(8)),), cohort="lab", can_borrow=True),
    )
    nodes = tuple(NodeInfo(f"n{n}", "c", "h100", tuple(Device(i, D(1)) for i in range(8))) for n in range(2))
    engine = Engine(teams, nodes, Policy(starvation_s=600.0))
    engine.shortcuts = engine.ledger.remember = shortcuts
    for n in range(8):
        engine.submit(Workload(f"job:run-{n}", "a", "h100", D(1), seq=n))
    engine.submit(Workload("job:b-run", "b", "h100", D(8), seq=8))
    assert len(engine.cycle(0.0, explain=False).admitted) == 9
    engine.submit(Workload("job:gang", "a", "h100", D(4), replicas=2, seq=10))
    for n in range(200):
        engine.submit(Workload(f"job:one-{n:03}", "a", "h100", D(1), seq=100 + n, submitted_at=60.0))
    return engine


def test_work_behind_a_gang_its_quota_is_held_for_is_refused_at_once() -> None:
    engine = _held_behind_a_gang(shortcuts=True)
    tried = _count_admission_tries(engine)

    decisions = engine.cycle(3600.0, explain=False)

    assert decisions.admitted == []
    assert tried == ["job:gang"]  # the rest of its queue waits behind it, refused at once

    tried.clear()
    explained = engine.cycle(3660.0, explain=True)
    plain = _held_behind_a_gang(shortcuts=False)
    plain.cycle(3600.0, explain=False)
    expected = plain.cycle(3660.0, explain=True)

    assert tried == ["job:gang", "job:one-000"]  # with reasons: the first of the shape is asked
    assert list(explained.pending) == list(expected.pending)
    said = {p.key: p.reason for p in explained.pending}
    assert said["job:one-000"] == said["job:one-199"]
    assert said["job:one-199"].startswith("waiting behind gang job:gang")


def _gang_behind_one_of_its_shape(shortcuts: bool) -> Engine:
    """Two nodes with 7 of 8 GPUs free. Workspace a (4 GPUs of quota, borrowing the rest) waits with
    two gangs of 2 x 8 GPUs, the first submitted now, the second long ago: it starves. Workspace b,
    ranked after a, waits with one GPU."""
    teams = (
        WorkspaceInfo("a", (Quota("h100", D(4)),), cohort="lab", can_borrow=True),
        WorkspaceInfo("b", (Quota("h100", D(0)),), cohort="lab", can_borrow=True),
        WorkspaceInfo("r", (Quota("h100", D(32)),), cohort="lab"),
    )
    devices = (Device(0, D(0)), *(Device(i, D(1)) for i in range(1, 8)))  # device 0 runs r's work
    nodes = tuple(NodeInfo(f"n{n}", "c", "h100", devices) for n in range(2))
    engine = Engine(teams, nodes, Policy(starvation_s=600.0))
    engine.shortcuts = engine.ledger.remember = shortcuts
    placement = tuple(ReplicaPlacement(f"n{n}", ((0, D(1)),)) for n in range(2))
    engine.add_running(Workload("job:r", "r", "h100", D(1), 2, started_at=0.0, cluster="c", placement=placement))
    engine.submit(Workload("job:gang-new", "a", "h100", D(8), replicas=2, seq=10, submitted_at=3600.0))
    engine.submit(Workload("job:gang-old", "a", "h100", D(8), replicas=2, seq=11, submitted_at=0.0))
    engine.submit(Workload("job:b", "b", "h100", D(1), seq=12, submitted_at=3600.0))
    return engine


@pytest.mark.parametrize("explain", [False, True])
def test_a_starving_gang_behind_a_refused_one_of_its_shape_still_has_nodes_held(explain: bool) -> None:
    """The first gang finds no room; the second, of its shape, would find none either, but its
    refusal holds both nodes for it, which keeps b's single GPU off them."""
    engine = _gang_behind_one_of_its_shape(shortcuts=True)
    assert [(n.name, n.whole) for n in engine.pools["c", "h100"].nodes.values()] == [("n0", 7), ("n1", 7)]

    decisions = engine.cycle(3600.0, explain=explain)
    expected = _gang_behind_one_of_its_shape(shortcuts=False).cycle(3600.0, explain=explain)

    assert decisions.admitted == expected.admitted == []
    assert list(decisions.pending) == list(expected.pending)
    if explain:
        said = {p.key: p.reason for p in decisions.pending}
        assert said["job:gang-old"].endswith("holding 2 node(s) for it while work there finishes")


def _stream(rng: random.Random, count: int, start: int, now: float, declared: bool) -> list[Workload]:
    out = []
    for seq in range(start, start + count):
        gpus, replicas = rng.choice(SHAPES)
        limit = rng.choice((None, None, 600.0, 7200.0)) if declared else None
        priority = 1 if rng.random() < 0.1 else 0
        workspace = f"w{rng.randrange(8)}"
        out.append(
            Workload(f"job:{seq}", workspace, "h100", D(gpus), replicas, priority, seq, now, max_runtime_s=limit)
        )
    return out


def _run(
    seed: int, explain: bool, shortcuts: bool, max_scan: int, declared: bool
) -> tuple[list[tuple[list[str], list[str], bool]], list[list[tuple[object, ...]]]]:
    """Twenty cycles a minute apart on a crowded cluster where gangs starve after two minutes: what
    each admits and evicts, whether it cut its searches short, and, explained, what it says."""
    workspaces, nodes = _cluster()
    policy = Policy(min_runtime_s=120.0, starvation_s=120.0, max_scan=max_scan, max_preemption_tries=4)
    engine = Engine(workspaces, nodes, policy)
    engine.shortcuts = engine.ledger.remember = shortcuts
    rng = random.Random(seed)
    for workload in _stream(rng, 600, 0, 0.0, declared):
        engine.submit(workload)
    seq, history, explained = 600, [], []
    for step in range(20):
        now = step * 60.0
        for key in sorted(engine.running)[:10]:
            engine.finish(key, now)
        decisions = engine.cycle(now, explain=explain)
        history.append(([a.key for a in decisions.admitted], [p.key for p in decisions.preempted], engine.cut_short))
        explained.append([tuple(p) for p in decisions.pending])
        evicted = [p.key for p in decisions.preempted]
        for workload in _stream(rng, 40, seq, now, declared):
            engine.submit(workload)
        for key in evicted:  # back in line
            engine.submit(Workload(key, "w0", "h100", D(1), seq=int(key.split(":")[1]), submitted_at=now))
        seq += 40
    return history, explained


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("max_scan", [60, 100_000])
@pytest.mark.parametrize("declared", [False, True])
def test_cycles_with_starving_gangs_decide_and_explain_as_the_plain_pass(
    seed: int, max_scan: int, declared: bool
) -> None:
    plain, plain_explained = _run(seed, explain=True, shortcuts=False, max_scan=max_scan, declared=declared)
    quick, _ = _run(seed, explain=False, shortcuts=True, max_scan=max_scan, declared=declared)
    fast, fast_explained = _run(seed, explain=True, shortcuts=True, max_scan=max_scan, declared=declared)

    assert quick == plain
    assert fast == plain
    assert fast_explained == plain_explained
    assert sum(len(admitted) for admitted, _, _ in plain) > 100
    assert any(preempted for _, preempted, _ in plain)
