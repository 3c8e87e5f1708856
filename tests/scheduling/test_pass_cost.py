"""What one pass costs, counted: work of shapes at least as large as one refused is refused at once,
whole GPUs and shares of one alike, and what a pass does not reach says so."""

from __future__ import annotations

from decimal import Decimal

from apps.scheduling.engine import Engine
from apps.scheduling.types import Decisions, Device, NodeInfo, Policy, Quota, Workload, WorkspaceInfo

D = Decimal


def _borrowed_node() -> Engine:
    """One 4-GPU node of which a borrower (no quota of its own) holds 3.75 GPUs, borrowed from the owner's idle 8."""
    teams = (
        WorkspaceInfo("owner", (Quota("h100", D(8)),), cohort="lab"),
        WorkspaceInfo("borrower", (Quota("h100", D(0)),), cohort="lab", can_borrow=True),
    )
    engine = Engine(teams, (NodeInfo("n1", "c", "h100", tuple(Device(i, D(1)) for i in range(4))),), Policy())
    for seq, gpus in enumerate(("1", "1", "1", "0.75")):
        engine.submit(Workload(f"job:run-{seq}", "borrower", "h100", D(gpus), seq=seq))
    assert len(engine.cycle(0.0, explain=False).admitted) == 4
    return engine


def _count_admission_tries(engine: Engine) -> list[str]:
    tried: list[str] = []
    try_admit = engine._try_admit

    def spy(workload: Workload, decisions: Decisions) -> tuple[str, str]:
        tried.append(workload.key)
        return try_admit(workload, decisions)

    engine._try_admit = spy  # type: ignore[method-assign]
    return tried


def test_shares_larger_than_one_refused_are_refused_at_once_while_a_smaller_one_still_fits() -> None:
    """A quarter of a device is left. The borrower's queue mixes halves and three quarters, then one
    quarter: once a half finds no device, every half and three-quarter share behind it is refused
    without a placement search or a quota check of its own, and the quarter is reached and admitted."""
    engine = _borrowed_node()
    mixed = [
        Workload(f"job:{n:03}", "borrower", "h100", D("0.75" if n % 2 else "0.5"), seq=100 + n) for n in range(200)
    ]
    for workload in [*mixed, Workload("job:quarter", "borrower", "h100", D("0.25"), seq=1_000)]:
        engine.submit(workload)
    tried = _count_admission_tries(engine)

    decisions = engine.cycle(60.0, explain=False)

    assert [a.key for a in decisions.admitted] == ["job:quarter"]
    assert tried == ["job:000", "job:quarter"]  # one refusal, then the only shape not yet refused

    tried.clear()
    explained = engine.cycle(120.0, explain=True)  # with reasons: each shape asked once, in its order
    assert tried == ["job:000", "job:001", "job:002"]
    said = {p.key: p.reason for p in explained.pending}
    assert said["job:000"] == said["job:198"] == "waiting for a device with 0.5 free h100"
    assert said["job:001"] == said["job:199"] == "waiting for a device with 0.75 free h100"


def test_workloads_a_pass_does_not_reach_say_why() -> None:
    """A pass examines at most max_scan workloads, and refuses at most its share of that budget of one
    workspace's queue: what lies beyond is not 'in line' behind the rest but not examined."""
    teams = (WorkspaceInfo("a", (Quota("h100", D(4)),)), WorkspaceInfo("b", (Quota("h100", D(8)),)))
    engine = Engine(
        teams, (NodeInfo("n1", "c", "h100", tuple(Device(i, D(1)) for i in range(8))),), Policy(max_scan=40)
    )
    for n in range(100):  # all of a's quota each: the first is admitted, the others refused for quota
        engine.submit(Workload(f"job:a{n:03}", "a", "h100", D(4), seq=n))
    engine.submit(Workload("job:b", "b", "h100", D(4), seq=100))

    decisions = engine.cycle(0.0)

    assert [a.key for a in decisions.admitted] == ["job:a000", "job:b"]
    said = {p.key: p.reason for p in decisions.pending}
    assert said["job:a020"].startswith("waiting for quota")
    beyond = (
        "not examined in this pass: a pass refuses at most 20 workloads of one workspace's queue "
        "(max_scan 40 shared by the 2 with work waiting), and this one is further back in workspace a's"
    )
    assert said["job:a021"] == said["job:a099"] == beyond

    engine = Engine(teams, (NodeInfo("n1", "c", "h100", tuple(Device(i, D(1)) for i in range(8))),), Policy(max_scan=3))
    for n in range(6):  # all fit: three are admitted, and the budget is spent
        engine.submit(Workload(f"job:b{n}", "b", "h100", D(1), seq=n))

    decisions = engine.cycle(0.0)

    assert [a.key for a in decisions.admitted] == ["job:b0", "job:b1", "job:b2"]
    assert {p.key: p.reason for p in decisions.pending} == dict.fromkeys(
        ("job:b3", "job:b4", "job:b5"), "not examined in this pass: a pass examines at most 3 workloads"
    )
