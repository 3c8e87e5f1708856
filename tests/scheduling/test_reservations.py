"""Reservations in the engine: fenced devices, backfill before a reservation, evictions before it
begins, its holder's work uncounted inside it; then a property over random clusters run cycle by cycle."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from apps.scheduling.engine import Engine, Policy, Preempt, ReplicaPlacement, Snapshot, Workload, schedule
from apps.scheduling.types import Reservation
from tests.scheduling.builders import admitted, reasons, ws
from tests.scheduling.test_engine import job, node

D = Decimal
HOUR = 3600.0
LABEL = "team-b's reservation, Mon 09:00-Thu 09:00"


def reservation(
    devices: tuple[tuple[str, int], ...], start: float, end: float, *, workspace: str = "team-b", key: str = "gpr:1"
) -> Reservation:
    return Reservation(key, workspace, "local", "h100", devices, start, end, LABEL if key == "gpr:1" else key)


def running(key: str, workspace: str, devices: tuple[int, ...], *, started_at: float = 0.0, **fields) -> Workload:
    """A workload running on whole devices of n1."""
    placement = (ReplicaPlacement("n1", tuple((d, D(1)) for d in devices)),)
    return replace(
        job(key, workspace, str(len(devices))), cluster="local", placement=placement, started_at=started_at, **fields
    )


def engine(*workspaces, nodes=None, reservations=(), policy: Policy | None = None) -> Engine:
    made = Engine(tuple(workspaces), tuple(nodes or [node("n1", "1", "1", "1", "1")]), policy or Policy())
    made.set_reservations(reservations)
    return made


def devices_of(decisions, key: str) -> set[tuple[str, int]]:
    (admit,) = [a for a in decisions.admitted if a.key == key]
    return {(replica.node, index) for replica in admit.placement for index, _ in replica.devices}


LATER = reservation((("n1", 2), ("n1", 3)), 1000.0, 5000.0)  # two of n1's four devices, from t=1000


# --- fencing and backfill before it begins -----------------------------------------------------


def test_it_keeps_work_that_would_overlap_a_reservation_off_its_devices_and_says_whose_they_are() -> None:
    long = replace(job("job:1", "team-a", "4"), preemptible=False)
    decisions = schedule(Snapshot((ws("team-a", "8"),), (node("n1", "1", "1", "1", "1"),), (), (long,), 0.0,
                                  reservations=(LATER,)))  # fmt: skip

    assert admitted(decisions) == []
    assert reasons(decisions)["job:1"] == f"waiting for a node with 4 free h100: 2 of them are held for {LABEL}"


def test_it_places_other_work_beside_the_fenced_devices() -> None:
    small = replace(job("job:1", "team-a", "2"), preemptible=False)
    decisions = schedule(Snapshot((ws("team-a", "8"),), (node("n1", "1", "1", "1", "1"),), (), (small,), 0.0,
                                  reservations=(LATER,)))  # fmt: skip

    assert devices_of(decisions, "job:1") == {("n1", 0), ("n1", 1)}


def test_work_declared_to_end_by_the_start_backfills_the_reserved_devices() -> None:
    short = replace(job("job:1", "team-a", "4"), preemptible=False, max_runtime_s=1000.0)
    too_long = replace(short, key="job:2", max_runtime_s=1001.0, seq=1)
    made = engine(ws("team-a", "8"), reservations=[LATER])
    made.submit(short)
    made.submit(too_long)

    decisions = made.cycle(0.0)

    assert admitted(decisions) == ["job:1"]
    assert "held for" not in reasons(decisions)["job:2"]  # refused: job:1 holds the node now


def test_work_declared_to_run_past_the_start_is_refused_naming_the_reservation() -> None:
    made = engine(ws("team-a", "8"), reservations=[LATER])
    made.submit(replace(job("job:1", "team-a", "4"), preemptible=False, max_runtime_s=1001.0))

    decisions = made.cycle(0.0)

    assert admitted(decisions) == []
    assert LABEL in reasons(decisions)["job:1"]


def test_work_that_may_backfill_is_tried_after_larger_work_found_no_placement() -> None:
    made = engine(ws("team-a", "8"), reservations=[LATER])
    made.submit(replace(job("job:1", "team-a", "4"), preemptible=False))
    made.submit(job("job:2", "team-a", "4", seq=1))  # preemptible: it may use the fenced devices until t=940

    assert admitted(made.cycle(0.0)) == ["job:2"]


def test_ended_reservations_are_ignored() -> None:
    made = engine(ws("team-a", "8"), reservations=[LATER])
    made.submit(replace(job("job:1", "team-a", "4"), preemptible=False))
    assert admitted(made.cycle(4999.0)) == []
    assert admitted(made.cycle(5000.0)) == ["job:1"]


def test_devices_freed_between_cycles_are_fenced_again_at_the_next_pass() -> None:
    made = engine(ws("team-a", "8"), nodes=[node("n1", "1", "1", "0", "0")], reservations=[LATER])
    made.add_running(running("run:1", "team-a", (2, 3), max_runtime_s=900.0, preemptible=False))
    made.cycle(0.0)
    made.finish("run:1", 100.0)
    made.submit(replace(job("job:1", "team-a", "4"), preemptible=False))

    decisions = made.cycle(100.0)

    assert admitted(decisions) == []
    assert LABEL in reasons(decisions)["job:1"]


# --- evictions before it begins ----------------------------------------------------------------


def test_preemptible_work_is_admitted_on_reserved_devices_then_evicted_grace_before_the_start() -> None:
    made = engine(ws("team-a", "8"), reservations=[LATER], policy=Policy(grace_s=60.0))
    made.submit(replace(job("job:1", "team-a", "4"), checkpointable=True))
    assert admitted(made.cycle(0.0)) == ["job:1"]

    assert made.cycle(939.0).preempted == []  # nothing is pending: the evictions come all the same
    decisions = made.cycle(940.0)

    assert decisions.preempted == [
        Preempt("job:1", f"preempted: the devices it runs on are held for {LABEL}", "gpr:1", 60.0)
    ]


def test_preemptible_work_is_not_placed_on_reserved_devices_within_grace_of_the_start() -> None:
    made = engine(ws("team-a", "8"), reservations=[LATER], policy=Policy(grace_s=60.0))
    made.submit(job("job:1", "team-a", "4"))
    assert admitted(made.cycle(940.0)) == []


def test_work_not_of_the_reservation_is_evicted_from_it_the_holders_ordinary_work_too() -> None:
    made = engine(ws("team-a", "8"), ws("team-b", "8"), nodes=[node("n1", "1", "1", "0", "0")], reservations=[LATER])
    made.add_running(running("run:a", "team-a", (2,), preemptible=False))
    # The holder's ordinary work, counted by its quota: it would keep the holder's larger work out of
    # its own reservation. Requeued, it may come back inside it.
    made.add_running(running("run:b", "team-b", (3,), preemptible=False))

    decisions = made.cycle(1000.0)

    assert [(p.key, p.for_key, p.grace_s) for p in decisions.preempted] == [("run:a", "gpr:1", 0.0),
                                                                            ("run:b", "gpr:1", 0.0)]  # fmt: skip


def test_the_holders_work_inside_its_reservation_stays() -> None:
    made = engine(ws("team-b", "0"), nodes=[node("n1", "1", "1", "0", "1")], reservations=[LATER])
    made.add_running(replace(running("run:b", "team-b", (2,), started_at=1000.0), reservation="gpr:1"))
    assert made.cycle(1001.0).preempted == []


def test_work_declared_to_end_by_the_start_is_left_to_end() -> None:
    made = engine(ws("team-a", "8"), nodes=[node("n1", "1", "1", "0", "1")], reservations=[LATER])
    made.add_running(running("run:a", "team-a", (2,), started_at=0.0, max_runtime_s=1000.0))
    assert made.cycle(990.0).preempted == []
    assert [p.key for p in made.cycle(1000.0).preempted] == ["run:a"]  # still there at the start: it goes


def test_preemption_does_not_evict_backfill_on_reserved_devices_to_make_room_for_other_work() -> None:
    """What the backfill gives back goes to the reservation: evicting it would place team-a's long
    work on devices reserved from t=1000."""
    made = engine(ws("team-a", "4", cohort="lab"), ws("team-c", "0", cohort="lab", can_borrow=True),
                  nodes=[node("n1", "1", "1", "0", "0")], reservations=[LATER],
                  policy=Policy(min_runtime_s=0.0))  # fmt: skip
    made.add_running(running("run:c", "team-c", (2, 3)))  # preemptible, borrowing team-a's quota
    made.submit(replace(job("job:a", "team-a", "4"), preemptible=False, max_runtime_s=HOUR))

    decisions = made.cycle(20.0)

    assert decisions.preempted == []
    assert admitted(decisions) == []


# --- its holder's work -------------------------------------------------------------------------


NOW = reservation((("n1", 2), ("n1", 3)), 0.0, 5000.0)  # under way


def test_the_holders_work_goes_into_its_reservation_uncounted_even_with_no_quota() -> None:
    made = engine(ws("team-b", "0"), reservations=[NOW])
    made.submit(replace(job("job:1", "team-b", "2"), preemptible=False))

    decisions = made.cycle(100.0)

    (admit,) = decisions.admitted
    assert admit.reservation == "gpr:1"
    assert devices_of(decisions, "job:1") == {("n1", 2), ("n1", 3)}
    assert made.ledger.used["team-b", "h100"] == 0


def test_the_holders_work_goes_into_its_reservation_with_its_quota_full() -> None:
    made = engine(ws("team-b", "1"), nodes=[node("n1", "0", "1", "1", "1")], reservations=[NOW])
    made.add_running(running("run:b", "team-b", (0,)))
    made.submit(job("job:1", "team-b", "1", seq=1))
    made.submit(job("job:2", "team-b", "0.5", seq=2))
    made.submit(job("job:3", "team-b", "1", seq=3))  # the reservation is full by then: quota refuses it

    decisions = made.cycle(100.0)

    assert [(a.key, a.reservation) for a in decisions.admitted] == [("job:1", "gpr:1"), ("job:2", "gpr:1")]
    assert reasons(decisions)["job:3"].startswith("waiting for quota: 1 of 1 h100 in use")


def test_the_holders_work_goes_into_its_reservation_after_quota_refused_smaller_work_in_a_quick_pass() -> None:
    made = engine(ws("team-b", "1"), nodes=[node("n1", "0", "1", "1", "1"), node("w1", "1", cluster="west")],
                  reservations=[NOW])  # fmt: skip
    made.add_running(running("run:b", "team-b", (0,)))
    made.submit(replace(job("job:1", "team-b", "1"), cluster="west"))  # not the reservation's cluster: quota refuses it
    made.submit(job("job:2", "team-b", "2", seq=1))

    decisions = made.cycle(100.0, explain=False)

    assert [(a.key, a.reservation) for a in decisions.admitted] == [("job:2", "gpr:1")]


def test_the_holders_small_work_does_not_crowd_its_largest_waiting_work_out_of_its_reservation() -> None:
    made = engine(ws("team-b", "0"), reservations=[NOW])
    made.submit(job("job:1", "team-b", "1"))
    made.submit(job("job:2", "team-b", "1", seq=1))
    made.submit(job("job:big", "team-b", "2", seq=2))  # the reservation's size, last in line

    decisions = made.cycle(100.0)

    assert [(a.key, a.reservation) for a in decisions.admitted] == [("job:big", "gpr:1")]
    assert reasons(decisions)["job:1"].startswith("waiting for quota")


def test_the_holders_largest_waiting_work_waits_for_its_running_work_there_and_nothing_else_takes_its_room() -> None:
    made = engine(ws("team-b", "0"), nodes=[node("n1", "1", "1", "0", "1")], reservations=[NOW])
    made.add_running(running("run:b", "team-b", (2,), reservation="gpr:1"))
    made.submit(job("job:big", "team-b", "2"))
    made.submit(job("job:small", "team-b", "1", seq=1))  # the free device of the two would keep job:big out

    assert admitted(made.cycle(100.0)) == []

    made.finish("run:b")
    assert admitted(made.cycle(200.0)) == ["job:big"]


def test_a_gang_goes_into_a_reservation_whole_or_not_at_all() -> None:
    made = engine(ws("team-b", "0"), nodes=[node("n1", "1", "1", "1", "1"), node("n2", "1", "1")],
                  reservations=[reservation((("n1", 2), ("n1", 3), ("n2", 0)), 0.0, 5000.0)])  # fmt: skip
    made.submit(job("gang:1", "team-b", "3"))  # three devices on one node: no node has three of them
    made.submit(replace(job("gang:2", "team-b", "1", seq=1), more=((D(1), 2),)))  # head and two workers: three

    decisions = made.cycle(100.0)

    assert admitted(decisions) == ["gang:2"]
    assert devices_of(decisions, "gang:2") == {("n1", 2), ("n1", 3), ("n2", 0)}
    assert reasons(decisions)["gang:1"].startswith("waiting for quota")


def test_work_in_a_reservation_is_no_victim_for_another_workspace() -> None:
    made = engine(ws("team-a", "4", cohort="lab"), ws("team-b", "0", cohort="lab"), reservations=[NOW],
                  nodes=[node("n1", "1", "1", "0", "0")], policy=Policy(min_runtime_s=0.0))  # fmt: skip
    made.add_running(running("run:b", "team-b", (2, 3), reservation="gpr:1"))
    made.submit(replace(job("job:a", "team-a", "4"), preemptible=False))

    decisions = made.cycle(100.0)

    assert decisions.preempted == []
    assert made.ledger.used["team-b", "h100"] == 0


def test_work_left_in_an_ended_reservation_counts_against_quota_again() -> None:
    made = engine(ws("team-b", "2"), nodes=[node("n1", "1", "1", "0", "0", "1", "1")],
                  reservations=[reservation((("n1", 2), ("n1", 3)), 0.0, 1000.0)])  # fmt: skip
    made.add_running(running("run:b", "team-b", (2, 3), reservation="gpr:1"))
    made.submit(job("job:1", "team-b", "1"))
    assert admitted(made.cycle(500.0)) == ["job:1"]  # its quota is all its own while run:b is in the reservation
    made.submit(job("job:2", "team-b", "1", seq=1))

    decisions = made.cycle(1000.0)

    assert made.ledger.used["team-b", "h100"] == 3000
    assert reasons(decisions)["job:2"].startswith("waiting for quota: 3 of 2 h100 in use")


def test_reservations_on_the_same_devices_never_give_a_device_twice() -> None:
    twice = reservation((("n1", 2), ("n1", 3)), 0.0, 5000.0, workspace="team-a", key="gpr:2")
    made = engine(ws("team-a", "0"), ws("team-b", "0"), reservations=[NOW, twice])
    made.submit(job("job:a", "team-a", "2"))
    made.submit(job("job:b", "team-b", "2", seq=1))

    decisions = made.cycle(100.0)

    assert len(decisions.admitted) == 1


def test_work_that_only_fits_with_reserved_devices_is_not_estimated_to_start_before_they_end() -> None:
    nodes = [node("n1", "1", "1", "1", "1"), node("n2", "0", "0", "0", "0"), node("n3", "1", "1")]
    made = engine(ws("team-a", "10"), nodes=nodes, reservations=[LATER])
    ending = replace(running("run:a", "team-a", (0, 1, 2, 3)), expected_runtime_s=100.0)
    made.add_running(replace(ending, placement=(ReplicaPlacement("n2", ending.placement[0].devices),)))
    # Two whole nodes: once n2's work ends there are eight GPUs free in all, yet n1 is one of the two.
    made.submit(replace(job("gang:1", "team-a", "4", 2), preemptible=False))

    decisions = made.cycle(0.0)

    (pending,) = decisions.pending
    assert pending.estimated_start == 5000.0


# --- property: random clusters, cycle after cycle ----------------------------------------------

PERIOD, GRACE, HORIZON = 30.0, 60.0, 4000.0


@st.composite
def worlds(draw):
    """Nodes of one cluster; reservations by holders h0.. (one each, none overlapping another on a
    device); each holder's one job, which fits its reservation; other work of team-a and team-b."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    nodes = [node(f"n{i}", *["1"] * size, cluster="local") for i, size in enumerate(sizes)]
    spots = [(f"n{i}", d) for i, size in enumerate(sizes) for d in range(size)]
    reservations: list[Reservation] = []
    holders: list[tuple[Workload, float]] = []
    for i in range(draw(st.integers(0, 3))):
        devices = tuple(sorted(draw(st.sets(st.sampled_from(spots), min_size=1, max_size=len(spots)))))
        start = draw(st.integers(0, 60)) * 50.0
        end = start + draw(st.integers(2, 40)) * 50.0
        if any(r.start < end and start < r.end and set(r.devices) & set(devices) for r in reservations):
            continue
        reservations.append(Reservation(f"gpr:{i}", f"h{i}", "local", "h100", devices, start, end, f"h{i}'s"))
        on_node = max(sum(1 for n, _ in devices if n == name) for name, _ in devices)
        gpus = draw(st.sampled_from(["0.5", *map(str, range(1, on_node + 1))]))
        work = replace(job(f"hold:{i}", f"h{i}", gpus, seq=100 + i), preemptible=draw(st.booleans()))
        holders.append((work, draw(st.floats(0.0, start + 300.0))))
    others = []
    for n in range(draw(st.integers(0, 10))):
        gpus = draw(st.sampled_from(["0.5", "1", "2", "4"]))
        limit = draw(st.sampled_from([None, 100.0, 400.0, 1500.0]))
        work = replace(
            job(f"job:{n}", draw(st.sampled_from(["team-a", "team-b"])), gpus, draw(st.integers(1, 2)), seq=n),
            preemptible=draw(st.booleans()), checkpointable=draw(st.booleans()), max_runtime_s=limit,
        )  # fmt: skip
        others.append((work, draw(st.floats(0.0, 3000.0))))
    quotas = [ws("team-a", draw(st.sampled_from(["0", "2", "8"])), cohort="lab", can_borrow=True),
              ws("team-b", draw(st.sampled_from(["0", "2", "8"])), cohort="lab", can_borrow=True),
              *(ws(r.workspace, "0") for r in reservations)]  # fmt: skip
    runtimes = {w.key: draw(st.floats(50.0, 3000.0)) for w, _ in [*holders, *others]}
    return nodes, reservations, quotas, holders + others, runtimes, draw(st.sampled_from([0.0, 600.0]))


@settings(max_examples=120, deadline=None, database=None)
@given(worlds())
def test_reservations_hold_cycle_after_cycle(world) -> None:
    """No admission overlaps a reservation on its devices unless it is declared to end by the start
    or is preemptible and evicted by the start; the holder's job that fits gets its GPUs within one
    period and the grace of the start (or of its submission); no device is ever given twice."""
    nodes, reservations, quotas, submissions, runtimes, min_runtime_s = world
    made = Engine(tuple(quotas), tuple(nodes), Policy(grace_s=GRACE, min_runtime_s=min_runtime_s))
    made.set_reservations(reservations)
    work = {w.key: w for w, _ in submissions}
    waiting = sorted(submissions, key=lambda pair: pair[1])
    holding: dict[str, dict[tuple[str, int], Decimal]] = {}  # running: its shares per device
    ends: dict[str, float] = {}  # running: when it finishes
    admitted_at: dict[str, tuple[float, str | None, set[tuple[str, int]]]] = {}
    stopped_at: dict[str, float] = {}
    now = 0.0
    while now <= HORIZON:
        for key in sorted(k for k, end in ends.items() if end <= now):
            made.finish(key, now)
            del holding[key], ends[key]
            stopped_at[key] = now
        while waiting and waiting[0][1] <= now:
            made.submit(waiting.pop(0)[0])
        decisions = made.cycle(now)
        for preempt in decisions.preempted:
            del holding[preempt.key], ends[preempt.key]
            stopped_at[preempt.key] = now
        for admit in decisions.admitted:
            shares = holding[admit.key] = defaultdict(Decimal)
            for replica in admit.placement:
                for index, share in replica.devices:
                    shares[replica.node, index] += share
            limit = work[admit.key].max_runtime_s
            ends[admit.key] = now + min(runtimes[admit.key], limit if limit is not None else runtimes[admit.key])
            admitted_at[admit.key] = (now, admit.reservation, set(shares))
        given: dict[tuple[str, int], Decimal] = defaultdict(Decimal)
        for shares in holding.values():
            for spot, share in shares.items():
                given[spot] += share
        assert all(share <= 1 for share in given.values()), given
        now += PERIOD

    for key, (at, inside, spots) in admitted_at.items():
        workload = work[key]
        for r in reservations:
            if inside == r.key:
                assert workload.workspace == r.workspace and r.start <= at < r.end and spots <= set(r.devices)
            elif spots & set(r.devices) and at < r.end and workload.workspace != r.workspace:
                assert at < r.start, (key, r)
                stopped = stopped_at.get(key, HORIZON + 1) <= r.start
                limit = workload.max_runtime_s
                if inside is None:  # the ordinary way: it said it would end in time, or may be evicted
                    assert (limit is not None and at + limit <= r.start) or (workload.preemptible and stopped)
                else:  # in an earlier reservation: evicted by this one's start
                    assert stopped, (key, r)
    for (workload, submitted), r in zip(
        [pair for pair in submissions if pair[0].key.startswith("hold:")], reservations, strict=True
    ):
        due = max(submitted, r.start) + PERIOD + GRACE
        if due < r.end and due <= HORIZON:
            assert workload.key in admitted_at and admitted_at[workload.key][0] <= due, (workload, r)


def test_the_holders_work_waiting_for_its_reservation_says_so_and_is_estimated_to_start_when_it_begins() -> None:
    inside = job("job:1", "team-b", "2")  # no quota of its own: only the reservation can hold it
    theirs = replace(job("job:2", "team-a", "4"), preemptible=False)  # another workspace's: not its reservation
    decisions = schedule(Snapshot((ws("team-b", "0"), ws("team-a", "4")), (node("n1", "1", "1", "1", "1"),), (),
                                  (inside, theirs), 0.0, reservations=(LATER,)))  # fmt: skip

    pending = {p.key: p for p in decisions.pending}
    assert pending["job:1"].estimated_start == 1000.0
    assert pending["job:1"].reason.endswith(f"; it runs in {LABEL} once that begins, in 1000 s")
    assert "it runs in" not in pending["job:2"].reason
    assert pending["job:2"].estimated_start is None or pending["job:2"].estimated_start >= LATER.end
