"""The scheduler's guarantees (docs/scheduler.md, "Guarantees"): each adversarial scenario keeps its
bound under the portal policy, and the rules behind them hold cycle by cycle."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.scheduling import scenarios
from apps.scheduling.engine import Engine, Policy, Snapshot, Workload, schedule
from apps.scheduling.replay import PORTAL, Job, Options, Replay
from tests.scheduling.builders import admitted, reasons, ws
from tests.scheduling.test_engine import job, node

HOUR = 3600.0


@pytest.mark.parametrize("make", scenarios.SCENARIOS, ids=lambda make: make().name)
def test_every_scenario_keeps_its_bound_under_the_portal_policy(make) -> None:
    result = scenarios.run(make(), "portal")

    assert result["protected_rejected"] == 0
    assert result["protected_max_wait_s"] <= result["bound_s"], result
    assert result["quota_violations"] == 0
    assert result["partial_gangs"] == 0


def test_the_scenarios_are_adversarial_the_shared_queue_breaks_most_bounds() -> None:
    """A single queue without quotas serves the borrower's flood first: the suite does test something."""
    broken = [make().name for make in scenarios.SCENARIOS if not scenarios.run(make(), "shared")["within_bound"]]
    assert len(broken) >= 6, broken


# --- owed quota ----------------------------------------------------------------------------------


def _engine(workspaces, nodes, policy: Policy | None = None) -> Engine:
    return Engine(tuple(workspaces), tuple(nodes), policy or Policy(min_runtime_s=HOUR, starvation_s=HOUR))


def _run(engine: Engine, workload: Workload, now: float) -> None:
    engine.submit(workload)
    decisions = engine.cycle(now, explain=False)
    assert workload.key in admitted(decisions)


def test_what_a_borrower_gives_back_goes_to_the_waiting_owner_not_back_to_the_borrower() -> None:
    owner = ws("owner", "2", cohort="lab", can_borrow=True)
    borrower = ws("borrower", "0", cohort="lab", can_borrow=True)
    engine = _engine([owner, borrower], [node("n1", "1", "1")])
    _run(engine, job("b1", "borrower", "1"), 0.0)
    _run(engine, job("b2", "borrower", "1"), 0.0)
    engine.submit(job("b3", "borrower", "1", seq=1))
    engine.submit(job("o1", "owner", "2", seq=2))  # within its quota; the borrower holds all of it
    assert admitted(engine.cycle(60.0, explain=False)) == []  # the borrower's work is too young to evict

    engine.finish("b1", 120.0)
    decisions = engine.cycle(120.0)

    assert admitted(decisions) == []  # b3 does not take the GPU b1 gave back
    assert "lent to others" in reasons(decisions)["o1"]
    assert "idle to lend" in reasons(decisions)["b3"]
    engine.finish("b2", 180.0)
    assert admitted(engine.cycle(180.0)) == ["o1"]


# --- starving gangs ------------------------------------------------------------------------------


def _gang_behind_its_workspaces_small_jobs(small: Workload) -> tuple[Engine, list[str]]:
    """A team owns both GPUs; one runs a job declared to stop within 2 hours, one is free; a 2-GPU
    gang has waited past starvation_s; `small` comes after it."""
    engine = _engine([ws("team", "2")], [node("n1", "1", "1")])
    running = replace(job("r1", "team", "1"), max_runtime_s=2 * HOUR)
    _run(engine, running, 0.0)
    engine.submit(replace(job("gang", "team", "2", seq=1), submitted_at=0.0))
    engine.submit(replace(small, seq=2, submitted_at=2 * 60.0))
    return engine, admitted(engine.cycle(HOUR + 60.0, explain=False))


def test_a_starving_gang_keeps_its_workspaces_later_work_off_the_quota_it_waits_for() -> None:
    _, started = _gang_behind_its_workspaces_small_jobs(job("small", "team", "1"))
    assert started == []


def test_work_declared_to_end_before_the_gang_could_start_may_go_first() -> None:
    short = replace(job("short", "team", "1"), max_runtime_s=HOUR / 2)  # ends before r1's 2 hours
    assert _gang_behind_its_workspaces_small_jobs(short)[1] == ["short"]
    long = replace(job("long", "team", "1"), max_runtime_s=3 * HOUR)
    assert _gang_behind_its_workspaces_small_jobs(long)[1] == []


def test_before_starvation_later_small_work_is_not_held_back() -> None:
    engine = _engine([ws("team", "2")], [node("n1", "1", "1")])
    _run(engine, job("r1", "team", "1"), 0.0)
    engine.submit(job("gang", "team", "2", seq=1))
    engine.submit(job("small", "team", "1", seq=2))
    assert admitted(engine.cycle(60.0, explain=False)) == ["small"]


def test_a_gang_that_must_borrow_holds_nothing_back() -> None:
    """Only a gang within its nominal quota is owed it: one that needs others' idle quota, which may
    never come, does not stop its workspace's other work."""
    engine = _engine(
        [ws("team", "1", cohort="lab", can_borrow=True), ws("other", "1", cohort="lab")], [node("n1", "1", "1")]
    )
    _run(engine, job("o1", "other", "1"), 0.0)
    engine.submit(job("gang", "team", "2", seq=1))
    engine.submit(job("small", "team", "1", seq=2))
    assert admitted(engine.cycle(2 * HOUR, explain=False)) == ["small"]


def test_held_nodes_take_only_work_declared_to_leave_them_in_time() -> None:
    """A gang waiting for devices has the best nodes held; work declared to end before what runs there
    may use them (backfill), other work may not."""
    engine = _engine([ws("team", "4"), ws("other", "4")], [node("n1", "1", "1"), node("n2", "1", "1")])
    for key, gpus in (("a", "1"), ("b", "1")):
        _run(engine, replace(job(key, "other", gpus), max_runtime_s=2 * HOUR), 0.0)  # one on each node
    engine.submit(job("gang", "team", "2", replicas=2, seq=1))
    engine.submit(job("free", "other", "1", seq=2))
    engine.submit(replace(job("short", "other", "1", seq=3), max_runtime_s=HOUR / 2))
    decisions = engine.cycle(HOUR + 10.0)
    assert admitted(decisions) == ["short"]
    assert "holding 2 node(s)" in reasons(decisions)["gang"]


# --- exact shares --------------------------------------------------------------------------------


def test_three_thirds_share_one_device_and_a_fourth_share_waits() -> None:
    engine = _engine([ws("team", "1")], [node("n1", "1")])
    for n in range(3):
        _run(engine, job(f"third{n}", "team", "0.333", seq=n), 0.0)
    engine.submit(job("quarter", "team", "0.25", seq=3))
    assert admitted(engine.cycle(60.0)) == []
    assert [
        a.key
        for a in schedule(
            Snapshot((ws("team", "1"),), (node("n1", "0.333"),), (), (job("x", "team", "0.333"),))
        ).admitted
    ] == ["x"]


def test_two_thirds_and_a_third_fill_a_device() -> None:
    engine = _engine([ws("team", "1")], [node("n1", "1")])
    _run(engine, job("two", "team", "0.667"), 0.0)
    _run(engine, job("one", "team", "0.333", seq=1), 0.0)
    assert engine.pools["local", "h100"].free_units == 0


# --- the bound on random traces ----------------------------------------------------------------


@st.composite
def _floods(draw: st.DrawFn) -> list[Job]:
    """A borrower's random jobs (shares and whole GPUs, short and long) from time 0, and an owner
    asking for up to its 8 GPUs in 1-GPU jobs at a random later time."""
    jobs: list[Job] = []
    for n in range(draw(st.integers(1, 40))):
        at = draw(st.sampled_from([0.0, 0.0, 600.0, 1800.0, 3600.0, 7200.0]))
        gpus = draw(st.sampled_from(["0.25", "0.5", "1", "1", "2"]))
        jobs.append(Job(f"b{n}", at, draw(st.sampled_from([900.0, 5400.0, 20 * HOUR])), Decimal(gpus), "borrower", n))
    owner_at = draw(st.sampled_from([1800.0, 3600.0, 4 * HOUR]))
    for n in range(draw(st.integers(1, 8))):
        jobs.append(Job(f"o{n}", owner_at, 3600.0, Decimal(1), "owner", 100 + n))
    return sorted(jobs, key=lambda j: (j.submit_s, j.seq))


@settings(max_examples=60, deadline=None, database=None)
@given(_floods())
def test_an_owners_single_gpu_work_starts_within_the_bound_whatever_the_borrower_runs(
    jobs: list[Job],
) -> None:
    replay = Replay(jobs, {"owner": 8, "borrower": 8}, Options(policy=PORTAL, interval_s=2.0))
    replay.run()
    bound = PORTAL.min_runtime_s + 2.0
    waits = {j.job_id: replay.first_start[j.job_id] - j.submit_s for j in jobs if j.team == "owner"}
    assert max(waits.values()) <= bound, waits


# --- reclaim keeps a victim's workspace at its nominal quota (Kueue's rule) ----------------------


def _reclaim_from(borrower_jobs: list[tuple[str, str]], borrower_quota: str, ask: str = "1", owner_quota: str = "2"):
    """The owner (none in use) asks for `ask` on a full node of 4 GPUs; the borrower runs
    `borrower_jobs` (key, GPUs), older first, all past min_runtime_s."""
    owner = ws("owner", owner_quota, cohort="lab", can_borrow=True)
    borrower = ws("borrower", borrower_quota, cohort="lab", can_borrow=True)
    engine = _engine([owner, borrower], [node("n1", "1", "1", "1", "1")])
    for n, (key, gpus) in enumerate(borrower_jobs):
        _run(engine, job(key, "borrower", gpus, seq=n), float(n))
    engine.submit(job("o1", "owner", ask, seq=10))
    return engine, engine.cycle(2 * HOUR)


def test_reclaim_evicts_any_work_of_a_workspace_while_it_is_above_its_quota() -> None:
    # The borrower uses 4 of its 2: the newest (cheapest) victim, a 2-GPU job, makes room.
    engine, decisions = _reclaim_from([("old1", "1"), ("old2", "1"), ("new2", "2")], "2")
    assert [p.key for p in decisions.preempted] == ["new2"] and admitted(decisions) == ["o1"]
    # 2 above its quota of 2: two of its jobs may go, not a third, which the owner's 3 GPUs would need.
    engine, decisions = _reclaim_from([(f"b{n}", "1") for n in range(4)], "2", ask="3", owner_quota="4")
    assert decisions.preempted == [] and admitted(decisions) == []
    assert engine.ledger.used["borrower", "h100"] == 4000


@st.composite
def _borrowers(draw: st.DrawFn) -> list[tuple[str, str]]:
    return [(f"b{n}", draw(st.sampled_from(["0.25", "0.5", "1", "2"]))) for n in range(draw(st.integers(1, 10)))]


@settings(max_examples=80, deadline=None, database=None)
@given(_borrowers(), st.sampled_from(["0", "1", "2"]), st.sampled_from(["0.25", "0.5", "1", "2"]))
def test_reclaim_stops_at_a_workspaces_nominal_quota(jobs, quota, ask) -> None:
    """Over random borrowers (shares and whole GPUs) on one node: reclaim evicts from the borrower
    only while it is above its nominal quota, so it ends below it by less than its last victim."""
    owner = ws("owner", "4", cohort="lab", can_borrow=True)
    borrower = ws("borrower", quota, cohort="lab", can_borrow=True)
    engine = _engine([owner, borrower], [node("n1", "1", "1", "1", "1")])
    for n, (key, gpus) in enumerate(jobs):
        engine.submit(job(key, "borrower", gpus, seq=n))
    engine.cycle(0.0, explain=False)
    engine.submit(job("o1", "owner", ask, seq=100))
    decisions = engine.cycle(2 * HOUR, explain=False)
    if decisions.preempted:
        largest = max(int(Decimal(gpus) * 1000) for key, gpus in jobs if key in {p.key for p in decisions.preempted})
        assert engine.ledger.used["borrower", "h100"] + largest > int(Decimal(quota) * 1000)


# --- preemption frees a share of one device, device by device ------------------------------------


def test_a_fraction_gets_victims_on_one_device_when_the_cheapest_are_spread() -> None:
    """Quarters, the cheapest victims, one on each device: evicting them frees a quarter on each and
    a half nowhere; the victims are chosen on one device instead."""
    engine = _engine(
        [ws("owner", "4", cohort="lab", can_borrow=True), ws("borrower", "0", cohort="lab", can_borrow=True)],
        [node("n1", "1", "1", "1", "1")],
        Policy(min_runtime_s=HOUR, starvation_s=HOUR, max_victims=4),
    )
    for n in range(4):
        _run(engine, job(f"three{n}", "borrower", "0.75", seq=n), 0.0)
    for n in range(4):
        _run(engine, job(f"quarter{n}", "borrower", "0.25", seq=10 + n), 60.0)
    engine.submit(job("o1", "owner", "0.5", seq=20))
    decisions = engine.cycle(2 * HOUR, explain=False)
    assert admitted(decisions) == ["o1"]
    assert len(decisions.preempted) == 1  # the three quarters beside a quarter: its device is half free


# --- owed in a shape the owner can use -----------------------------------------------------------


def test_an_owners_whole_gpu_job_holds_a_node_that_borrowers_shares_may_not_refill() -> None:
    engine = _engine(
        [ws("owner", "2", cohort="lab", can_borrow=True), ws("borrower", "0", cohort="lab", can_borrow=True)],
        [node("n1", "1", "1")],
    )
    _run(engine, job("q1", "borrower", "0.25"), 0.0)
    _run(engine, job("q2", "borrower", "0.25", seq=1), 0.0)
    # q1 and q2 share device 0; fill the rest with quarters so no device is whole.
    for n in range(6):
        _run(engine, job(f"f{n}", "borrower", "0.25", seq=2 + n), 0.0)
    engine.submit(job("o1", "owner", "1", seq=20))
    engine.submit(job("more", "borrower", "0.25", seq=21))
    decisions = engine.cycle(60.0)  # the borrowers are too young to evict
    assert admitted(decisions) == []
    assert "holding 1 node(s)" in reasons(decisions)["o1"]


def _owner_beside_a_borrower_at_its_quota(*pending: Workload) -> tuple[Engine, dict[str, str]]:
    """The borrower runs its 6 GPUs' quota as two 3-GPU jobs, one on each node of 4: no node has the
    2 the owner's job (within its quota of 2) asks for. `pending` are submitted after it."""
    workspaces = [
        ws("owner", "2", cohort="lab", can_borrow=True),
        ws("borrower", "6", cohort="lab", can_borrow=True),
        ws("other", "1", cohort="lab", can_borrow=True),
    ]
    engine = _engine(workspaces, [node("n1", "1", "1", "1", "1"), node("n2", "1", "1", "1", "1")])
    _run(engine, job("b0", "borrower", "3"), 0.0)
    _run(engine, job("b1", "borrower", "3", seq=1), 0.0)
    engine.submit(job("o1", "owner", "2", seq=10))
    for workload in pending:
        engine.submit(workload)
    engine.cycle(60.0, explain=False)  # the borrowers are too young to evict
    return engine, reasons(engine.cycle(60.0))


def test_an_owner_has_nodes_held_while_a_borrower_at_its_quota_waits_to_borrow() -> None:
    """The borrower is at its quota, not above it, but has more waiting: its next job would borrow the
    owner's idle quota on the very nodes the owner needs, so one is held for the owner."""
    engine, why = _owner_beside_a_borrower_at_its_quota(job("more", "borrower", "1", seq=11))
    assert "holding 1 node(s) for it while work there finishes" in why["o1"]
    free = {n.name: n.whole for pool in engine.pools.values() for n in pool.nodes.values()}
    assert free == {"n1": 1, "n2": 0}  # the borrower's next job went to the node not held
    assert engine.ledger.used["borrower", "h100"] == 7000


def test_backfill_goes_past_an_owners_work_while_no_one_borrows_or_waits_to() -> None:
    """No other workspace wants more than its quota: nothing is owed to the owner's job, so nothing
    is held for it, and another workspace's work within its quota starts where it fits."""
    engine, why = _owner_beside_a_borrower_at_its_quota(job("x1", "other", "1", seq=11))
    assert why["o1"] == "waiting for a node with 2 free h100"
    assert "x1" not in engine.pending
