"""The line kept in order without a sort per pass, explained passes without estimates, and the
adapter's rule for which cycles work out estimated starts."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.utils import timezone

from apps.jobs.models import Job
from apps.scheduling import adapter
from apps.scheduling.adapter import estimates_due, run_cycle
from apps.scheduling.engine import Device, Engine, NodeInfo, Policy, Workload
from tests.personas import World
from tests.scheduling.builders import ws
from tests.scheduling.test_estimates import ran, submit


def _engine(nodes: int = 4) -> Engine:
    devices = tuple(Device(i, D(1)) for i in range(8))
    return Engine(
        (ws("a", "8", cohort="c", can_borrow=True), ws("b", "16", cohort="c", can_borrow=True), ws("c", "8")),
        tuple(NodeInfo(f"n{i}", "local", "h100", devices) for i in range(nodes)),
        Policy(name="portal"),
    )


def _workload(rng: random.Random, seq: int) -> Workload:
    gpus, replicas = rng.choice(((D("0.25"), 1), (D("1"), 1), (D("2"), 1), (D("8"), 1), (D("8"), 2)))
    return Workload(
        f"job:{seq}", rng.choice("abc"), "h100", gpus, replicas, rng.choice((0, 0, 0, 1, -2)), seq, 0.0,
        expected_runtime_s=rng.choice((600.0, 3600.0)),
    )  # fmt: skip


def _in_order(engine: Engine) -> list[str]:
    return [w.key for w in sorted(engine.pending.values(), key=lambda w: (-w.priority, w.seq, w.key))]


@pytest.mark.parametrize("seed", range(6))
def test_the_line_stays_in_queue_order_through_admissions_evictions_withdrawals_and_late_submissions(
    seed: int,
) -> None:
    rng = random.Random(seed)
    engine = _engine()
    seq = 0
    kept: dict[str, Workload] = {}
    for step in range(30):
        for _ in range(rng.randrange(0, 60)):
            seq += 1
            kept[f"job:{seq}"] = workload = _workload(rng, seq)
            engine.submit(workload)
        for _ in range(rng.randrange(0, 5)):
            if engine.pending:
                engine.withdraw(rng.choice(sorted(engine.pending)))
        # Work submitted behind later work (its seq is older): it goes to its place in the line, and
        # once many came so, they are folded in (_Line.FOLD).
        for _ in range(rng.randrange(0, 40 if step % 7 else 700)):
            late = replace(_workload(rng, rng.randrange(1, seq + 1)), key=f"late:{len(kept)}")
            kept[late.key] = late
            engine.submit(late)
        decisions = engine.cycle(step * 60.0)
        assert [p.key for p in decisions.pending] == _in_order(engine)
        for key in sorted(engine.running)[: rng.randrange(0, 6)]:
            engine.finish(key, step * 60.0 + 30)
        for preempt in decisions.preempted:
            engine.submit(kept[preempt.key])  # back in line, in its old place
        assert [w.key for w in engine._line()] == _in_order(engine)


def test_work_submitted_again_replaces_its_old_terms_in_the_line() -> None:
    engine = _engine()
    first = Workload("job:1", "a", "h100", D(1), 1, 0, 1, 0.0)
    engine.submit(first)
    engine.submit(Workload("job:2", "a", "h100", D(1), 1, 0, 2, 0.0))
    engine.submit(Workload("job:1", "a", "h100", D(2), 1, 5, 1, 0.0))
    assert [(w.key, w.priority) for w in engine._line()] == [("job:1", 5), ("job:2", 0)]
    assert len(engine.queues["a"].items) == 2


def _loaded(seed: int) -> Engine:
    rng = random.Random(seed)
    engine = _engine()
    for seq in range(1, 300):
        engine.submit(_workload(rng, seq))
    engine.cycle(0.0, explain=False)
    for seq in range(300, 400):
        engine.submit(_workload(rng, seq))
    return engine


def test_a_pass_without_estimates_gives_the_same_reasons_and_positions_and_no_estimate() -> None:
    with_estimates = _loaded(3).cycle(60.0)
    without = _loaded(3).cycle(60.0, estimate=False)

    assert with_estimates.estimated and not without.estimated
    assert with_estimates.admitted == without.admitted and with_estimates.preempted == without.preempted
    assert [p[:4] for p in without.pending] == [p[:4] for p in with_estimates.pending]
    assert all(p.estimated_start is None for p in without.pending)
    assert sum(p.estimated_start is not None for p in with_estimates.pending) > 50
    assert without.estimate_s == 0.0 and with_estimates.estimate_s > 0.0


def test_cheap_estimates_are_worked_out_every_cycle() -> None:
    estimates_due.done(0.001)
    estimates_due.done(0.049)
    assert estimates_due.now()


def test_costly_estimates_wait_a_hundred_times_their_cost_and_at_most_the_longest_age(
    settings: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(adapter.time, "monotonic", lambda: clock[0])
    settings.PORTAL_ESTIMATES_MAX_AGE_S = 30  # type: ignore[attr-defined]
    estimates_due.done(0.2)
    assert estimates_due.now(), "one slow play (a garbage collection in it) spaces nothing out"
    estimates_due.done(0.1)
    clock[0] += 9.9
    assert not estimates_due.now()
    clock[0] += 0.1
    assert estimates_due.now()  # 100 x 0.1 s
    estimates_due.done(0.5)
    estimates_due.done(0.5)
    clock[0] += 29.9
    assert not estimates_due.now()
    clock[0] += 0.1
    assert estimates_due.now()  # never older than 30 s, though 100 x 0.5 s is 50 s


def test_a_cycle_that_does_not_estimate_keeps_the_stored_estimate_and_updates_the_reason(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    for seconds in (38, 40, 45):
        ran(world, "quick", seconds)
    quick = submit(world, "quick")
    run_cycle()
    Job.objects.filter(pk=quick.pk).update(state=Job.State.RUNNING, started_at=timezone.now() - timedelta(seconds=10))
    waiting = submit(world, "quick")
    run_cycle()
    waiting.refresh_from_db()
    estimated, position = waiting.estimated_start_at, waiting.workspace_queue_position
    assert estimated is not None and position == 1

    # The estimates now cost much (a long line): the next cycle gives reasons and positions only.
    clock = [5000.0]
    monkeypatch.setattr(adapter.time, "monotonic", lambda: clock[0])
    estimates_due.done(0.3)
    estimates_due.done(0.3)
    ahead = submit(world, "quick", priority=5)
    run_cycle()
    ahead.refresh_from_db()
    waiting.refresh_from_db()
    assert waiting.workspace_queue_position == 2, "positions are new every cycle"
    assert waiting.estimated_start_at == estimated, "the stored estimate is kept, not cleared"
    assert ahead.estimated_start_at is None, "new work has none until estimates are worked out again"

    clock[0] += 30
    run_cycle()
    ahead.refresh_from_db()
    assert ahead.estimated_start_at is not None
