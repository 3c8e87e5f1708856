"""Estimated starts: from the runtimes jobs declare or were seen to take, never in the past, and
"unknown" where nothing says when the work ahead ends."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from gpuportal.models import fmt_estimate

from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.scheduling.adapter import observed_runtimes, run_cycle
from apps.scheduling.engine import Device, NodeInfo, Pending, Policy, ReplicaPlacement, Snapshot, Workload, schedule
from apps.scheduling.replay import main as replay_main
from apps.scheduling.types import OBSERVED_RUNS
from apps.web.templatetags.portal import until
from apps.workspaces.models import Workspace
from tests.personas import World
from tests.scheduling.builders import ws

D = Decimal
NOW = 100_000.0


def node(name: str, used: tuple[int, ...] = ()) -> NodeInfo:
    return NodeInfo(name, "local", "h100", tuple(Device(i, D(0) if i in used else D(1)) for i in range(8)))


def running(key: str, node_name: str, gpus: int, started_at: float, **runtimes: float | None) -> Workload:
    placement = (ReplicaPlacement(node_name, tuple((i, D(1)) for i in range(gpus))),)
    return Workload(
        key, "team-a", "h100", D(gpus), started_at=started_at, cluster="local", placement=placement, **runtimes
    )


def gang_behind(*work: Workload, now: float = NOW) -> Pending:
    """The decision for a gang of 2 x 8 GPUs queued on two nodes, one of them held by `work`."""
    snapshot = Snapshot(
        (ws("team-a", "16"),),
        (node("n1", used=tuple(range(8))), node("n2")),
        tuple(work),
        (Workload("job:gang", "team-a", "h100", D(8), 2, submitted_at=now),),
        now,
        Policy(),
    )
    [pending] = schedule(snapshot).pending
    return pending


# --- the engine --------------------------------------------------------------------------------


def test_it_estimates_a_gang_behind_a_40_second_job_at_40_seconds() -> None:
    pending = gang_behind(running("job:quick", "n1", 8, NOW - 10, expected_runtime_s=40.0))

    assert pending.estimated_start == NOW + 30


def test_it_uses_the_declared_limit_where_no_runtime_was_observed() -> None:
    pending = gang_behind(running("job:long", "n1", 8, NOW - 100, max_runtime_s=600.0))

    assert pending.estimated_start == NOW + 500


def test_it_caps_the_observed_runtime_by_the_declared_limit() -> None:
    pending = gang_behind(running("job:capped", "n1", 8, NOW - 100, expected_runtime_s=900.0, max_runtime_s=600.0))

    assert pending.estimated_start == NOW + 500


def test_it_says_unknown_when_nothing_is_known_of_the_work_ahead() -> None:
    pending = gang_behind(running("job:mystery", "n1", 8, NOW - 100))

    assert pending.estimated_start is None


def test_it_says_unknown_behind_work_whose_runtime_is_unknown() -> None:
    snapshot = Snapshot(
        (ws("team-a", "16"),),
        (node("n1", used=tuple(range(8))), node("n2")),
        (running("job:mystery", "n1", 8, NOW - 100),),
        (
            Workload("job:first", "team-a", "h100", D(8), seq=1, submitted_at=NOW),  # takes n2, for how long?
            Workload("job:second", "team-a", "h100", D(8), seq=2, submitted_at=NOW),
        ),
        NOW,
        Policy(preemption=False),
    )
    decisions = schedule(snapshot)

    assert [a.key for a in decisions.admitted] == ["job:first"]
    assert [(p.key, p.estimated_start) for p in decisions.pending] == [("job:second", None)]


@pytest.mark.parametrize(
    ("runtimes", "end"),
    [
        ({"expected_runtime_s": 40.0}, NOW + 75),  # three quarters of the 100 s it has run (OVERRUN)
        ({"expected_runtime_s": 40.0, "max_runtime_s": 150.0}, NOW + 50),  # but not past its limit
        ({"expected_runtime_s": 40.0, "max_runtime_s": 90.0}, None),  # past its limit too: unknown
    ],
)
def test_it_never_estimates_the_past_behind_a_job_that_overran(runtimes: dict[str, float], end: float | None) -> None:
    pending = gang_behind(running("job:slow", "n1", 8, NOW - 100, **runtimes))

    assert pending.estimated_start == end


def test_it_never_estimates_now_for_work_the_counts_have_room_for_yet_did_not_start() -> None:
    # 8 GPUs are free, but 4 on each node: the gang of 1 x 8 waits for the first end on n1 or n2.
    nodes = (node("n1", used=(0, 1, 2, 3)), node("n2", used=(0, 1, 2, 3)))
    snapshot = Snapshot(
        (ws("team-a", "16"),),
        nodes,
        (
            running("job:a", "n1", 4, NOW - 10, expected_runtime_s=100.0),
            running("job:b", "n2", 4, NOW - 10, expected_runtime_s=70.0),
        ),
        (Workload("job:whole-node", "team-a", "h100", D(8), submitted_at=NOW),),
        NOW,
        Policy(),
    )
    [pending] = schedule(snapshot).pending

    assert pending.estimated_start == NOW + 60


def test_a_borrower_waits_for_the_cohort_not_only_for_its_own_work() -> None:
    # team-b borrows team-a's idle quota; its next job can start when team-c's job, borrowed from the
    # same idle quota, ends, not only when its own does. (Work within its nominal quota that ends is
    # kept for that workspace's next work: tests/scheduling/test_estimate_nodes.py.)
    snapshot = Snapshot(
        (
            ws("team-a", "8", cohort="lab"),
            ws("team-b", "8", cohort="lab", can_borrow=True),
            ws("team-c", "0", cohort="lab", can_borrow=True),
        ),
        (node("n1", used=tuple(range(8))), node("n2", used=tuple(range(8)))),
        (
            replace(running("job:c", "n1", 8, NOW - 10, expected_runtime_s=60.0), workspace="team-c"),
            Workload(
                "job:b", "team-b", "h100", D(8), started_at=NOW - 10, cluster="local", expected_runtime_s=7200.0,
                placement=(ReplicaPlacement("n2", tuple((i, D(1)) for i in range(8))),),
            ),
        ),
        (Workload("job:b2", "team-b", "h100", D(4), submitted_at=NOW),),
        NOW,
        Policy(preemption=False),
    )  # fmt: skip
    [pending] = schedule(snapshot).pending

    assert pending.estimated_start == NOW + 50


# --- what the pages and the CLI show -------------------------------------------------------------


def test_until_shows_how_far_ahead_an_estimate_is() -> None:
    assert until(timezone.now() + timedelta(minutes=5, seconds=30)) == "in 5 min"


@pytest.mark.parametrize("moment", [None, timedelta(seconds=-1), timedelta(hours=-3), timedelta(0)])
def test_until_says_unknown_without_an_estimate_or_for_one_that_has_passed(moment: timedelta | None) -> None:
    assert until(None if moment is None else timezone.now() + moment) == "unknown"


def test_the_cli_says_unknown_without_an_estimate_or_for_one_that_has_passed() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    assert fmt_estimate(None, now) == "unknown"
    assert fmt_estimate(now - timedelta(seconds=5), now) == "unknown"
    assert fmt_estimate(now + timedelta(minutes=12), now).endswith("(in 0:12:00)")


# --- the adapter ---------------------------------------------------------------------------------


def submit(world: World, name: str, gpus: str = "4", *, workspace: Workspace | None = None, **kwargs: Any) -> Job:
    """Queue a job in team A as alice, or in team B as charlie; tests run the cycle themselves."""
    workspace = workspace or world.team_a
    return check_submit_job(
        workspace,
        name=name,
        command="python train.py",
        gpu_type="h100",
        gpus_per_replica=Decimal(gpus),
        acting_user=world.alice if workspace == world.team_a else world.charlie,
        **kwargs,
    )


def ran(
    world: World,
    name: str,
    seconds: float,
    *,
    ended_ago: timedelta = timedelta(hours=1),
    state: Job.State = Job.State.SUCCEEDED,
    workspace: Workspace | None = None,
) -> Job:
    """A job of that name that ended `ended_ago` in `state`, after running `seconds`."""
    job = submit(world, name, "0", workspace=workspace)
    finished = timezone.now() - ended_ago
    Job.objects.filter(pk=job.pk).update(
        state=state, started_at=finished - timedelta(seconds=seconds), finished_at=finished
    )
    return job


def test_it_estimates_a_gang_behind_a_40_second_job_from_the_jobs_last_runs(world: World) -> None:
    for seconds in (38, 40, 45):
        ran(world, "quick", seconds)
    quick = submit(world, "quick")
    run_cycle()
    started = timezone.now() - timedelta(seconds=10)
    Job.objects.filter(pk=quick.pk).update(state=Job.State.RUNNING, started_at=started)
    gang = check_submit_job(
        world.team_a, name="gang", command="python train.py", gpu_type="h100", gpus_per_replica=D(2), replicas=2,
        acting_user=world.alice,
    )  # fmt: skip

    run_cycle()

    gang.refresh_from_db()
    assert gang.state == Job.State.QUEUED
    assert gang.estimated_start_at is not None
    assert abs((gang.estimated_start_at - (started + timedelta(seconds=40))).total_seconds()) <= 1


def test_it_stores_unknown_rather_than_a_guess(world: World) -> None:
    quick = submit(world, "never-seen")
    run_cycle()
    Job.objects.filter(pk=quick.pk).update(state=Job.State.RUNNING, started_at=timezone.now())
    waiting = submit(world, "next")

    run_cycle()

    waiting.refresh_from_db()
    assert waiting.wait_reason.startswith("waiting for quota")
    assert waiting.estimated_start_at is None


def test_the_observed_runtime_is_the_median_of_the_names_last_successful_runs(
    world: World, django_assert_num_queries: Any
) -> None:
    for seconds in (100, 300, 200):
        ran(world, "train", seconds)
    ran(world, "train", 5, state=Job.State.FAILED)
    ran(world, "train", 50, ended_ago=timedelta(days=31))  # too long ago
    ran(world, "eval", 60)
    ran(world, "train", 1_000, workspace=world.team_b)
    ran(world, "sweep", 999, ended_ago=timedelta(hours=2))  # the oldest of OBSERVED_RUNS + 1 runs
    for _ in range(OBSERVED_RUNS):
        ran(world, "sweep", 10)
    pending = [submit(world, name) for name in ("train", "eval", "sweep", "fresh")]
    pending.append(submit(world, "train", workspace=world.team_b))

    with django_assert_num_queries(1):
        observed = observed_runtimes(pending, timezone.now())

    a, b = world.team_a.pk, world.team_b.pk
    assert observed == {(a, "train"): 200.0, (a, "eval"): 60.0, (a, "sweep"): 10.0, (b, "train"): 1_000.0}


# --- the trace replay ---------------------------------------------------------------------------


def test_the_replay_checks_each_jobs_first_estimate_against_its_start(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "job_id,submit_time_s,duration_s,num_gpus,team\n"
        "j1,0,100,4,a\n"  # the team's first job: nothing observed yet
        "j2,10,50,4,a\n"  # waits behind j1, whose end nobody knows: unknown; starts at 100
        "j3,200,100,4,a\n"  # starts at once; expected: the median of j1 and j2, 75 s
        "j4,210,10,4,a\n"  # waits behind j3: estimated at 275, starts at 300
    )
    quotas = tmp_path / "quotas.csv"
    quotas.write_text("team,gpus\na,4\n")
    out = tmp_path / "out.json"

    argv = ["--trace", str(trace), "--quotas", str(quotas), "--gpus-per-node", "4", "--estimates", "--json", str(out)]
    assert replay_main(argv) == 0

    metrics = json.loads(out.read_text())
    assert (metrics["estimated_starts"], metrics["unknown_starts"]) == (1, 1)
    assert (metrics["p50_estimate_error_s"], metrics["p90_estimate_error_s"]) == (25.0, 25.0)
    argv.remove("--estimates")
    assert replay_main(argv) == 0
    assert json.loads(out.read_text())["estimated_starts"] is None  # not recorded: nothing to slow the replay
