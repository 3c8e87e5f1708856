"""Estimated starts follow the nodes for work of several whole devices: a gang starts when one node
has its devices free, not when enough GPUs are free across the cluster; a gang that has starved has
nodes held for it, as the portal holds them, which other work does not take; and a workspace with
no work waiting keeps what it uses within its nominal quota for its next work, which goes before
any borrower, for as long again as the work that ended ran."""

from __future__ import annotations

from decimal import Decimal

from apps.scheduling.engine import Device, NodeInfo, Policy, ReplicaPlacement, Snapshot, Workload, schedule
from tests.scheduling.builders import ws

D = Decimal
NOW = 50_000.0


def running(key: str, workspace: str, node: str, devices: range, ends_in: float) -> Workload:
    placement = (ReplicaPlacement(node, tuple((i, D(1)) for i in devices)),)
    return Workload(
        key, workspace, "h100", D(len(devices)), started_at=NOW - 100, expected_runtime_s=100 + ends_in,
        cluster="local", placement=placement,
    )  # fmt: skip


def job(key: str, workspace: str, seq: int, gpus: int = 1, waited: float = 0.0) -> Workload:
    return Workload(
        key, workspace, "h100", D(gpus), seq=seq, submitted_at=NOW - waited, expected_runtime_s=10_000.0
    )  # fmt: skip


def estimates(
    workspaces: tuple, nodes: int, run: tuple[Workload, ...], pending: tuple[Workload, ...]
) -> dict[str, float | None]:
    """Nodes of 4 devices, every device held by `run`."""
    infos = tuple(NodeInfo(f"n{n}", "local", "h100", tuple(Device(i, D(0)) for i in range(4))) for n in range(nodes))
    snapshot = Snapshot(workspaces, infos, run, pending, NOW, Policy(preemption=False))
    return {p.key: p.estimated_start for p in schedule(snapshot).pending}


def test_a_gang_waits_for_one_node_with_its_devices_free() -> None:
    run = (
        running("run:1", "team", "n0", range(2), ends_in=100.0),
        running("run:2", "team", "n0", range(2, 4), ends_in=1_000.0),
        running("run:3", "team", "n1", range(2), ends_in=200.0),
        running("run:4", "team", "n1", range(2, 4), ends_in=2_000.0),
    )

    said = estimates((ws("team", "8"),), 2, run, (job("job:gang", "team", seq=1, gpus=4),))

    # Four GPUs are free from +200 (two on each node), four on one node from +1,000.
    assert said == {"job:gang": NOW + 1_000}


def test_a_starving_gang_has_a_node_held_that_smaller_work_does_not_take() -> None:
    ends = {"n0": (100.0, 100.0, 300.0, 400.0), "n1": (100.0, 100.0, 200.0, 500.0)}
    run = tuple(
        running(f"run:{node}-{i}", "other", node, range(i, i + 1), ends_in=end)
        for node, node_ends in ends.items()
        for i, end in enumerate(node_ends)
    )
    pending = (
        job("job:gang", "team", seq=1, gpus=4, waited=7_200.0),  # past starvation_s (an hour)
        *(job(f"job:{i}", "team", seq=2 + i) for i in range(5)),
    )

    said = estimates((ws("team", "8"), ws("other", "0")), 2, run, pending)

    # At +100 four GPUs are free, two on each node: none fits the gang, so n0 is held for it. The
    # single GPUs take n1's (+100, +100, +200, +500) and wait for the first of them to end; the gang
    # starts on n0 once it is free (+400).
    assert said["job:gang"] == NOW + 400
    assert [said[f"job:{i}"] for i in range(5)] == [NOW + 100, NOW + 100, NOW + 200, NOW + 500, NOW + 10_100]


def test_a_workspace_with_no_work_waiting_keeps_its_quota_for_its_next_work() -> None:
    lab = (ws("team-a", "4", cohort="lab"), ws("team-b", "4", cohort="lab", can_borrow=True))
    run = (
        *(running(f"run:a{i}", "team-a", "n0", range(i, i + 1), ends_in=100.0) for i in range(4)),
        running("run:b", "team-b", "n1", range(4), ends_in=5_000.0),
    )

    said = estimates(lab, 2, run, (job("job:b", "team-b", seq=1),))

    # team-a's GPUs free at +100 go to its next work, within its quota, which runs as long as they
    # did (200 s); team-b's job, borrowing, starts when they are free again.
    assert said == {"job:b": NOW + 300}
