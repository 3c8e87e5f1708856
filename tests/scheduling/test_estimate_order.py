"""Estimated starts follow the order in which the portal admits, not the order of the line: the
workspace furthest below its fair share goes first, work within its nominal quota before work that
borrows, and work that fits starts before work ahead of it that does not."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.scheduling import engine as engine_module
from apps.scheduling import estimates as estimates_module
from apps.scheduling.engine import Device, Engine, NodeInfo, Policy, ReplicaPlacement, Snapshot, Workload, schedule
from apps.scheduling.estimates import StartEstimates
from tests.scheduling.builders import ws

D = Decimal
NOW = 50_000.0


def running(key: str, workspace: str, devices: range, ends_in: float) -> Workload:
    placement = (ReplicaPlacement("n1", tuple((i, D(1)) for i in devices)),)
    return Workload(
        key, workspace, "h100", D(len(devices)), started_at=NOW - 100, expected_runtime_s=100 + ends_in,
        cluster="local", placement=placement,
    )  # fmt: skip


def estimates(workspaces: tuple, run: tuple[Workload, ...], pending: tuple[Workload, ...]) -> dict[str, float | None]:
    node = NodeInfo("n1", "local", "h100", tuple(Device(i, D(0)) for i in range(8)))  # all 8 held by `run`
    snapshot = Snapshot(workspaces, (node,), run, pending, NOW, Policy(preemption=False))
    return {p.key: p.estimated_start for p in schedule(snapshot).pending}


def job(key: str, workspace: str, seq: int, gpus: int = 1) -> Workload:
    return Workload(key, workspace, "h100", D(gpus), seq=seq, submitted_at=NOW, expected_runtime_s=1_000.0)


def test_the_workspace_with_the_lower_share_gets_the_next_free_gpu_although_it_is_later_in_line() -> None:
    lab = (  # team-a and team-b have no quota of their own: all they run is borrowed from team-c's
        ws("team-a", "0", cohort="lab", can_borrow=True),
        ws("team-b", "0", cohort="lab", can_borrow=True),
        ws("team-c", "8", cohort="lab"),
    )
    said = estimates(
        lab,
        (running("run:a", "team-a", range(7), ends_in=900.0), running("run:b", "team-b", range(7, 8), ends_in=60.0)),
        (job("job:a", "team-a", seq=1), job("job:b", "team-b", seq=2)),
    )

    # When run:b ends, team-b holds nothing and team-a 7 of 8 GPUs: team-b's job goes first.
    assert said == {"job:a": NOW + 900, "job:b": NOW + 60}


def test_past_use_counts_in_the_share() -> None:
    lab = (
        ws("team-a", "1", cohort="lab", can_borrow=True),
        ws("team-b", "1", cohort="lab", can_borrow=True, history=1e9),  # used a great deal lately
        ws("team-c", "6", cohort="lab"),
    )
    said = estimates(
        lab,
        (running("run:a", "team-a", range(4), ends_in=60.0), running("run:c", "team-c", range(4, 8), ends_in=900.0)),
        (job("job:b", "team-b", seq=1), job("job:a", "team-a", seq=2)),
    )

    assert said == {"job:a": NOW + 60, "job:b": NOW + 60}  # one GPU each of the four run:a frees
    said = estimates(
        lab,
        (running("run:a", "team-a", range(1), ends_in=60.0), running("run:c", "team-c", range(1, 8), ends_in=900.0)),
        (job("job:b", "team-b", seq=1), job("job:a", "team-a", seq=2)),
    )

    assert said == {"job:a": NOW + 60, "job:b": NOW + 900}  # the one GPU goes to team-a, which used less


def test_work_within_its_nominal_quota_goes_before_work_that_borrows_whatever_the_shares() -> None:
    lab = (
        ws("team-a", "6", cohort="lab", can_borrow=True),
        ws("team-b", "0", cohort="lab", can_borrow=True),
        ws("team-c", "2", cohort="lab"),
    )
    said = estimates(
        lab,
        (
            running("run:a", "team-a", range(5), ends_in=900.0),
            running("run:c1", "team-c", range(5, 6), ends_in=60.0),
            running("run:c2", "team-c", range(6, 8), ends_in=900.0),
        ),
        (job("job:b", "team-b", seq=1), job("job:a", "team-a", seq=2)),
    )

    # When run:c1 ends, team-a (5 of its 6) is within its quota and team-b (0 of 0) must borrow: the
    # GPU is team-a's, although team-b holds less and is first in line.
    assert said == {"job:a": NOW + 60, "job:b": NOW + 900}


def test_starts_are_estimated_down_to_the_first_workloads_of_the_line_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond the first `LINE` workloads in line, no estimate: the rest cost a large queue's explained
    pass most of its time for waits nobody plans by. `Engine.estimates` agrees with the pass."""
    monkeypatch.setattr(engine_module, "ESTIMATED_LINE", 3)
    monkeypatch.setattr(estimates_module, "LINE", 3)
    team = (ws("team-a", "8"),)
    pending = tuple(job(f"job:{i}", "team-a", seq=i) for i in range(5))
    said = estimates(team, (running("run:a", "team-a", range(8), ends_in=60.0),), pending)

    assert said == {"job:0": NOW + 60, "job:1": NOW + 60, "job:2": NOW + 60, "job:3": None, "job:4": None}
    node = NodeInfo("n1", "local", "h100", tuple(Device(i, D(0)) for i in range(8)))
    engine = Engine(team, (node,), Policy(preemption=False))
    engine.add_running(running("run:a", "team-a", range(8), ends_in=60.0))
    for workload in pending:
        engine.submit(workload)
    engine.cycle(NOW)
    assert engine.estimates(NOW) == {key: start for key, start in said.items() if start is not None}
    assert StartEstimates(engine).estimate(NOW, engine._line()) == engine.estimates(NOW)
