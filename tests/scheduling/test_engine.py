"""The scheduling engine on plain data: unit tests, then properties over random snapshots."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from apps.scheduling.engine import (
    Admit,
    Device,
    NodeInfo,
    Quota,
    ReplicaPlacement,
    Snapshot,
    Workload,
    WorkspaceInfo,
    schedule,
)

D = Decimal


def ws(
    name: str,
    h100: str | None = None,
    *,
    borrowing_limit: str | None = None,
    lending_limit: str | None = None,
    cohort: str | None = None,
    can_borrow: bool = False,
) -> WorkspaceInfo:
    quotas = ()
    if h100 is not None:
        quotas = (
            Quota(
                "h100",
                D(h100),
                None if borrowing_limit is None else D(borrowing_limit),
                None if lending_limit is None else D(lending_limit),
            ),
        )
    return WorkspaceInfo(name, quotas, cohort, can_borrow)


def node(name: str, *free: str, cluster: str = "local", gpu_type: str = "h100") -> NodeInfo:
    return NodeInfo(name, cluster, gpu_type, tuple(Device(i, D(f)) for i, f in enumerate(free)))


def job(
    key: str, workspace: str, gpus: str, replicas: int = 1, *, priority: int = 0, seq: int = 0, gpu_type: str = "h100"
) -> Workload:
    return Workload(key, workspace, gpu_type, D(gpus), replicas, priority, seq)


def snapshot(workspaces=(), nodes=(), running=(), pending=()) -> Snapshot:
    return Snapshot(tuple(workspaces), tuple(nodes), tuple(running), tuple(pending))


def admitted_keys(decisions) -> list[str]:
    return [a.key for a in decisions.admitted]


def reasons(decisions) -> dict[str, str]:
    return {p.key: p.reason for p in decisions.pending}


# --- placement ------------------------------------------------------------------------------


def test_it_packs_a_fractional_share_onto_the_fullest_device_that_has_room() -> None:
    decisions = schedule(
        snapshot([ws("team-a", "8")], [node("n1", "1", "0.5", "0.75", "0.25")], pending=[job("job:1", "team-a", "0.5")])
    )
    assert decisions.admitted == [Admit("job:1", "local", (ReplicaPlacement("n1", ((1, D("0.5")),)),))]


def test_it_puts_two_halves_on_one_device_before_opening_another() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "8")],
            [node("n1", "1", "1")],
            pending=[job("job:1", "team-a", "0.5", seq=1), job("job:2", "team-a", "0.5", seq=2)],
        )
    )
    devices = [a.placement[0].devices for a in decisions.admitted]
    assert devices == [((0, D("0.5")),), ((0, D("0.5")),)]


def test_it_gives_whole_gpus_only_from_untouched_devices() -> None:
    decisions = schedule(
        snapshot([ws("team-a", "8")], [node("n1", "0.75", "1", "0.5", "1")], pending=[job("job:1", "team-a", "2")])
    )
    assert decisions.admitted[0].placement == (ReplicaPlacement("n1", ((1, D("1")), (3, D("1")))),)


def test_it_prefers_the_fuller_node() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "8")],
            [node("empty", "1", "1", "1", "1"), node("busy", "0", "1", "0", "1")],
            pending=[job("job:1", "team-a", "1")],
        )
    )
    assert decisions.admitted[0].placement[0].node == "busy"


def test_it_places_each_replica_of_a_gang_on_one_node() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "16")],
            [node("n1", "1", "1", "1", "1"), node("n2", "1", "1", "1", "1")],
            pending=[job("job:1", "team-a", "4", replicas=2)],
        )
    )
    [admit] = decisions.admitted
    assert sorted(p.node for p in admit.placement) == ["n1", "n2"]
    assert all(len(p.devices) == 4 for p in admit.placement)


def test_it_admits_a_gang_whole_or_not_at_all() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "16")],
            [node("n1", "1", "1", "1", "1"), node("n2", "1", "1", "1", "0")],
            pending=[job("job:1", "team-a", "4", replicas=2, seq=1), job("job:2", "team-a", "1", seq=2)],
        )
    )
    assert admitted_keys(decisions) == ["job:2"]
    assert reasons(decisions) == {"job:1": "waiting for 2 nodes with 4 free h100"}


def test_it_never_splits_a_gang_across_clusters() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "16")],
            [node("n1", "1", "1", cluster="east"), node("n2", "1", "1", cluster="west")],
            pending=[job("job:1", "team-a", "2", replicas=2)],
        )
    )
    assert decisions.admitted == []


def test_it_uses_only_nodes_of_the_asked_gpu_type() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "8")],
            [node("n1", "1", "1", gpu_type="a100")],
            pending=[job("job:1", "team-a", "1")],
        )
    )
    assert reasons(decisions) == {"job:1": "waiting for a node with 1 free h100"}


def test_it_admits_a_cpu_only_workload_without_a_placement() -> None:
    decisions = schedule(snapshot([ws("team-a")], [], pending=[job("instance:1", "team-a", "0", gpu_type="")]))
    assert decisions.admitted == [Admit("instance:1", None, ())]


# --- order ----------------------------------------------------------------------------------


def test_it_admits_higher_priority_first() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "8")],
            [node("n1", "1")],
            pending=[job("job:1", "team-a", "1", priority=0, seq=1), job("job:2", "team-a", "1", priority=10, seq=2)],
        )
    )
    assert admitted_keys(decisions) == ["job:2"]
    assert reasons(decisions) == {"job:1": "waiting for a node with 1 free h100"}


def test_it_admits_earlier_submissions_first_among_equal_priorities() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "8")],
            [node("n1", "1")],
            pending=[job("job:2", "team-a", "1", seq=20), job("job:1", "team-a", "1", seq=10)],
        )
    )
    assert admitted_keys(decisions) == ["job:1"]


def test_it_numbers_the_queue_per_cluster_and_per_workspace() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "8"), ws("team-b", "8")],
            [node("n1", "1")],
            pending=[
                job("job:1", "team-a", "1", seq=1),
                job("job:2", "team-b", "1", seq=2),
                job("job:3", "team-a", "1", seq=3),
                job("job:4", "team-b", "1", seq=4),
            ],
        )
    )
    assert admitted_keys(decisions) == ["job:1"]
    positions = [(p.key, p.cluster_position, p.workspace_position) for p in decisions.pending]
    assert positions == [("job:2", 1, 1), ("job:3", 2, 1), ("job:4", 3, 2)]


# --- quota and borrowing --------------------------------------------------------------------


def test_it_says_how_much_quota_is_in_use() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "4")],
            [node("n1", *["1"] * 8)],
            running=[job("job:1", "team-a", "4")],
            pending=[job("job:2", "team-a", "1")],
        )
    )
    assert reasons(decisions) == {"job:2": "waiting for quota: 4 of 4 h100 in use in workspace team-a, this needs 1"}


def test_it_counts_a_gang_against_the_quota_as_a_whole() -> None:
    decisions = schedule(
        snapshot(
            [ws("team-a", "4")],
            [node("n1", *["1"] * 8)],
            running=[job("job:1", "team-a", "0.5")],
            pending=[job("job:2", "team-a", "2", replicas=2)],
        )
    )
    assert reasons(decisions) == {"job:2": "waiting for quota: 0.5 of 4 h100 in use in workspace team-a, this needs 4"}


def test_it_treats_a_missing_quota_as_none() -> None:
    decisions = schedule(snapshot([ws("team-a")], [node("n1", "1")], pending=[job("job:1", "team-a", "0.25")]))
    assert reasons(decisions) == {"job:1": "waiting for quota: 0 of 0 h100 in use in workspace team-a, this needs 0.25"}


def _cohort(borrower: WorkspaceInfo, lender: WorkspaceInfo, running=(), pending=()) -> Snapshot:
    return snapshot([borrower, lender], [node("n1", *["1"] * 8), node("n2", *["1"] * 8)], running, pending)


def test_it_borrows_from_an_idle_cohort_member() -> None:
    decisions = schedule(
        _cohort(
            ws("team-a", "2", cohort="lab", can_borrow=True),
            ws("team-b", "4", cohort="lab"),
            pending=[job("job:1", "team-a", "6")],
        )
    )
    [admit] = decisions.admitted
    assert admit.key == "job:1"
    assert admit.borrowed == D("4")


def test_it_borrows_no_more_than_the_cohort_has_idle() -> None:
    decisions = schedule(
        _cohort(
            ws("team-a", "2", cohort="lab", can_borrow=True),
            ws("team-b", "4", cohort="lab"),
            running=[job("job:0", "team-b", "1")],
            pending=[job("job:1", "team-a", "6")],
        )
    )
    assert reasons(decisions) == {
        "job:1": "waiting for quota: 0 of 2 h100 in use in workspace team-a, this needs 6; "
        "cohort lab has 3 idle to lend"
    }


def test_it_does_not_borrow_without_permission() -> None:
    decisions = schedule(
        _cohort(ws("team-a", "2", cohort="lab"), ws("team-b", "4", cohort="lab"), pending=[job("job:1", "team-a", "3")])
    )
    assert decisions.admitted == []


def test_it_does_not_borrow_outside_a_cohort() -> None:
    decisions = schedule(
        _cohort(ws("team-a", "2", can_borrow=True), ws("team-b", "4"), pending=[job("job:1", "team-a", "3")])
    )
    assert decisions.admitted == []


def test_it_caps_borrowing_at_the_borrowing_limit() -> None:
    lender = ws("team-b", "8", cohort="lab")
    borrower = ws("team-a", "2", borrowing_limit="1", cohort="lab", can_borrow=True)
    assert admitted_keys(schedule(_cohort(borrower, lender, pending=[job("job:1", "team-a", "3")]))) == ["job:1"]
    decisions = schedule(_cohort(borrower, lender, pending=[job("job:1", "team-a", "4")]))
    assert reasons(decisions) == {
        "job:1": "waiting for quota: 0 of 2 h100 in use in workspace team-a, this needs 4 (borrowing limit 1)"
    }


def test_it_caps_borrowing_at_the_lenders_lending_limit() -> None:
    lender = ws("team-b", "8", lending_limit="2", cohort="lab")
    borrower = ws("team-a", "0", cohort="lab", can_borrow=True)
    assert admitted_keys(schedule(_cohort(borrower, lender, pending=[job("job:1", "team-a", "2")]))) == ["job:1"]
    decisions = schedule(_cohort(borrower, lender, pending=[job("job:1", "team-a", "3")]))
    assert reasons(decisions)["job:1"].endswith("; cohort lab has 2 idle to lend")


def test_it_counts_what_a_workspace_already_borrowed_against_the_lending_limit() -> None:
    lender = ws("team-b", "8", lending_limit="2", cohort="lab")
    borrower = ws("team-a", "0", cohort="lab", can_borrow=True)
    decisions = schedule(
        _cohort(borrower, lender, running=[job("job:0", "team-a", "2")], pending=[job("job:1", "team-a", "1")])
    )
    assert decisions.admitted == []
    assert reasons(decisions)["job:1"].endswith("; cohort lab has 0 idle to lend")


def test_it_counts_what_a_workspace_already_borrowed_against_the_cohorts_idle_quota() -> None:
    lender = ws("team-b", "4", cohort="lab")
    borrower = ws("team-a", "0", cohort="lab", can_borrow=True)
    decisions = schedule(
        _cohort(borrower, lender, running=[job("job:0", "team-a", "3")], pending=[job("job:1", "team-a", "2")])
    )
    assert decisions.admitted == []
    decisions = schedule(
        _cohort(borrower, lender, running=[job("job:0", "team-a", "3")], pending=[job("job:1", "team-a", "1")])
    )
    assert [(a.key, a.borrowed) for a in decisions.admitted] == [("job:1", D("1"))]


def test_it_shares_the_cohorts_idle_quota_between_borrowers_in_one_cycle() -> None:
    decisions = schedule(
        snapshot(
            [
                ws("team-a", "0", cohort="lab", can_borrow=True),
                ws("team-c", "0", cohort="lab", can_borrow=True),
                ws("team-b", "4", cohort="lab"),
            ],
            [node("n1", *["1"] * 8)],
            pending=[job("job:1", "team-a", "3", seq=1), job("job:2", "team-c", "3", seq=2)],
        )
    )
    assert admitted_keys(decisions) == ["job:1"]
    assert reasons(decisions)["job:2"].endswith("; cohort lab has 1 idle to lend")


def test_it_lets_a_lender_use_its_nominal_quota_although_it_is_lent() -> None:
    decisions = schedule(
        _cohort(
            ws("team-a", "0", cohort="lab", can_borrow=True),
            ws("team-b", "4", cohort="lab"),
            running=[job("job:0", "team-a", "4")],
            pending=[job("job:1", "team-b", "4")],
        )
    )
    assert [(a.key, a.borrowed) for a in decisions.admitted] == [("job:1", D("0"))]


# --- properties -----------------------------------------------------------------------------

# Weighted towards one GPU type, one cohort and free devices, where workloads contend.
GPU_TYPES = ("h100", "h100", "h100", "a100")
SHARES = [D("0"), D("0.25"), D("0.5"), D("0.75"), D("1"), D("1"), D("1")]
SIZES = [D("0.25"), D("0.5"), D("1"), D("2"), D("4")]
AMOUNTS = [D("0"), D("0.5"), D("1"), D("2"), D("3"), D("4"), D("8")]


@st.composite
def _quotas(draw: st.DrawFn) -> tuple[Quota, ...]:
    limits = st.sampled_from([None, None, *AMOUNTS])
    return tuple(
        Quota(gpu_type, draw(st.sampled_from(AMOUNTS)), draw(limits), draw(limits))
        for gpu_type in ("h100", "a100")
        if draw(st.sampled_from([True, True, False]))
    )


@st.composite
def snapshots(draw: st.DrawFn, *, one_cohort: bool = False) -> Snapshot:
    """Random snapshots; `one_cohort` puts every workspace in one cohort on one GPU type, to exercise borrowing."""
    gpu_types = ("h100",) if one_cohort else GPU_TYPES
    cohorts = ["lab"] if one_cohort else [None, "lab", "lab", "lab", "dept"]
    names = [f"w{i}" for i in range(draw(st.integers(2, 4)))]
    workspaces = tuple(
        WorkspaceInfo(name, draw(_quotas()), draw(st.sampled_from(cohorts)), draw(st.sampled_from([False, True, True])))
        for name in names
    )
    nodes = tuple(
        NodeInfo(
            f"n{i}",
            draw(st.sampled_from(["east", "west"])),
            draw(st.sampled_from(gpu_types)),
            tuple(Device(d, draw(st.sampled_from(SHARES))) for d in range(draw(st.integers(1, 8)))),
        )
        for i in range(draw(st.integers(1, 5)))
    )

    def workloads(prefix: str, count: int) -> tuple[Workload, ...]:
        return tuple(
            Workload(
                key=f"{prefix}:{i}",
                workspace=draw(st.sampled_from(names)),
                gpu_type=draw(st.sampled_from(gpu_types)),
                gpus_per_replica=draw(st.sampled_from([D("0"), *SIZES, D("0.25"), D("0.5"), D("1")])),
                replicas=draw(st.sampled_from([1, 1, 1, 2, 3])),
                priority=draw(st.sampled_from([0, 0, 1, 5])),
                seq=draw(st.integers(0, 20)),
            )
            for i in range(count)
        )

    running = workloads("running", draw(st.integers(0, 4)))
    pending = workloads("job", draw(st.integers(1, 10)))
    return Snapshot(workspaces, nodes, running, pending)


PROPERTY = settings(max_examples=200, deadline=None, database=None)


@PROPERTY
@given(snapshots(), st.randoms(use_true_random=False))
def test_it_decides_the_same_whatever_the_input_order(snap: Snapshot, random) -> None:
    def shuffled(items: tuple) -> tuple:
        items = list(items)
        random.shuffle(items)
        return tuple(items)

    again = Snapshot(shuffled(snap.workspaces), shuffled(snap.nodes), shuffled(snap.running), shuffled(snap.pending))
    assert schedule(snap) == schedule(snap)
    assert schedule(again) == schedule(snap)


@PROPERTY
@given(snapshots())
def test_it_decides_on_every_pending_workload_once(snap: Snapshot) -> None:
    decisions = schedule(snap)
    keys = [a.key for a in decisions.admitted] + [p.key for p in decisions.pending]
    assert sorted(keys) == sorted(w.key for w in snap.pending)


@PROPERTY
@given(snapshots())
def test_it_places_a_gang_whole_each_replica_on_one_node(snap: Snapshot) -> None:
    pending = {w.key: w for w in snap.pending}
    nodes = {n.name: n for n in snap.nodes}
    for admit in schedule(snap).admitted:
        workload = pending[admit.key]
        if workload.gpus_per_replica == 0:
            assert admit.placement == ()
            continue
        assert len(admit.placement) == workload.replicas
        for replica in admit.placement:
            placed_on = nodes[replica.node]
            assert placed_on.cluster == admit.cluster
            assert placed_on.gpu_type == workload.gpu_type
            indexes = [index for index, _ in replica.devices]
            assert len(set(indexes)) == len(indexes)
            assert sum(share for _, share in replica.devices) == workload.gpus_per_replica
            if workload.gpus_per_replica >= 1:
                assert all(share == 1 for _, share in replica.devices)


@PROPERTY
@given(snapshots())
def test_it_never_over_allocates_a_device(snap: Snapshot) -> None:
    placed: dict[tuple[str, int], Decimal] = defaultdict(Decimal)
    for admit in schedule(snap).admitted:
        for replica in admit.placement:
            for index, share in replica.devices:
                assert share > 0
                placed[replica.node, index] += share
    free = {(n.name, d.index): d.free for n in snap.nodes for d in n.devices}
    for device, share in placed.items():
        assert share <= free[device], device


def _idle_to_lend(quota: Quota, used: Decimal) -> Decimal:
    idle = max(D("0"), quota.nominal - used)
    return idle if quota.lending_limit is None else min(idle, quota.lending_limit)


@PROPERTY
@given(snapshots() | snapshots(one_cohort=True))
def test_it_keeps_every_workspace_within_its_quota_and_what_it_may_borrow(snap: Snapshot) -> None:
    """Replays the admissions in order against a ledger of our own."""
    workspaces = {w.name: w for w in snap.workspaces}
    pending = {w.key: w for w in snap.pending}
    used: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for running in snap.running:
        used[running.workspace, running.gpu_type] += running.total_gpus
    for admit in schedule(snap).admitted:
        workload = pending[admit.key]
        if workload.gpus_per_replica == 0:
            continue
        ws, gpu_type = workspaces[workload.workspace], workload.gpu_type
        quota = ws.quota(gpu_type)
        before = used[ws.name, gpu_type]
        used[ws.name, gpu_type] += workload.total_gpus
        after = used[ws.name, gpu_type]
        assert admit.borrowed == max(D("0"), after - quota.nominal) - max(D("0"), before - quota.nominal)
        if after <= quota.nominal:
            continue
        assert ws.can_borrow and ws.cohort is not None
        if quota.borrowing_limit is not None:
            assert after - quota.nominal <= quota.borrowing_limit
        cohort = [m for m in snap.workspaces if m.cohort == ws.cohort]
        borrowed = sum((max(D("0"), used[m.name, gpu_type] - m.quota(gpu_type).nominal) for m in cohort), D("0"))
        lendable = sum((_idle_to_lend(m.quota(gpu_type), used[m.name, gpu_type]) for m in cohort), D("0"))
        assert borrowed <= lendable


@PROPERTY
@given(snapshots())
def test_it_gives_every_waiting_workload_a_reason_and_its_positions(snap: Snapshot) -> None:
    workspace_of = {w.key: w.workspace for w in snap.pending}
    per_workspace: dict[str, int] = defaultdict(int)
    for position, waiting in enumerate(schedule(snap).pending, start=1):
        per_workspace[workspace_of[waiting.key]] += 1
        assert waiting.reason
        assert waiting.cluster_position == position
        assert waiting.workspace_position == per_workspace[workspace_of[waiting.key]]


def _replicas_that_fit(nodes: tuple[NodeInfo, ...], gpus_per_replica: Decimal) -> int:
    """How many replicas of one size an idle cluster holds (each node and device is independent)."""
    if gpus_per_replica < 1:
        return sum(int(d.free / gpus_per_replica) for n in nodes for d in n.devices)
    return sum(sum(1 for d in n.devices if d.free == 1) // int(gpus_per_replica) for n in nodes)


@PROPERTY
@given(
    st.lists(st.integers(1, 8), min_size=1, max_size=4),
    st.sampled_from(SIZES),
    st.integers(1, 6),
    st.booleans(),
)
def test_it_admits_a_workload_that_fits_alone_in_an_empty_cluster(
    devices_per_node: list[int], size: Decimal, replicas: int, enough_quota: bool
) -> None:
    nodes = tuple(node(f"n{i}", *["1"] * count) for i, count in enumerate(devices_per_node))
    workload = job("job:1", "team-a", str(size), replicas)
    quota = workload.total_gpus if enough_quota else workload.total_gpus - D("0.25")
    decisions = schedule(snapshot([ws("team-a", str(quota))], nodes, pending=[workload]))
    fits = enough_quota and _replicas_that_fit(nodes, size) >= replicas
    assert admitted_keys(decisions) == (["job:1"] if fits else [])
