"""The portal's cluster policy through the database: estimates, reclaim by preemption, fair-share
history, and what the API shows of a queued job."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.scheduling.adapter import requeue_unready_gangs, run_cycle
from apps.scheduling.models import FairShareUsage
from apps.workspaces.models import Cohort, GPUQuota, Workspace
from tests.personas import World


def submit(world: World, workspace: Workspace, gpus: str, name: str, **kwargs: Any) -> Job:
    return check_submit_job(
        workspace,
        name=name,
        command="python train.py",
        gpu_type="h100",
        gpus_per_replica=Decimal(gpus),
        acting_user=world.admin,
        **kwargs,
    )


def test_a_queued_job_shows_its_reason_positions_and_estimate_in_the_api(world: World) -> None:
    running = submit(world, world.team_a, "4", "first", max_runtime_s=3600)
    run_cycle()
    queued = submit(world, world.team_a, "1", "second", max_runtime_s=600)
    run_cycle()

    body = world.client(world.bob).get(f"/api/v1/jobs/{queued.pk}/").json()

    assert body["state"] == "QUEUED"
    assert body["wait_reason"] == "waiting for quota: 4 of 4 h100 in use in workspace team-a, this needs 1"
    assert (body["workspace_queue_position"], body["cluster_queue_position"]) == (1, 1)
    running.refresh_from_db()
    expected = running.admitted_at + timedelta(seconds=3600)
    estimate = Job.objects.get(pk=queued.pk).estimated_start_at
    assert abs((estimate - expected).total_seconds()) <= 1
    assert body["estimated_start_at"] is not None


def _borrowing_world(world: World) -> None:
    lab = Cohort.objects.create(name="lab")
    Workspace.objects.filter(pk__in=[world.team_a.pk, world.team_b.pk]).update(cohort=lab, can_borrow=True)


def test_it_reclaims_borrowed_gpus_for_their_owner(world: World, settings: Any) -> None:
    settings.PORTAL_PREEMPTION_MIN_RUNTIME_S = 0
    _borrowing_world(world)
    borrower = submit(world, world.team_b, "8", "borrow-all")
    run_cycle()
    borrower.refresh_from_db()
    assert borrower.state == Job.State.ADMITTED  # 4 of its own and 4 of team-a's idle quota

    owner = submit(world, world.team_a, "2", "mine")
    result = run_cycle()

    owner.refresh_from_db()
    borrower.refresh_from_db()
    assert result.preempted == [f"job:{borrower.pk}"]
    assert owner.state == Job.State.ADMITTED
    assert borrower.state == Job.State.QUEUED  # never started: requeued at once
    assert borrower.wait_reason.startswith("requeued after preemption: preempted to give workspace team-a back")
    assert not borrower.allocations.exists()
    event = AuditEvent.objects.get(action="job.preempt")
    assert event.target_id == str(borrower.pk)
    assert "workspace team-b was borrowing" in event.data["reason"]


def test_it_never_preempts_a_job_marked_not_preemptible(world: World, settings: Any) -> None:
    settings.PORTAL_PREEMPTION_MIN_RUNTIME_S = 0
    _borrowing_world(world)
    borrower = submit(world, world.team_b, "8", "borrow-all", preemptible=False)
    run_cycle()
    owner = submit(world, world.team_a, "2", "mine")

    assert run_cycle().preempted == []
    owner.refresh_from_db()
    assert owner.state == Job.State.QUEUED
    borrower.refresh_from_db()
    assert borrower.state == Job.State.ADMITTED


def test_it_keeps_decayed_history_of_gpu_use(world: World, settings: Any) -> None:
    settings.PORTAL_FAIR_SHARE_HALF_LIFE_S = 3600
    submit(world, world.team_a, "2", "user")
    run_cycle()  # admits it
    run_cycle()  # starts counting its use
    FairShareUsage.objects.update(updated_at=timezone.now() - timedelta(hours=1))
    usage = FairShareUsage.objects.get(workspace=world.team_a, gpu_type="h100")
    usage.gpu_seconds = 1000.0
    usage.save()

    run_cycle()

    usage.refresh_from_db()
    # Half of the old 1000 GPU-seconds remain after one half-life, plus 2 GPUs for about an hour.
    assert 500 + 2 * 3600 - 5 <= usage.gpu_seconds <= 500 + 2 * 3600 + 5


def test_a_job_above_what_the_workspace_may_ever_hold_after_a_quota_cut_says_so(world: World) -> None:
    job = submit(world, world.team_a, "4", "big")
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=2)
    run_cycle()
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED
    assert job.wait_reason == "can never run: asks for 4 h100 but workspace team-a can hold at most 2"


def test_it_requeues_a_gang_not_ready_in_time_with_doubling_backoff(world: World, settings: Any) -> None:
    settings.PORTAL_GANG_READY_TIMEOUT_S = 60
    settings.PORTAL_GANG_BACKOFF_S = 30
    gang = submit(world, world.team_a, "2", "gang", replicas=2)
    run_cycle()
    Job.objects.filter(pk=gang.pk).update(admitted_at=timezone.now() - timedelta(seconds=61))

    assert requeue_unready_gangs() == [gang.pk]

    gang.refresh_from_db()
    assert gang.state == Job.State.QUEUED and not gang.allocations.exists()
    assert gang.wait_reason.startswith("requeued: its 2 replica(s) were not all running 60 s after admission")
    assert 25 <= (gang.eligible_at - timezone.now()).total_seconds() <= 30
    run_cycle()
    gang.refresh_from_db()
    assert gang.state == Job.State.QUEUED  # not before its backoff has passed

    Job.objects.filter(pk=gang.pk).update(eligible_at=timezone.now() - timedelta(seconds=1))
    run_cycle()
    Job.objects.filter(pk=gang.pk).update(admitted_at=timezone.now() - timedelta(seconds=61))
    requeue_unready_gangs()
    gang.refresh_from_db()
    assert 55 <= (gang.eligible_at - timezone.now()).total_seconds() <= 60  # doubled
