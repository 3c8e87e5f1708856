"""The autoscaler's decisions, pure: nodes started for pending work that fits no running node (gangs
by shape, quotas kept), for reservations about to begin; never above the pool's maximum; idle nodes
stopped after the delay, never below the minimum, never one with work, never one a reservation holds;
and over random pools, none of these ever broken."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from apps.scheduling.autoscale import Change, ElasticNode, ElasticPool, decide
from apps.scheduling.types import Reservation, Snapshot
from tests.scheduling.builders import ws
from tests.scheduling.test_engine import job, node

MIN = 60.0


def pool(*nodes: ElasticNode, min_nodes: int = 0, max_nodes: int = 4, delay_s: float = 600.0) -> ElasticPool:
    return ElasticPool("pool:1", "slurm", "h100", tuple(nodes), min_nodes, max_nodes, delay_s, 4)


def up(name: str, *, busy: bool = False, idle_since: float | None = None) -> ElasticNode:
    return ElasticNode(name, name, "up", busy, idle_since)


def down(name: str) -> ElasticNode:
    return ElasticNode(name, name, "down", False)


def cluster(names_up: list[str], names_down: list[str], used: dict[str, int] | None = None) -> tuple:
    """The snapshot's nodes: up ones with their free devices, down ones with none free (as the
    portal shows a node that is not ready)."""
    used = used or {}
    made = [node(n, *(["0"] * used.get(n, 0) + ["1"] * (4 - used.get(n, 0))), cluster="slurm") for n in names_up]
    made += [node(n, "0", "0", "0", "0", cluster="slurm") for n in names_down]
    return tuple(made)


def snap(nodes: tuple, pending: tuple = (), quota: str = "16", reservations: tuple = ()) -> Snapshot:
    return Snapshot((ws("team-b", quota),), nodes, (), pending, 1000.0, reservations=reservations)


def gang(key: str, replicas: int) -> object:
    return replace(job(key, "team-b", "4", replicas), cluster="slurm")


def test_a_gang_that_fits_no_running_node_starts_as_many_nodes_as_its_shape_needs() -> None:
    decided = decide(snap(cluster(["n1"], ["n2", "n3", "n4"]), (gang("job:1", 3),)),
                     [pool(up("n1", idle_since=0.0), down("n2"), down("n3"), down("n4"))], 1000.0)  # fmt: skip
    assert decided == [Change("pool:1", "up", ("n2", "n3"),
                              "adding 2 nodes (n2, n3) to h100 on slurm for 1 pending workload of team-b",
                              ("job:1",))]  # fmt: skip


def test_work_that_fits_a_running_node_or_that_quota_refuses_starts_nothing() -> None:
    fits = replace(job("job:1", "team-b", "2"), cluster="slurm")
    assert decide(snap(cluster(["n1"], ["n2"]), (fits,)), [pool(up("n1"), down("n2"))], 1000.0) == []
    too_much = gang("job:2", 2)  # 8 GPUs, quota 4: more nodes would not admit it
    assert decide(snap(cluster(["n1"], ["n2"], {"n1": 4}), (too_much,), quota="4"),
                  [pool(up("n1", busy=True), down("n2"))], 1000.0) == []  # fmt: skip


def test_never_above_the_maximum_and_nothing_when_the_budget_is_spent() -> None:
    nodes = (up("n1", busy=True), down("n2"), down("n3"), down("n4"))
    shot = snap(cluster(["n1"], ["n2", "n3", "n4"], {"n1": 4}), (gang("job:1", 1), gang("job:2", 1), gang("job:3", 1)))
    [change] = decide(shot, [pool(*nodes, max_nodes=3)], 1000.0)
    assert change.nodes == ("n2", "n3")  # 1 up + 2 = the maximum of 3
    assert decide(shot, [replace(pool(*nodes), may_grow=False)], 1000.0) == []


def test_a_node_already_starting_is_not_started_again_for_the_same_work() -> None:
    starting = ElasticNode("n2", "n2", "powering_up", False)
    shot = snap(cluster(["n1"], ["n2", "n3"], {"n1": 4}), (gang("job:1", 1),))
    assert decide(shot, [pool(up("n1", busy=True), starting, down("n3"))], 1000.0) == []


def test_nodes_of_a_reservation_about_to_begin_are_started_and_kept() -> None:
    soon = Reservation("gpr:1", "team-b", "slurm", "h100", (("n2", 0), ("n2", 1)), 1300.0, 9000.0, "team-b's")
    [change] = decide(snap(cluster(["n1"], ["n2"]), reservations=(soon,)), [pool(up("n1"), down("n2"))], 1000.0)
    assert change.nodes == ("n2",) and change.reason.endswith("for a reservation about to begin")
    held = snap(cluster(["n1", "n2"], []), reservations=(soon,))
    empty_long = pool(up("n1", idle_since=0.0), up("n2", idle_since=0.0))
    assert [c.nodes for c in decide(held, [empty_long], 1000.0)] == [("n1",)]  # n2 is held: it stays


def test_idle_nodes_stop_after_the_delay_above_the_minimum_and_never_with_work() -> None:
    nodes = (up("n1", idle_since=0.0), up("n2", idle_since=900.0), up("n3", busy=True), up("n4", idle_since=100.0))
    shot = snap(cluster(["n1", "n2", "n3", "n4"], [], {"n3": 4}))
    [change] = decide(shot, [pool(*nodes, min_nodes=2)], 1000.0)
    assert change.action == "down" and change.nodes == ("n1", "n4")  # n2 empty for 100 s only; n3 works
    assert change.reason == "removing 2 nodes from h100 on slurm: empty for 15 min, above the minimum of 2"
    assert decide(shot, [pool(*nodes, min_nodes=3)], 1000.0)[0].nodes == ("n1",)
    assert decide(shot, [pool(*nodes, min_nodes=4)], 1000.0) == []


@settings(max_examples=150, deadline=None)
@given(
    states=st.lists(st.sampled_from(["up", "busy", "down", "starting"]), min_size=1, max_size=6),
    idle=st.lists(st.floats(0, 2000), min_size=6, max_size=6),
    gangs=st.lists(st.integers(1, 4), max_size=4),
    bounds=st.tuples(st.integers(0, 6), st.integers(0, 6)),
)
def test_no_decision_breaks_the_bounds_or_stops_a_busy_node(states, idle, gangs, bounds) -> None:
    low, high = min(bounds), max(bounds)
    names = [f"n{i}" for i in range(len(states))]
    nodes = []
    for name, state, since in zip(names, states, idle, strict=False):
        if state == "down":
            nodes.append(down(name))
        elif state == "starting":
            nodes.append(ElasticNode(name, name, "powering_up", False))
        else:
            nodes.append(up(name, busy=state == "busy", idle_since=None if state == "busy" else since))
    ups = [n for n, s in zip(names, states, strict=True) if s in ("up", "busy")]
    downs = [n for n, s in zip(names, states, strict=True) if s in ("down", "starting")]
    used = {n: 4 for n, s in zip(names, states, strict=True) if s == "busy"}
    pending = tuple(gang(f"job:{i}", r) for i, r in enumerate(gangs))
    the_pool = pool(*nodes, min_nodes=low, max_nodes=high)
    for change in decide(snap(cluster(ups, downs, used), pending, quota="64"), [the_pool], 2000.0):
        running = sum(1 for s in states if s in ("up", "busy", "starting"))
        if change.action == "up":
            assert running + len(change.nodes) <= high
            assert all(states[names.index(n)] == "down" for n in change.nodes)
        else:
            assert running - len(change.nodes) >= low
            assert all(states[names.index(n)] == "up" for n in change.nodes)
            assert all(2000.0 - idle[names.index(n)] >= 600.0 for n in change.nodes)


def test_running_nodes_are_filled_before_any_is_started_whatever_the_names() -> None:
    # The stopped nodes' names sort before the running one's: still, one node is started, not two.
    shot = snap(cluster(["z9"], ["a1", "a2"]), (gang("job:1", 2),))
    [change] = decide(shot, [pool(up("z9", idle_since=0.0), down("a1"), down("a2"))], 1000.0)
    assert change.nodes == ("a1",)


def test_an_empty_node_that_pending_work_will_be_placed_on_is_not_stopped() -> None:
    # n2 came up for the gang a moment ago and the cycle has not admitted it yet: n2 stays, even
    # with no delay at all; n3, which nothing needs, stops.
    shot = snap(cluster(["n1", "n2", "n3"], [], {"n1": 4}), (gang("job:1", 1),))
    nodes = (up("n1", busy=True), up("n2", idle_since=990.0), up("n3", idle_since=990.0))
    [change] = decide(shot, [pool(*nodes, delay_s=0.0)], 1000.0)
    assert change.action == "down" and change.nodes == ("n3",)
