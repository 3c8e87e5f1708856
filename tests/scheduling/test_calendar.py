"""The capacity calendar: the earliest slot for a reservation, unit cases, then properties over random
calendars."""

from __future__ import annotations

import math
from dataclasses import replace
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from apps.scheduling.calendar import Slot, earliest_start, fits_calendar, overlapping
from apps.scheduling.types import Device, NodeInfo, ReplicaPlacement, Reservation, Workload

HOUR = 3600.0


def node(name: str, devices: int, *, cluster: str = "east", gpu_type: str = "h100") -> NodeInfo:
    return NodeInfo(name, cluster, gpu_type, tuple(Device(i, Decimal(1)) for i in range(devices)))


def booked(key: str, devices, start: float, end: float, *, cluster: str = "east") -> Reservation:
    return Reservation(key, "team-b", cluster, "h100", tuple(devices), start, end)


def running(key: str, devices, *, preemptible: bool = False, max_runtime_s: float | None = None) -> Workload:
    placement = tuple(ReplicaPlacement(n, ((i, Decimal(1)),)) for n, i in devices)
    return Workload(key, "team-a", "h100", Decimal(1), len(placement), preemptible=preemptible, started_at=0.0,
                    max_runtime_s=max_runtime_s, cluster="east", placement=placement)  # fmt: skip


def slot(gpus: int, *, nodes, reservations=(), running=(), duration_s=HOUR, not_before=0.0, whole_nodes=False,
         cluster: str | None = None) -> Slot | None:  # fmt: skip
    return earliest_start(gpus=gpus, gpu_type="h100", cluster=cluster, duration_s=duration_s, not_before=not_before,
                          nodes=nodes, reservations=reservations, running=running, whole_nodes=whole_nodes)  # fmt: skip


N1 = [("n1", i) for i in range(4)]


def test_it_starts_at_once_on_an_empty_cluster_packing_one_node() -> None:
    found = slot(2, nodes=[node("n1", 4), node("n2", 2)], not_before=100.0)
    assert found == Slot(100.0, 100.0 + HOUR, "east", (("n2", 0), ("n2", 1)))  # the smaller node that holds it


def test_it_takes_the_fewest_nodes_the_largest_first_then_the_smallest_that_holds_the_rest() -> None:
    found = slot(6, nodes=[node("n1", 2), node("n2", 4), node("n3", 4)])
    assert found is not None and found.devices == (*(("n2", i) for i in range(4)), ("n1", 0), ("n1", 1))


def test_it_waits_for_the_end_of_the_reservation_in_its_way() -> None:
    reservations = [booked("gpr:1", N1[:3], 0.0, 5 * HOUR)]
    found = slot(2, nodes=[node("n1", 4)], reservations=reservations)
    assert found is not None and found.start == 5 * HOUR


def test_it_fits_before_a_later_reservation_when_the_window_ends_in_time() -> None:
    reservations = [booked("gpr:1", N1, 2 * HOUR, 3 * HOUR)]
    assert slot(4, nodes=[node("n1", 4)], reservations=reservations, duration_s=2 * HOUR).start == 0.0
    assert slot(4, nodes=[node("n1", 4)], reservations=reservations, duration_s=2 * HOUR + 1).start == 3 * HOUR


def test_non_preemptible_work_blocks_until_its_declared_end_and_preemptible_work_not_at_all() -> None:
    nodes = [node("n1", 2)]
    assert slot(2, nodes=nodes, running=[running("job:1", N1[:1], max_runtime_s=HOUR)]).start == HOUR
    assert slot(2, nodes=nodes, running=[running("job:1", N1[:1], preemptible=True)]).start == 0.0
    assert slot(2, nodes=nodes, running=[running("job:1", N1[:1])]) is None  # no declared end: never free


def test_it_is_none_when_the_cluster_could_never_hold_it() -> None:
    assert slot(5, nodes=[node("n1", 4)]) is None
    assert slot(2, nodes=[node("n1", 4, gpu_type="a100")]) is None
    assert slot(2, nodes=[node("n1", 4)], cluster="west") is None


def test_whole_nodes_picks_nodes_with_every_device_free_and_all_of_them() -> None:
    reservations = [booked("gpr:1", [("n2", 0)], 0.0, HOUR)]
    found = slot(3, nodes=[node("n1", 4), node("n2", 4)], reservations=reservations, whole_nodes=True)
    assert found == Slot(0.0, HOUR, "east", tuple(N1))
    found = slot(6, nodes=[node("n1", 4), node("n2", 4)], reservations=reservations, whole_nodes=True)
    assert found is not None and found.start == HOUR and found.gpus == 8


def test_it_picks_the_first_cluster_by_name_at_the_same_start() -> None:
    found = slot(2, nodes=[node("w1", 2, cluster="west"), node("e1", 2, cluster="east")])
    assert found is not None and found.cluster == "east"


def test_fits_calendar_ignores_the_reservation_itself_and_finds_clashes() -> None:
    nodes = [node("n1", 4)]
    mine = booked("gpr:1", N1[:2], 0.0, HOUR)
    other = booked("gpr:2", N1[1:3], HOUR - 1, 2 * HOUR)
    assert fits_calendar(mine, nodes=nodes, reservations=[mine], running=[])
    assert not fits_calendar(mine, nodes=nodes, reservations=[mine, other], running=[])
    assert overlapping([mine, other], cluster="east", devices=N1[:2], start=0.0, end=HOUR, ignore="gpr:1") == [other]
    assert not fits_calendar(replace(mine, devices=(("n1", 7),)), nodes=nodes, reservations=[], running=[])
    assert not fits_calendar(mine, nodes=nodes, reservations=[], running=[running("job:1", N1[:1])])


# --- properties ----------------------------------------------------------------------------------


@st.composite
def calendars(draw):
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    nodes = [node(f"n{i}", size) for i, size in enumerate(sizes)]
    spots = [(f"n{i}", d) for i, size in enumerate(sizes) for d in range(size)]
    reservations = []
    for i in range(draw(st.integers(0, 5))):
        devices = draw(st.sets(st.sampled_from(spots), min_size=1, max_size=len(spots)))
        start = draw(st.integers(0, 20)) * 600.0
        reservations.append(booked(f"gpr:{i}", sorted(devices), start, start + draw(st.integers(1, 20)) * 600.0))
    work = []
    for i in range(draw(st.integers(0, 3))):
        devices = draw(st.sets(st.sampled_from(spots), min_size=1, max_size=2))
        limit = draw(st.sampled_from([None, 1800.0, 7200.0]))
        work.append(running(f"job:{i}", sorted(devices), preemptible=draw(st.booleans()), max_runtime_s=limit))
    gpus = draw(st.integers(1, sum(sizes) + 1))
    asked = {"gpus": gpus, "duration_s": draw(st.integers(1, 12)) * 600.0,
             "not_before": draw(st.integers(0, 6)) * 300.0, "whole_nodes": draw(st.booleans())}  # fmt: skip
    return nodes, reservations, work, asked


def free_over(nodes, reservations, work, start: float, end: float) -> set[tuple[str, int]]:
    """The devices no reservation holds in [start, end) and no non-preemptible work holds after start."""
    free = {(n.name, d.index) for n in nodes for d in n.devices}
    for r in reservations:
        if r.start < end and r.end > start:
            free -= set(r.devices)
    for w in work:
        if not w.preemptible and (w.max_runtime_s is None or w.started_at + w.max_runtime_s > start):
            free -= {(p.node, i) for p in w.placement for i, _ in p.devices}
    return free


def possible_at(nodes, reservations, work, asked, start: float) -> bool:
    free = free_over(nodes, reservations, work, start, start + asked["duration_s"])
    if asked["whole_nodes"]:
        return sum(len(n.devices) for n in nodes if all((n.name, d.index) in free for d in n.devices)) >= asked["gpus"]
    return len(free) >= asked["gpus"]


@settings(max_examples=300, deadline=None, database=None)
@given(calendars())
def test_the_slot_is_free_earliest_among_candidates_and_none_only_when_impossible(calendar) -> None:
    nodes, reservations, work, asked = calendar
    found = slot(asked["gpus"], nodes=nodes, reservations=reservations, running=work, duration_s=asked["duration_s"],
                 not_before=asked["not_before"], whole_nodes=asked["whole_nodes"])  # fmt: skip
    candidates = sorted(
        {
            asked["not_before"],
            *(r.end for r in reservations),
            *(w.started_at + w.max_runtime_s for w in work if w.max_runtime_s is not None),
        }  # fmt: skip
    )
    candidates = [c for c in candidates if c >= asked["not_before"]]
    feasible = [c for c in candidates if possible_at(nodes, reservations, work, asked, c)]
    if found is None:  # not even once every reservation and declared end is past
        assert not feasible
        assert not possible_at(nodes, reservations, work, asked, max(candidates) + 1.0)
        return
    assert found.start == feasible[0]
    assert found.end == found.start + asked["duration_s"]
    assert len(set(found.devices)) == found.gpus >= asked["gpus"]
    assert set(found.devices) <= free_over(nodes, reservations, work, found.start, found.end)
    assert not overlapping(reservations, cluster="east", devices=found.devices, start=found.start, end=found.end)
    if asked["whole_nodes"]:
        chosen = {n for n, _ in found.devices}
        assert set(found.devices) == {(n.name, d.index) for n in nodes if n.name in chosen for d in n.devices}
    else:
        assert found.gpus == asked["gpus"]
        made = Reservation("gpr:new", "team-c", "east", "h100", found.devices, found.start, found.end)
        assert fits_calendar(made, nodes=nodes, reservations=reservations, running=work)


@settings(max_examples=100, deadline=None, database=None)
@given(calendars())
def test_slots_booked_one_after_another_never_double_book_a_device(calendar) -> None:
    nodes, _, work, asked = calendar
    booked_so_far: list[Reservation] = []
    for i in range(4):
        found = slot(asked["gpus"], nodes=nodes, reservations=booked_so_far, running=work,
                     duration_s=asked["duration_s"], whole_nodes=asked["whole_nodes"])  # fmt: skip
        if found is None:
            break
        booked_so_far.append(Reservation(f"gpr:{i}", "team-c", "east", "h100", found.devices, found.start, found.end))
    for a in booked_so_far:
        assert not overlapping(booked_so_far, cluster="east", devices=a.devices, start=a.start, end=a.end, ignore=a.key)
    assert all(r.end < math.inf for r in booked_so_far)
