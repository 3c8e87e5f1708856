"""What-if replay of the portal's own history (apps/scheduling/whatif.py), on a history recorded
here: jobs submitted through the actions, admitted by a real scheduling cycle, started and ended
through the host's record actions, then spread over a day as a busy day records them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.compute.actions import check_launch_instance, record_instance_start
from apps.jobs.actions import check_submit_job, do_cancel_job, record_job_end, record_job_start
from apps.jobs.models import Job
from apps.scheduling import whatif
from apps.scheduling.adapter import run_cycle
from apps.scheduling.models import WhatIfReplay
from apps.scheduling.trigger import run_here
from apps.workloads.models import Workload
from apps.workspaces.actions import do_save_cohort, do_update_workspace
from apps.workspaces.models import Workspace
from tests.personas import World
from workers.tasks import route

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
HOUR = 3600.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def record(
    world: World,
    workspace: Workspace,
    *,
    submitted: float,
    started: float,
    ran: float,
    gpus: str = "4",
    replicas: int = 1,
    name: str = "train",
    **options: Any,
) -> Job:
    """A job of the recorded history: submitted, admitted by the scheduler, started and ended through
    the actions; then its times set to `submitted`, `started` and `started + ran` seconds after T0."""
    user = world.alice if workspace == world.team_a else world.charlie
    job = check_submit_job(
        workspace, name=name, command="python train.py", gpu_type="h100" if Decimal(gpus) else "",
        gpus_per_replica=Decimal(gpus), replicas=replicas, acting_user=user, **options,
    )  # fmt: skip
    run_cycle()
    job.refresh_from_db()
    assert job.state == Job.State.ADMITTED, job.wait_reason
    record_job_start(job, endpoint="127.0.0.1")
    record_job_end(job, Job.State.SUCCEEDED, exit_code=0, reason="")
    Workload.objects.filter(pk=job.pk).update(
        created_at=at(submitted), admitted_at=at(started), started_at=at(started), finished_at=at(started + ran)
    )
    return job


def contended_day(world: World) -> None:
    """team-a runs one 4-GPU job for an hour; team-b submits four 4-GPU jobs at once, an hour each."""
    record(world, world.team_a, submitted=0, started=0, ran=HOUR)
    for n in range(4):
        record(world, world.team_b, submitted=10, started=10 + n * HOUR, ran=HOUR, name=f"sweep-{n}")


def replayed(changes: whatif.Changes, since: datetime = T0, until: datetime | None = None) -> dict[str, Any]:
    history = whatif.load_history(since, until or at(86400))
    base = whatif.today()
    return whatif.compare(history, base, changes.apply(base))


def test_it_replays_the_recorded_history_under_today_s_quotas_as_it_happened(world: World) -> None:
    contended_day(world)
    result = replayed(whatif.Changes())
    team_b = result["baseline"]["team-b"]
    # 4 GPUs of quota: one job at a time, each waiting for the one before (0, 1, 2 and 3 hours).
    assert team_b["jobs"] == 4 and team_b["not_run"] == 0
    assert team_b["mean_wait_s"] == pytest.approx(1.5 * HOUR, abs=10)
    assert team_b["p95_wait_s"] == pytest.approx(3 * HOUR, abs=10)
    assert team_b["mean_jct_s"] == pytest.approx(2.5 * HOUR, abs=10)
    assert result["baseline"]["team-a"]["mean_wait_s"] == 0
    assert result["whatif"] == result["baseline"]  # no changes: the same replay


def test_it_shows_what_more_quota_for_one_workspace_would_do(world: World) -> None:
    contended_day(world)
    result = replayed(whatif.Changes(quotas={"team-b": "+4"}))
    before, after = result["baseline"]["team-b"], result["whatif"]["team-b"]
    # 8 GPUs of quota on 8 GPUs, team-a holding 4 for the first hour: one job, then two, then the last.
    assert after["mean_wait_s"] == pytest.approx((0 + HOUR + HOUR + 2 * HOUR) / 4, abs=10)
    assert after["mean_wait_s"] < before["mean_wait_s"]
    assert after["gpu_utilization"] == pytest.approx(before["gpu_utilization"] * 4 / 3, rel=0.01)
    for figure in ("mean_wait_s", "mean_jct_s", "preemptions"):  # its utilisation is of a shorter makespan
        assert result["whatif"]["team-a"][figure] == result["baseline"]["team-a"][figure]
    assert result["whatif"][whatif.ALL]["mean_jct_s"] < result["baseline"][whatif.ALL]["mean_jct_s"]


def test_it_shows_what_a_smaller_cluster_would_do_and_what_no_longer_fits(world: World) -> None:
    contended_day(world)
    result = replayed(whatif.Changes(cluster_gpus="-4"))
    # 4 GPUs: team-b's first job waits for team-a's hour too.
    assert result["whatif"]["team-b"]["mean_wait_s"] == pytest.approx(2.5 * HOUR, abs=10)
    assert result["whatif"]["team-a"]["not_run"] == result["baseline"]["team-a"]["not_run"] == 0
    tiny = replayed(whatif.Changes(cluster_gpus="3"))["whatif"]  # no 4-GPU job fits on 3 GPUs
    assert tiny[whatif.ALL]["not_run"] == tiny[whatif.ALL]["jobs"] == 5
    assert tiny["team-b"]["not_run"] == 4


def cohort_of_two(world: World, settings: Any) -> None:
    """team-a and team-b lend each other idle quota; team-a borrows team-b's 4 GPUs for 3 hours and
    team-b wants them back half an hour in. Today the portal protects runs for 2 hours."""
    settings.PORTAL_PREEMPTION_MIN_RUNTIME_S = 7200
    lab = do_save_cohort(None, name="lab", acting_user=world.admin)
    for workspace in (world.team_a, world.team_b):
        do_update_workspace(workspace, cohort=lab, can_borrow=True, acting_user=world.admin)
    record(world, world.team_a, submitted=0, started=0, ran=3 * HOUR, name="long-a")
    record(world, world.team_a, submitted=1, started=1, ran=3 * HOUR, name="long-b")
    record(world, world.team_b, submitted=HOUR / 2, started=2 * HOUR, ran=HOUR, name="reclaim")


def test_it_shows_what_a_shorter_min_runtime_would_do(world: World, settings: Any) -> None:
    cohort_of_two(world, settings)
    result = replayed(whatif.Changes(min_runtime_s=600))
    before, after = result["baseline"], result["whatif"]
    # Today: team-b waits until the borrower has run 2 hours; at 10 minutes it waits for nothing.
    assert before["team-b"]["mean_wait_s"] == pytest.approx(1.5 * HOUR, abs=10)
    assert after["team-b"]["mean_wait_s"] == pytest.approx(0, abs=10)
    assert before["team-a"]["preemptions"] == after["team-a"]["preemptions"] == 1
    assert after[whatif.ALL]["preemptions"] == 1
    # Without preemption the borrower keeps its GPUs to the end.
    calm = replayed(whatif.Changes(preemption=False))["whatif"]
    assert calm["team-a"]["preemptions"] == 0
    assert calm["team-b"]["mean_wait_s"] == pytest.approx(3 * HOUR - HOUR / 2, abs=10)


def test_it_shows_what_leaving_a_cohort_would_do(world: World, settings: Any) -> None:
    cohort_of_two(world, settings)
    result = replayed(whatif.Changes(cohorts={"team-a": None}))
    # Out of the cohort team-a borrows nothing: its second job waits for its first.
    assert result["whatif"]["team-a"]["mean_wait_s"] == pytest.approx(3 * HOUR / 2, abs=10)
    assert result["whatif"]["team-b"]["mean_wait_s"] == 0
    assert result["whatif"]["team-a"]["preemptions"] == 0


def test_it_loads_shapes_priorities_and_interactive_work_from_history(world: World) -> None:
    gang = record(world, world.team_a, submitted=0, started=5, ran=60, gpus="2", replicas=2, name="gang", priority=5)
    record(world, world.team_b, submitted=1, started=1, ran=30, gpus="0", name="cpu-only")
    queued = check_submit_job(world.team_b, name="never", command="x", gpu_type="h100",
                              gpus_per_replica=Decimal("4"), acting_user=world.charlie)  # fmt: skip
    do_cancel_job(queued, acting_user=world.charlie)  # cancelled while it waited
    Workload.objects.filter(pk=queued.pk).update(created_at=at(2))
    box = check_launch_instance(world.team_b, name="box", profile=world.gpu_1, acting_user=world.charlie)
    run_cycle()
    box.refresh_from_db()
    record_instance_start(box, endpoint="127.0.0.1", restarted=False)
    Workload.objects.filter(pk=box.pk).update(created_at=at(3), started_at=at(4))
    before = T0 + timedelta(days=1)  # the instance still runs: it has held its GPU for a day so far
    history = whatif.load_history(T0, before, now=before)
    assert history.skipped == {"never_started": 1, "no_gpus": 1}
    by_id = {r.job.job_id: r for r in history.workloads}
    assert set(by_id) == {f"job:{gang.pk}", f"instance:{box.pk}"}
    assert by_id[f"job:{gang.pk}"].shape == (2, Decimal("2"))
    assert by_id[f"job:{gang.pk}"].job.num_gpus == 4 and by_id[f"job:{gang.pk}"].job.duration_s == 60
    assert by_id[f"job:{gang.pk}"].priority == 5 and by_id[f"job:{gang.pk}"].preemptible
    assert not by_id[f"instance:{box.pk}"].preemptible  # interactive: never preempted, replayed for the time it held
    assert by_id[f"instance:{box.pk}"].job.duration_s == pytest.approx(86400 - 4)
    assert whatif.load_history(at(3), before, now=before).workloads[0].job.submit_s == 0  # from `since`


def test_it_refuses_changes_that_make_no_sense_naming_each_field(world: World) -> None:
    found, errors = whatif.parse_assignments(["team-b=+16", "team-a", "team-c=lots", "team-b=2"], "quota", sizes=True)
    assert found == {"team-b": "+16"}
    assert len(errors) == 3 and "team-a" in errors[0] and "is given twice" in errors[2]
    changes = whatif.Changes(quotas={"team-b": "-5", "nobody": "+1"}, cohorts={"ghost": None}, cluster_gpus="-8")
    problems = whatif.problems(changes, whatif.today(), at(10), at(0))
    assert problems == {
        "until": ["The window must end after it begins."],
        "quotas": ["There is no workspace named nobody.", "team-b has 4 GPUs of quota: -5 leaves fewer than 0."],
        "cohorts": ["There is no workspace named ghost."],
        "cluster_gpus": ["The cluster has 8 GPUs: -8 makes 0; give 1 to 100,000."],
    }


def test_the_task_runs_a_queued_replay_once_writing_only_its_row(world: World, settings: Any) -> None:
    contended_day(world)
    before = list(Workload.objects.order_by("pk").values_list("pk", "state", "created_at", "finished_at"))
    run = WhatIfReplay.objects.create(since=T0, until=at(86400), changes={"quotas": {"team-b": "+4"}})
    run_here(whatif.REPLAY_TASK, run.pk)
    run.refresh_from_db()
    assert run.state == WhatIfReplay.State.SUCCEEDED, run.message
    assert run.progress == 1.0 and run.started_at and run.finished_at
    assert run.result["workloads"] == 5 and run.result["changes"] == ["quota of team-b: +4 GPUs"]
    quotas = run.result["settings"]["whatif"]["quotas"]
    assert (quotas["team-a"], quotas["team-b"]) == (4, 8)
    assert run.result["settings"]["baseline"]["quotas"]["team-b"] == 4
    assert run.result["whatif"]["team-b"]["mean_wait_s"] < run.result["baseline"]["team-b"]["mean_wait_s"]
    assert list(Workload.objects.order_by("pk").values_list("pk", "state", "created_at", "finished_at")) == before
    finished_at = run.finished_at
    run_here(whatif.REPLAY_TASK, run.pk)  # delivered twice: the claim lets one run
    run.refresh_from_db()
    assert run.finished_at == finished_at
    lines = whatif.as_csv(run.result).splitlines()
    assert lines[0].startswith("workspace,jobs_baseline,jobs_whatif,not_run_baseline,not_run_whatif,mean_wait_s_")
    assert [line.split(",")[0] for line in lines[1:]] == [whatif.ALL, "team-a", "team-b"]
    team_b = dict(zip(lines[0].split(","), lines[3].split(","), strict=True))
    assert float(team_b["mean_wait_s_baseline"]) == pytest.approx(1.5 * HOUR, abs=10)
    assert float(team_b["mean_wait_s_whatif"]) == run.result["whatif"]["team-b"]["mean_wait_s"]


def test_a_window_without_history_fails_saying_why(world: World) -> None:
    run = WhatIfReplay.objects.create(since=T0, until=at(60))
    run_here(whatif.REPLAY_TASK, run.pk)
    run.refresh_from_db()
    assert run.state == WhatIfReplay.State.FAILED
    assert run.message == "No workload in this window ever held GPUs: there is nothing to replay."


def test_a_replay_goes_to_the_provision_queue_never_holding_up_a_scheduling_cycle(settings: Any) -> None:
    assert route(whatif.REPLAY_TASK, (1,), {}, {}) == {"queue": settings.PROVISION_QUEUE}


def test_progress_rises_to_the_end_over_both_replays(world: World) -> None:
    contended_day(world)
    history = whatif.load_history(T0, at(86400))
    base = whatif.today()
    seen: list[float] = []
    whatif.compare(history, base, whatif.Changes(quotas={"team-b": "+4"}).apply(base), seen.append)
    assert seen == sorted(seen) and len(seen) == 10  # one report as each of 5 workloads ends, twice
    assert seen[4] == 0.5 and seen[-1] == 1.0


def test_a_replay_whose_worker_stopped_ends_failed_saying_so_and_a_late_end_changes_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    contended_day(world)
    now = timezone.now()
    lost, alive = (
        WhatIfReplay.objects.create(
            since=T0, until=at(86400), state=WhatIfReplay.State.RUNNING, started_at=now, heartbeat_at=now
        )
        for _ in range(2)
    )
    WhatIfReplay.objects.filter(pk=lost.pk).update(heartbeat_at=now - whatif.LOST_AFTER - timedelta(seconds=1))
    assert whatif.upkeep() == {"whatif_lost": 1}
    lost.refresh_from_db()
    assert lost.state == WhatIfReplay.State.FAILED and lost.finished_at is not None
    assert lost.message == "Its worker stopped: no progress for 10 minutes. Start it again."
    assert WhatIfReplay.objects.get(pk=alive.pk).state == WhatIfReplay.State.RUNNING
    assert whatif.upkeep() == {}

    # A worker that was only stuck, long enough to be taken for lost, writes nothing when it ends.
    replay = whatif._replay

    def stuck(run: WhatIfReplay) -> dict[str, Any]:
        result = replay(run)
        WhatIfReplay.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - 2 * whatif.LOST_AFTER)
        whatif.upkeep()
        return result

    monkeypatch.setattr(whatif, "_replay", stuck)
    late = WhatIfReplay.objects.create(since=T0, until=at(86400))
    whatif.run_replay(late.pk)
    late.refresh_from_db()
    assert late.state == WhatIfReplay.State.FAILED and late.result is None, late.message


def test_a_replay_no_worker_took_is_sent_again_once_a_period(world: World, settings: Any) -> None:
    """Its task lost with the broker's queue: the scheduler loop's upkeep sends it again; one just
    asked for is left to its worker, and one sent again is not sent at every later upkeep."""
    contended_day(world)
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"  # "sending" runs it here, as a worker would
    lost = WhatIfReplay.objects.create(since=T0, until=at(86400))
    fresh = WhatIfReplay.objects.create(since=T0, until=at(86400))
    WhatIfReplay.objects.filter(pk=lost.pk).update(created_at=timezone.now() - whatif.LOST_AFTER - timedelta(seconds=1))

    assert whatif.upkeep() == {"whatif_resent": 1}
    assert WhatIfReplay.objects.get(pk=lost.pk).state == WhatIfReplay.State.SUCCEEDED
    assert WhatIfReplay.objects.get(pk=fresh.pk).state == WhatIfReplay.State.QUEUED

    settings.PORTAL_WORKLOAD_TRIGGER = "off"  # sent again, and lost again
    WhatIfReplay.objects.filter(pk=fresh.pk).update(created_at=timezone.now() - 2 * whatif.LOST_AFTER)
    assert whatif.upkeep() == {"whatif_resent": 1}
    assert whatif.upkeep() == {}  # not again before another period has passed
