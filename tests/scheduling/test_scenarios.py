"""The scheduling engine's behaviours, one scenario each: reclaim, preemption, starvation, fair share,
placement per cluster, fifo against backfill, estimates and the wording of every reason."""

from __future__ import annotations

import heapq
from collections import Counter
from decimal import Decimal

from apps.scheduling.engine import (
    Decisions,
    Device,
    Engine,
    NodeInfo,
    Policy,
    Quota,
    ReplicaPlacement,
    Snapshot,
    Workload,
    WorkspaceInfo,
    schedule,
)
from tests.scheduling.builders import admitted, reasons, ws

D = Decimal
NOW = 10_000.0  # the scenarios' clock: work started at 0 is long past min_runtime_s and may be preempted


def node(name: str, devices: int = 8, *, used: tuple[int, ...] = (), cluster: str = "local") -> NodeInfo:
    """A node whose devices in `used` are fully taken (by the running workloads placed there)."""
    return NodeInfo(name, cluster, "h100", tuple(Device(i, D(0) if i in used else D(1)) for i in range(devices)))


def job(key: str, workspace: str, gpus: str, replicas: int = 1, **fields: object) -> Workload:
    """A pending workload, submitted just now unless said otherwise (so not yet starving)."""
    fields.setdefault("submitted_at", NOW)
    return Workload(key, workspace, "h100", D(gpus), replicas, **fields)


def running(
    key: str, workspace: str, node_name: str, devices: tuple[int, ...], *, started_at: float = 0.0, **fields: object
) -> Workload:
    """A one-replica workload holding whole devices of one node since `started_at`."""
    placement = (ReplicaPlacement(node_name, tuple((i, D(1)) for i in devices)),)
    return Workload(
        key,
        workspace,
        "h100",
        D(len(devices)),
        started_at=started_at,
        cluster="local",
        placement=placement,
        **fields,
    )


def snapshot(workspaces, nodes, running=(), pending=(), *, now: float = NOW, policy: Policy | None = None) -> Snapshot:
    return Snapshot(tuple(workspaces), tuple(nodes), tuple(running), tuple(pending), now, policy or Policy())


def preempted(decisions: Decisions) -> list[str]:
    return [p.key for p in decisions.preempted]


LAB = (ws("team-a", "8", cohort="lab"), ws("team-b", "0", cohort="lab", can_borrow=True))


# --- reclaiming borrowed GPUs -----------------------------------------------------------------


def test_it_reclaims_a_lenders_gpus_from_the_cheapest_borrower_in_the_same_cycle() -> None:
    decisions = schedule(
        snapshot(
            LAB,
            [node("n1", used=tuple(range(8)))],
            running=[
                running("job:old", "team-b", "n1", (0, 1, 2, 3), started_at=0.0),
                running("job:new", "team-b", "n1", (4, 5, 6, 7), started_at=5_000.0),
            ],
            pending=[job("job:a", "team-a", "4")],
        )
    )
    [preempt] = decisions.preempted
    assert (preempt.key, preempt.for_key) == ("job:new", "job:a")  # least work lost
    assert "team-a" in preempt.reason and "team-b" in preempt.reason
    assert preempt.reason == (
        "preempted to give workspace team-a back its quota: workspace team-b was borrowing h100 GPUs"
    )
    assert [(a.key, a.borrowed) for a in decisions.admitted] == [("job:a", D("0"))]
    assert decisions.admitted[0].placement == (ReplicaPlacement("n1", tuple((i, D(1)) for i in (4, 5, 6, 7))),)
    assert decisions.pending == []


def test_it_reclaims_from_lower_priority_borrowed_work_first() -> None:
    decisions = schedule(
        snapshot(
            LAB,
            [node("n1", used=tuple(range(8)))],
            running=[
                running("job:low", "team-b", "n1", (0, 1, 2, 3), started_at=0.0, priority=0),
                running("job:high", "team-b", "n1", (4, 5, 6, 7), started_at=5_000.0, priority=5),
            ],
            pending=[job("job:a", "team-a", "4")],
        )
    )
    assert preempted(decisions) == ["job:low"]
    assert admitted(decisions) == ["job:a"]


def test_it_reclaims_only_for_work_within_the_lenders_nominal_quota() -> None:
    def decide(gpus: str) -> Decisions:
        return schedule(
            snapshot(
                (
                    ws("team-a", "2", cohort="lab", can_borrow=True),
                    ws("team-b", "0", cohort="lab", can_borrow=True),
                    ws("team-c", "4", cohort="lab"),
                ),
                [node("n1", 4, used=(0, 1, 2, 3))],
                running=[running("job:b", "team-b", "n1", (0, 1, 2, 3))],
                pending=[job("job:a", "team-a", gpus)],
            )
        )

    assert preempted(decide("2")) == ["job:b"]
    decisions = decide("3")  # would have to borrow as well: no preemption for that
    assert decisions.preempted == [] and decisions.admitted == []
    assert reasons(decisions)["job:a"].endswith("; cohort lab has 0 idle to lend")


def test_it_does_not_preempt_a_workload_that_only_uses_its_own_quota() -> None:
    decisions = schedule(
        snapshot(
            (ws("team-a", "4", cohort="lab"), ws("team-b", "4", cohort="lab", can_borrow=True)),
            [node("n1", 4, used=(0, 1, 2, 3))],
            running=[running("job:b", "team-b", "n1", (0, 1, 2, 3))],
            pending=[job("job:a", "team-a", "2")],
        )
    )
    assert decisions.preempted == []
    assert reasons(decisions) == {"job:a": "waiting for a node with 2 free h100"}


# --- preemption within a workspace ------------------------------------------------------------


def test_it_preempts_lower_priority_work_of_the_same_workspace() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "4")],
            [node("n1", 4, used=(0, 1, 2, 3))],
            running=[running("job:low", "team-a", "n1", (0, 1, 2, 3), priority=0)],
            pending=[job("job:high", "team-a", "4", priority=10)],
        )
    )
    assert [(p.key, p.for_key, p.reason) for p in decisions.preempted] == [
        ("job:low", "job:high", "preempted for higher-priority job:high (priority 10 > 0)")
    ]
    assert admitted(decisions) == ["job:high"]


def test_it_does_not_preempt_work_of_equal_priority() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "4")],
            [node("n1", 4, used=(0, 1, 2, 3))],
            running=[running("job:1", "team-a", "n1", (0, 1, 2, 3), priority=5)],
            pending=[job("job:2", "team-a", "4", priority=5)],
        )
    )
    assert decisions.preempted == []
    assert reasons(decisions) == {"job:2": "waiting for quota: 4 of 4 h100 in use in workspace team-a, this needs 4"}


def test_it_does_not_preempt_other_workspaces_for_priority() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "4"), ws("team-b", "4")],
            [node("n1", 4, used=(0, 1, 2, 3))],
            running=[running("job:b", "team-b", "n1", (0, 1, 2, 3), priority=0)],
            pending=[job("job:a", "team-a", "4", priority=100)],
        )
    )
    assert decisions.preempted == []
    assert admitted(decisions) == []


# --- what may not be preempted ----------------------------------------------------------------


def test_it_never_preempts_work_younger_than_the_minimum_runtime() -> None:
    young = running("job:low", "team-a", "n1", (0, 1, 2, 3), started_at=NOW - 599)
    snap = snapshot(
        [ws("team-a", "4")], [node("n1", 4, used=(0, 1, 2, 3))], [young], [job("job:high", "team-a", "4", priority=10)]
    )
    decisions = schedule(snap)
    assert decisions.preempted == []
    assert admitted(decisions) == []
    old_enough = running("job:low", "team-a", "n1", (0, 1, 2, 3), started_at=NOW - 600)
    decisions = schedule(snapshot(snap.workspaces, snap.nodes, [old_enough], snap.pending))
    assert preempted(decisions) == ["job:low"]


def test_it_never_preempts_non_preemptible_work() -> None:
    decisions = schedule(
        snapshot(
            LAB,
            [node("n1", 4, used=(0, 1, 2, 3))],
            running=[running("job:b", "team-b", "n1", (0, 1, 2, 3), preemptible=False)],
            pending=[job("job:a", "team-a", "4")],
        )
    )
    assert decisions.preempted == []
    assert reasons(decisions) == {
        "job:a": "waiting for a node with 4 free h100; holding 1 node(s) for it while work there finishes"
    }


def test_it_picks_a_preemptible_victim_over_a_protected_one() -> None:
    def decide(started_at: float) -> Decisions:
        return schedule(
            snapshot(
                LAB,
                [node("n1", 4, used=(0, 1, 2, 3)), node("n2", 4, used=(0, 1, 2, 3))],
                running=[
                    running("job:keep", "team-b", "n1", (0, 1, 2, 3), preemptible=False, started_at=9_000.0),
                    running("job:other", "team-b", "n2", (0, 1, 2, 3), started_at=started_at),
                ],
                pending=[job("job:a", "team-a", "4")],
            )
        )

    young = decide(NOW - 10)
    assert young.preempted == [] and young.admitted == []
    old = decide(0.0)
    assert preempted(old) == ["job:other"]
    assert old.admitted[0].placement[0].node == "n2"


def test_it_keeps_the_minimum_runtime_of_work_it_admitted_itself() -> None:
    engine = Engine((ws("team-a", "1"),), (node("n1", 1),))
    engine.submit(job("job:low", "team-a", "1", seq=1, submitted_at=0.0))
    assert admitted(engine.cycle(0.0)) == ["job:low"]
    engine.submit(job("job:high", "team-a", "1", priority=5, seq=2, submitted_at=10.0))
    decisions = engine.cycle(10.0)
    assert decisions.preempted == [] and admitted(decisions) == []
    decisions = engine.cycle(600.0)
    assert [(p.key, p.for_key) for p in decisions.preempted] == [("job:low", "job:high")]
    assert admitted(decisions) == ["job:high"]


# --- fewest victims ---------------------------------------------------------------------------


def test_it_evicts_one_big_victim_rather_than_many_small_ones() -> None:
    small = [running(f"job:s{i}", "team-b", "n1", (3 + i,), started_at=1_000.0 * i) for i in range(1, 5)]
    decisions = schedule(
        snapshot(
            LAB,
            [node("n1", used=tuple(range(8)))],
            running=[running("job:big", "team-b", "n1", (0, 1, 2, 3), started_at=0.0), *small],
            pending=[job("job:a", "team-a", "4")],
        )
    )
    assert preempted(decisions) == ["job:big"]
    assert admitted(decisions) == ["job:a"]


def test_it_does_not_evict_higher_priority_work_only_to_evict_fewer() -> None:
    small = [running(f"job:s{i}", "team-b", "n1", (3 + i,), started_at=1_000.0 * i) for i in range(1, 5)]
    decisions = schedule(
        snapshot(
            LAB,
            [node("n1", used=tuple(range(8)))],
            running=[running("job:big", "team-b", "n1", (0, 1, 2, 3), started_at=0.0, priority=5), *small],
            pending=[job("job:a", "team-a", "4")],
        )
    )
    assert sorted(preempted(decisions)) == ["job:s1", "job:s2", "job:s3", "job:s4"]


def test_it_drops_victims_the_others_already_make_room_without() -> None:
    # The cheapest victim (on n1, next to work that may not be preempted) frees nothing useful:
    # the two on n2 make room for the gang's replica by themselves.
    decisions = schedule(
        snapshot(
            LAB,
            [node("n1", 4, used=(0, 1, 2, 3)), node("n2", 4, used=(0, 1))],
            running=[
                running("job:keep", "team-b", "n1", (1, 2, 3), preemptible=False),
                running("job:n1", "team-b", "n1", (0,), started_at=3_000.0),
                running("job:n2a", "team-b", "n2", (0,), started_at=2_000.0),
                running("job:n2b", "team-b", "n2", (1,), started_at=1_000.0),
            ],
            pending=[job("job:a", "team-a", "4")],
        )
    )
    assert sorted(preempted(decisions)) == ["job:n2a", "job:n2b"]
    assert decisions.admitted[0].placement[0].node == "n2"


def test_it_preempts_nothing_when_even_every_victim_would_not_make_room() -> None:
    decisions = schedule(
        snapshot(
            LAB,
            [node("n1", 4, used=(0, 1, 2, 3)), node("n2", 4, used=(0, 1, 2, 3))],
            running=[
                running("job:b1", "team-b", "n1", (0, 1)),
                running("job:keep1", "team-b", "n1", (2, 3), preemptible=False),
                running("job:b2", "team-b", "n2", (0, 1)),
                running("job:keep2", "team-b", "n2", (2, 3), preemptible=False),
            ],
            pending=[job("job:a", "team-a", "4")],
        )
    )
    assert decisions.preempted == []
    assert reasons(decisions) == {
        "job:a": "waiting for quota: 4 of workspace team-a's 8 h100 are lent to others in cohort lab; "
        "holding 1 node(s) for it while work there finishes"
    }


def test_it_keeps_a_cohort_within_its_quotas_when_another_cohort_has_idle_gpus() -> None:
    # team-b borrows team-a's 4 GPUs; cohort "other" leaves 8 GPUs idle. team-a's own request
    # must reclaim its loan, not spill onto the other cohort's capacity.
    workspaces = (
        ws("team-a", "4", cohort="lab"),
        ws("team-b", "4", cohort="lab", can_borrow=True),
        ws("team-x", "8", cohort="other"),
    )
    nodes = [node("n1", used=tuple(range(8))), node("n2")]
    borrower = [running("job:b", "team-b", "n1", tuple(range(8)), started_at=0.0)]
    decisions = schedule(snapshot(workspaces, nodes, borrower, [job("job:a", "team-a", "4")]))
    assert [p.key for p in decisions.preempted] == ["job:b"]
    assert admitted(decisions) == ["job:a"]

    keep = [running("job:b", "team-b", "n1", tuple(range(8)), preemptible=False)]
    decisions = schedule(snapshot(workspaces, nodes, keep, [job("job:a", "team-a", "4")]))
    assert admitted(decisions) == [] and decisions.preempted == []
    assert reasons(decisions) == {
        "job:a": "waiting for quota: 4 of workspace team-a's 4 h100 are lent to others in cohort lab; "
        "holding 1 free node(s) for it"
    }


# --- checkpoints ------------------------------------------------------------------------------


def test_it_gives_a_checkpointable_victim_time_to_save() -> None:
    decisions = schedule(
        snapshot(
            LAB,
            [node("n1", 4, used=(0, 1, 2, 3))],
            running=[
                running("job:ckpt", "team-b", "n1", (0, 1), checkpointable=True, started_at=1.0),
                running("job:plain", "team-b", "n1", (2, 3), started_at=2.0),
            ],
            pending=[job("job:a", "team-a", "4")],
            policy=Policy(grace_s=90.0),
        )
    )
    assert sorted((p.key, p.grace_s) for p in decisions.preempted) == [("job:ckpt", 90.0), ("job:plain", 0.0)]


# --- starvation -------------------------------------------------------------------------------


def _two_full_nodes_for_a_gang(*, now: float) -> Snapshot:
    return snapshot(
        [ws("team-a", "16"), ws("team-b", "16")],
        [node("n1", used=(0,)), node("n2")],
        running=[running("job:b0", "team-b", "n1", (0,), preemptible=False)],
        pending=[
            job("job:gang", "team-a", "8", 2, seq=1, submitted_at=0.0),
            job("job:small", "team-b", "1", seq=2, submitted_at=now),
        ],
        now=now,
    )


def test_it_backfills_small_work_past_a_gang_that_has_not_waited_long() -> None:
    decisions = schedule(_two_full_nodes_for_a_gang(now=3_599.0))
    assert admitted(decisions) == ["job:small"]
    assert reasons(decisions) == {"job:gang": "waiting for 2 nodes with 8 free h100"}


def test_it_holds_nodes_for_a_gang_blocked_longer_than_the_starvation_time() -> None:
    decisions = schedule(_two_full_nodes_for_a_gang(now=3_600.0))
    assert decisions.admitted == []
    assert reasons(decisions) == {
        "job:gang": "waiting for 2 nodes with 8 free h100; holding 2 node(s) for it while work there finishes",
        "job:small": "waiting for a node with 1 free h100",
    }


def _simulate(
    engine: Engine, arrivals: list[tuple[float, Workload]], until: float, reasons_of: dict[str, set[str]]
) -> dict[str, float]:
    """Submissions at their times, completions after their expected runtime, a cycle after each event.
    Returns when each workload started; collects the reasons given for the pending ones in `reasons_of`."""
    events: list[tuple[float, int, str]] = []  # (time, tie-break, key)
    submitted = {w.key: w for _, w in arrivals}
    for order, (at, workload) in enumerate(arrivals):
        heapq.heappush(events, (at, order, workload.key))
    started: dict[str, float] = {}
    while events and events[0][0] <= until:
        now, _, key = heapq.heappop(events)
        if key in started:
            engine.finish(key, now)
        else:
            engine.submit(submitted[key])
        decisions = engine.cycle(now)
        assert decisions.preempted == []
        for waiting in decisions.pending:
            reasons_of.setdefault(waiting.key, set()).add(waiting.reason)
        for admit in decisions.admitted:
            started[admit.key] = now
            runtime = submitted[admit.key].expected_runtime_s or 0.0
            heapq.heappush(events, (now + runtime, len(submitted) + len(started), admit.key))
    return started


def _gang_behind_a_stream(gang_workspace: WorkspaceInfo) -> tuple[dict[str, float], set[str]]:
    engine = Engine((gang_workspace, ws("team-b", "16")), (node("n1"), node("n2")), Policy(starvation_s=3_600.0))
    stream = [
        (60.0 * i, job(f"job:s{i}", "team-b", "1", seq=i + 1, submitted_at=60.0 * i, expected_runtime_s=900.0))
        for i in range(400)
    ]
    gang = job("job:gang", "team-a", "8", 2, seq=10_000, submitted_at=30.0, expected_runtime_s=900.0)
    reasons_of: dict[str, set[str]] = {}
    started = _simulate(engine, [*stream, (30.0, gang)], until=20_000.0, reasons_of=reasons_of)
    return started, reasons_of["job:gang"]


def test_it_admits_a_starving_gang_once_the_work_on_its_held_nodes_finishes() -> None:
    started, reasons = _gang_behind_a_stream(ws("team-a", "16"))
    # Held from 3630 (starvation_s after it was submitted); the 1-GPU jobs there run 900 s more.
    assert 3_630.0 < started["job:gang"] <= 3_630.0 + 900.0 + 60.0
    assert reasons == {
        "waiting for 2 nodes with 8 free h100",
        "waiting for 2 nodes with 8 free h100; holding 2 node(s) for it while work there finishes",
    }
    assert any(at > started["job:gang"] for key, at in started.items() if key != "job:gang")  # the stream goes on


def test_it_admits_a_starving_gang_even_when_the_stream_ranks_first_by_fair_share() -> None:
    # team-a's decayed past use, 16 GPUs over a half-life, puts the stream first by fair share every cycle.
    started, _ = _gang_behind_a_stream(ws("team-a", "16", history=16 * 7 * 86400.0))
    assert 3_630.0 < started["job:gang"] <= 3_630.0 + 900.0 + 60.0


# --- the engine between cycles ---------------------------------------------------------------


def test_the_engine_gives_back_what_a_finished_workload_held() -> None:
    engine = Engine((ws("team-a", "4"),), (node("n1", 4, used=(0, 1, 2, 3)),))
    engine.add_running(running("job:0", "team-a", "n1", (0, 1, 2, 3)))
    engine.submit(job("job:1", "team-a", "4", submitted_at=0.0))
    assert reasons(engine.cycle(1.0)) == {
        "job:1": "waiting for quota: 4 of 4 h100 in use in workspace team-a, this needs 4"
    }
    engine.finish("job:0", 2.0)
    decisions = engine.cycle(2.0)
    assert decisions.admitted[0].placement == (ReplicaPlacement("n1", tuple((i, D(1)) for i in range(4))),)


def test_the_engine_forgets_a_withdrawn_workload_and_reports_a_rejection_once() -> None:
    engine = Engine((ws("team-a", "4"),), (node("n1", 4, used=(0,)),))
    engine.submit(job("job:1", "team-a", "4", seq=1, submitted_at=0.0))
    engine.submit(job("job:2", "team-a", "8", seq=2, submitted_at=0.0))
    decisions = engine.cycle(1.0)
    assert [r.key for r in decisions.rejected] == ["job:2"]
    assert [p.key for p in decisions.pending] == ["job:1"]
    engine.withdraw("job:1")
    engine.withdraw("job:unknown")
    assert engine.cycle(2.0) == Decisions()


# --- fair share -------------------------------------------------------------------------------


def _idle_cohort(*borrowers: WorkspaceInfo, gpus: int) -> tuple[tuple[WorkspaceInfo, ...], tuple[NodeInfo, ...]]:
    return (ws("lender", "64", cohort="lab"), *borrowers), (node("n1", gpus),)


def _stream(workspace: str, count: int) -> list[Workload]:
    return [job(f"{workspace}:{i}", workspace, "1", seq=i) for i in range(count)]


def test_it_alternates_admissions_between_workspaces_of_equal_weight() -> None:
    workspaces, nodes = _idle_cohort(
        ws("team-a", "0", cohort="lab", can_borrow=True), ws("team-b", "0", cohort="lab", can_borrow=True), gpus=6
    )
    decisions = schedule(snapshot(workspaces, nodes, pending=[*_stream("team-a", 6), *_stream("team-b", 6)]))
    owners = [key.split(":")[0] for key in admitted(decisions)]
    assert owners == ["team-a", "team-b"] * 3


def test_it_gives_a_workspace_of_weight_two_about_twice_as_much() -> None:
    workspaces, nodes = _idle_cohort(
        ws("team-a", "0", cohort="lab", can_borrow=True, weight=2.0),
        ws("team-b", "0", cohort="lab", can_borrow=True),
        gpus=9,
    )
    decisions = schedule(snapshot(workspaces, nodes, pending=[*_stream("team-a", 9), *_stream("team-b", 9)]))
    owners = Counter(key.split(":")[0] for key in admitted(decisions))
    assert owners == {"team-a": 6, "team-b": 3}


def test_it_gives_a_heavy_past_user_its_turn_later() -> None:
    workspaces, nodes = _idle_cohort(
        ws("team-a", "0", cohort="lab", can_borrow=True, history=2 * 7 * 86400.0),  # 2 GPUs for a half-life
        ws("team-b", "0", cohort="lab", can_borrow=True),
        gpus=4,
    )
    decisions = schedule(snapshot(workspaces, nodes, pending=[*_stream("team-a", 4), *_stream("team-b", 4)]))
    owners = [key.split(":")[0] for key in admitted(decisions)]
    assert owners == ["team-b", "team-b", "team-a", "team-b"]


def test_it_forgets_past_use_as_it_decays() -> None:
    half_life = 7 * 86400.0
    workspaces, nodes = _idle_cohort(
        ws("team-a", "0", cohort="lab", can_borrow=True, history=8 * half_life),
        ws("team-b", "0", cohort="lab", can_borrow=True),
        gpus=2,
    )
    engine = Engine(workspaces, nodes)
    engine.submit(job("team-b:0", "team-b", "1", seq=0, submitted_at=0.0))
    assert admitted(engine.cycle(0.0)) == ["team-b:0"]
    engine.submit(job("team-a:1", "team-a", "1", seq=1, submitted_at=2 * half_life))
    engine.submit(job("team-b:1", "team-b", "1", seq=2, submitted_at=2 * half_life))
    # Undecayed, team-a's past (8 GPUs for a half-life) would outweigh team-b's 1 GPU now plus 2 half-lives of it;
    # two half-lives on, it has shrunk to a quarter.
    assert admitted(engine.cycle(2 * half_life)) == ["team-a:1"]


def test_it_serves_work_within_nominal_quota_before_work_that_must_borrow() -> None:
    decisions = schedule(
        snapshot(
            (ws("team-a", "2", cohort="lab", history=1e9), ws("team-b", "0", cohort="lab", can_borrow=True)),
            [node("n1", 2)],
            pending=[job("job:b", "team-b", "2", seq=1), job("job:a", "team-a", "2", seq=2)],
        )
    )
    assert admitted(decisions) == ["job:a"]


# --- placement per cluster --------------------------------------------------------------------


def test_it_bin_packs_or_spreads_per_cluster() -> None:
    policy = Policy(placement="binpack", placement_by_cluster=(("west", "spread"),))
    nodes = [
        NodeInfo(f"{c}{i}", c, t, tuple(Device(d, D(1)) for d in range(4)))
        for c, t in (("east", "a100"), ("west", "h100"))
        for i in (1, 2)
    ]
    pending = [Workload(f"{t}:{i}", "team-a", t, D(1), seq=i) for t in ("a100", "h100") for i in range(4)]
    workspaces = [WorkspaceInfo("team-a", (Quota("a100", D(8)), Quota("h100", D(8))))]
    decisions = schedule(snapshot(workspaces, nodes, pending=pending, policy=policy))
    where = {a.key: a.placement[0].node for a in decisions.admitted}
    assert [where[f"a100:{i}"] for i in range(4)] == ["east1"] * 4
    assert [where[f"h100:{i}"] for i in range(4)] == ["west1", "west2", "west1", "west2"]


def test_it_spreads_a_gang_over_the_emptiest_nodes() -> None:
    policy = Policy(placement="spread")
    decisions = schedule(
        snapshot(
            [ws("team-a", "16")],
            [node("n1", 4, used=(0,)), node("n2", 4), node("n3", 4, used=(0, 1))],
            pending=[job("job:1", "team-a", "1", 2)],
            policy=policy,
        )
    )
    assert [p.node for p in decisions.admitted[0].placement] == ["n2", "n1"]  # n2 was emptiest, then n1 and n2 tie


# --- fifo against backfill --------------------------------------------------------------------


def _blocked_head() -> Snapshot:
    return snapshot(
        [ws("team-a", "8")],
        [node("n1", 4, used=(0,))],
        pending=[job("job:big", "team-a", "4", seq=1), job("job:small", "team-a", "1", seq=2)],
    )


def test_fifo_blocks_a_workspaces_queue_at_its_first_workload_that_does_not_fit() -> None:
    snap = _blocked_head()
    decisions = schedule(snapshot(snap.workspaces, snap.nodes, pending=snap.pending, policy=Policy(name="fifo")))
    assert decisions.admitted == []
    assert reasons(decisions) == {
        "job:big": "waiting for a node with 4 free h100",
        "job:small": "in line: 1 workload ahead of it",
    }


def test_portal_backfills_past_a_blocked_workload() -> None:
    decisions = schedule(_blocked_head())
    assert admitted(decisions) == ["job:small"]
    assert reasons(decisions) == {"job:big": "waiting for a node with 4 free h100"}


def test_fifo_neither_borrows_nor_preempts() -> None:
    fifo = Policy(name="fifo")
    decisions = schedule(
        snapshot(
            (ws("team-a", "4", cohort="lab", can_borrow=True), ws("team-b", "4", cohort="lab")),
            [node("n1", 8, used=(0, 1, 2, 3))],
            running=[running("job:low", "team-a", "n1", (0, 1, 2, 3))],
            pending=[job("job:high", "team-a", "4", priority=9), job("job:more", "team-a", "5", seq=2)],
            policy=fifo,
        )
    )
    assert decisions.preempted == [] and decisions.admitted == []
    assert [r.key for r in decisions.rejected] == ["job:more"]  # a hard quota: 5 > 4 can never run
    assert reasons(decisions) == {"job:high": "waiting for quota: 4 of 4 h100 in use in workspace team-a, this needs 4"}


def test_fifo_queues_of_different_workspaces_do_not_block_each_other() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "8"), ws("team-b", "8")],
            [node("n1", 4, used=(0,))],
            pending=[job("job:a-big", "team-a", "4", seq=1), job("job:b-small", "team-b", "1", seq=2)],
            policy=Policy(name="fifo"),
        )
    )
    assert admitted(decisions) == ["job:b-small"]


# --- estimated starts -------------------------------------------------------------------------


def test_it_estimates_work_later_in_line_that_fits_to_start_before_work_ahead_of_it() -> None:
    """Played forward as the portal admits: job:4 fits beside job:1 and job:2 when r2 ends, as the
    portal's backfill would start it, while job:3 needs all 4 GPUs and waits for the three to end
    (and for team-b's next work, expected to follow its last, docs/scheduler.md)."""
    runtimes = {"expected_runtime_s": 1_000.0}
    decisions = schedule(
        snapshot(
            [ws("team-a", "16"), ws("team-b", "16")],
            [node("n1", 4, used=(0, 1, 2, 3))],
            running=[
                running("job:r1", "team-a", "n1", (0, 1), started_at=NOW - 900, **runtimes),
                running("job:r2", "team-b", "n1", (2, 3), started_at=NOW - 100, **runtimes),
            ],
            pending=[
                job("job:1", "team-a", "2", seq=1, **runtimes),
                job("job:2", "team-b", "1", seq=2, **runtimes),
                job("job:3", "team-a", "4", seq=3, **runtimes),
                job("job:4", "team-b", "1", seq=4, **runtimes),
            ],
        )
    )
    estimates = [(p.cluster_position, p.key, p.estimated_start) for p in decisions.pending]
    assert estimates == [
        (1, "job:1", NOW + 100),  # r1 ends
        (2, "job:2", NOW + 900),  # r2 ends
        # job:2 and job:4 end at +1,900 (job:1 at 1,100); team-b, with none of its work waiting then,
        # keeps their 2 GPUs (its use now) for its next work, which runs as long: all 4 free at +2,900.
        (3, "job:3", NOW + 2_900),
        (4, "job:4", NOW + 900),  # beside job:2 when r2 ends: backfill
    ]


def test_it_gives_no_estimate_when_what_it_waits_for_has_no_known_end() -> None:
    decisions = schedule(
        snapshot([ws("team-a", "8")], [node("n1", 4, used=(0,))], pending=[job("job:1", "team-a", "4")])
    )
    # The one GPU in use belongs to no known workload: no end to wait for.
    assert [(p.key, p.estimated_start) for p in decisions.pending] == [("job:1", None)]


# --- the wording of reasons -------------------------------------------------------------------


def test_it_words_a_quota_shortage() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "4")],
            [node("n1")],
            running=[running("job:0", "team-a", "n1", (0, 1, 2))],
            pending=[job("job:1", "team-a", "2")],
        )
    )
    assert reasons(decisions) == {"job:1": "waiting for quota: 3 of 4 h100 in use in workspace team-a, this needs 2"}


def test_it_words_a_placement_shortage_for_a_gang() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "16"), ws("team-b", "16")],
            [node("n1", used=(0,)), node("n2")],
            running=[running("job:0", "team-b", "n1", (0,))],
            pending=[job("job:1", "team-a", "8", 2)],
        )
    )
    assert reasons(decisions) == {"job:1": "waiting for 2 nodes with 8 free h100"}


def test_it_words_a_fractional_placement_shortage() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "4")],
            [NodeInfo("n1", "local", "h100", (Device(0, D("0.25")),))],
            pending=[job("job:1", "team-a", "0.5"), job("job:2", "team-a", "0.5", 2)],
        )
    )
    assert reasons(decisions) == {
        "job:1": "waiting for a device with 0.5 free h100",
        "job:2": "waiting for 2 device shares with 0.5 free h100",
    }


def test_it_words_the_borrowing_limit() -> None:
    decisions = schedule(
        snapshot(
            (ws("team-a", "2", borrowing_limit="1", cohort="lab", can_borrow=True), ws("team-b", "8", cohort="lab")),
            [node("n1")],
            running=[running("job:0", "team-a", "n1", (0, 1))],
            pending=[job("job:1", "team-a", "2")],
        )
    )
    assert reasons(decisions) == {
        "job:1": "waiting for quota: 2 of 2 h100 in use in workspace team-a, this needs 2 (borrowing limit 1)"
    }


def test_it_words_what_the_cohort_has_idle() -> None:
    decisions = schedule(
        snapshot(
            (ws("team-a", "0", cohort="lab", can_borrow=True), ws("team-b", "4", cohort="lab")),
            [node("n1")],
            running=[running("job:0", "team-b", "n1", (0, 1, 2))],
            pending=[job("job:1", "team-a", "2")],
        )
    )
    assert reasons(decisions) == {
        "job:1": "waiting for quota: 0 of 0 h100 in use in workspace team-a, this needs 2; "
        "cohort lab has 1 idle to lend"
    }


def test_it_words_a_backoff() -> None:
    decisions = schedule(
        snapshot([ws("team-a", "4")], [node("n1")], pending=[job("job:1", "team-a", "1", eligible_at=NOW + 30)])
    )
    assert reasons(decisions) == {"job:1": "requeued with backoff: eligible again in 30 s"}
    assert decisions.pending[0].estimated_start == NOW + 30


def test_it_rejects_more_than_the_workspace_could_ever_hold() -> None:
    decisions = schedule(
        snapshot(
            (ws("team-a", "2", borrowing_limit="4", cohort="lab", can_borrow=True), ws("team-b", "3", cohort="lab")),
            [node("n1"), node("n2")],
            pending=[job("job:1", "team-a", "6"), job("job:2", "team-a", "5")],
        )
    )
    assert [(r.key, r.reason) for r in decisions.rejected] == [
        ("job:1", "can never run: asks for 6 h100 but workspace team-a can hold at most 5")
    ]
    assert admitted(decisions) == ["job:2"]


def test_it_rejects_a_gang_no_cluster_could_hold() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "32")],
            [node("n1"), node("n2", 8, cluster="far"), node("n3", 4)],
            pending=[job("job:1", "team-a", "8", 2), job("job:2", "team-a", "16")],
        )
    )
    assert [(r.key, r.reason) for r in decisions.rejected] == [
        ("job:1", "can never run: no cluster has room for 2 x 8 h100 at once"),
        ("job:2", "can never run: no cluster has room for 1 x 16 h100 at once"),
    ]
    assert decisions.admitted == [] and decisions.pending == []


def test_it_estimates_a_start_no_earlier_than_its_workspaces_quota_allows() -> None:
    runtimes = {"expected_runtime_s": 1_000.0}
    decisions = schedule(
        snapshot(
            (
                ws("team-a", "4", cohort="lab"),  # may not borrow the idle quota beside it
                ws("team-b", "8", cohort="lab"),
                ws("team-c", "1", borrowing_limit="1", cohort="lab", can_borrow=True),
            ),
            [node("n1", used=(0, 1, 2, 3, 4, 5)), node("n2")],
            running=[
                running("job:a0", "team-a", "n1", (0, 1, 2, 3), started_at=NOW - 500, **runtimes),
                running("job:c0", "team-c", "n1", (4, 5), started_at=NOW - 200, **runtimes),
            ],
            pending=[job("job:a1", "team-a", "1", seq=1, **runtimes), job("job:c1", "team-c", "1", seq=2, **runtimes)],
        )
    )
    assert {p.key: (p.reason.split(":")[0], p.estimated_start) for p in decisions.pending} == {
        "job:a1": ("waiting for quota", NOW + 500),  # when job:a0 ends
        "job:c1": ("waiting for quota", NOW + 800),  # when job:c0 ends: it is at nominal + borrowing limit
    }


# --- fair scanning ----------------------------------------------------------------------------


def test_one_workspaces_blocked_queue_never_keeps_anothers_fitting_work_from_being_seen() -> None:
    """Teams a and b both borrow from c's idle quota; a goes first (b has used far more in the
    past), but its borrowing limit refuses each of its 300 queued jobs. The scan budget is shared,
    so b's one fitting job is still seen, and admitted, in the same cycle."""
    holding = running("job:a-runs", "team-a", "n1", (0, 1))  # all of team a's quota
    blocked = [job(f"job:a{n:03}", "team-a", "2", seq=n) for n in range(300)]
    fitting = job("job:b", "team-b", "1", seq=1_000)
    teams = [
        ws("team-a", "2", cohort="lab", can_borrow=True, borrowing_limit="0"),
        ws("team-b", "0", cohort="lab", can_borrow=True, history=1e9),
        ws("team-c", "6", cohort="lab"),
    ]
    policy = Policy(max_scan=100, preemption=False)
    decisions = schedule(snapshot(teams, [node("n1", used=(0, 1))], [holding], [*blocked, fitting], policy=policy))
    assert admitted(decisions) == ["job:b"]
    assert reasons(decisions)["job:a000"].startswith("waiting for quota")


# --- victims chosen node by node --------------------------------------------------------------


def test_a_gang_within_its_quota_gets_victims_that_free_whole_nodes_however_many_it_takes() -> None:
    """Team b borrows all 64 GPUs with 1-GPU jobs; the most recently started (the cheapest) are
    spread over every node, so evicting the cheapest 32 frees no node. Team a's 32-GPU gang (4
    replicas of 8) is within its quota: its victims are chosen node by node, 32 of them on 4 nodes."""
    nodes = [node(f"n{n}", used=tuple(range(8))) for n in range(8)]
    stream = [
        running(f"job:b-{n}-{slot}", "team-b", f"n{n}", (slot,), started_at=1_000.0 + slot * 8 + n)
        for n in range(8)
        for slot in range(8)
    ]
    teams = [
        ws("team-a", "32", cohort="lab"),
        ws("team-b", "0", cohort="lab", can_borrow=True),
        ws("team-c", "32", cohort="lab"),
    ]
    gang = job("job:a-gang", "team-a", "8", replicas=4)
    decisions = schedule(snapshot(teams, nodes, stream, [gang], policy=Policy(max_victims=32)))
    assert admitted(decisions) == ["job:a-gang"]
    victims = preempted(decisions)
    assert len(victims) == 32
    assert len({key.split("-")[1] for key in victims}) == 4  # whole nodes, not a few GPUs on each
    assert all(p.key.startswith("job:b-") for p in decisions.preempted)
