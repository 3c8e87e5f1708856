"""GPU provisioning requests through their actions: checked, approved by policy or by an admin,
changed, begun and ended on time, warned about and reported idle, and held by the scheduler (a job
of the holder runs in its reservation uncounted by quota; another workspace's long job waits)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.alerts.actions import do_save_rule
from apps.alerts.evaluate import evaluate
from apps.alerts.models import Alert
from apps.errors import ActionError, Conflict
from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.provisioning import actions
from apps.provisioning.models import ProvisioningPolicy, ProvisioningRequest
from apps.scheduling.adapter import run_cycle
from apps.workspaces.models import GPUQuota
from tests.mail import body_of, smtp_server
from tests.personas import World

pytestmark = pytest.mark.django_db

State = ProvisioningRequest.State
HOUR = 3600


def ask(world: World, gpus: int = 2, duration_s: int = 4 * HOUR, **options: Any) -> ProvisioningRequest:
    workspace = options.pop("workspace", world.team_a)
    asked = actions.check_request(workspace, gpu_type="h100", gpus=gpus, duration_s=duration_s, **options)
    return actions.do_request(asked, priority=0, justification="fine-tuning run", acting_user=world.alice)


def job(world: World, gpus: str, workspace: Any = None, **options: Any) -> Job:
    return check_submit_job(
        workspace or world.team_a, name=options.pop("name", "train"), command="python train.py", gpu_type="h100",
        gpus_per_replica=Decimal(gpus), acting_user=world.alice, **options,
    )  # fmt: skip


def test_within_quota_and_the_policys_length_it_is_approved_at_once_on_whole_devices(world: World) -> None:
    gpr = ask(world, gpus=3)
    assert gpr.state == State.APPROVED and gpr.auto_approved
    assert gpr.held_start == gpr.earliest_start and gpr.held_end == gpr.held_start + timedelta(hours=4)
    devices = list(gpr.devices.values_list("node__name", "index"))
    assert len(devices) == 3 and len({node for node, _ in devices}) == 1
    assert [e.kind for e in gpr.events.all()] == ["requested", "approved"]


def test_beyond_the_quota_or_the_policys_length_an_admin_decides(world: World) -> None:
    too_many = ask(world, gpus=5)  # team-a's quota is 4
    assert too_many.state == State.REQUESTED and too_many.devices.count() == 0
    assert "exceed the workspace's quota of 4" in too_many.events.last().message
    too_long = ask(world, gpus=1, duration_s=48 * HOUR)
    assert too_long.state == State.REQUESTED
    ProvisioningPolicy.objects.create(workspace=world.team_b, auto_approve_max_s=None, max_duration_s=30 * 86400)
    never = ask(world, gpus=1, workspace=world.team_b)
    assert never.state == State.REQUESTED and "decided by an admin" in never.events.last().message


@pytest.mark.parametrize(
    ("terms", "field", "message"),
    [
        ({"gpus": 9}, "gpus", "more than any one cluster could ever hold (at most 8 ready)"),
        ({"start_at": "past"}, "start_at", "The start lies in the past"),
        ({"duration_s": 15 * 86400}, "duration_s", "At most 14 days for workspace team-a"),
        ({"gpu_type": "a100"}, "gpu_type", "No cluster has a100 GPUs."),
    ],
)
def test_what_can_never_be_held_is_refused_naming_the_field(
    world: World, terms: dict[str, Any], field: str, message: str
) -> None:
    if terms.get("start_at") == "past":
        terms["start_at"] = timezone.now() - timedelta(hours=1)
    terms = {"gpu_type": "h100", "gpus": 1, "duration_s": HOUR, **terms}
    with pytest.raises(ActionError) as refused:
        actions.check_request(world.team_a, **terms)
    assert refused.value.field == field and message in str(refused.value)
    assert not ProvisioningRequest.objects.exists()


def test_a_type_the_workspace_may_not_use_and_overlapping_requests_above_its_cap_are_refused(world: World) -> None:
    world.team_a.allowed_gpu_types = ["a100"]
    world.team_a.save()
    with pytest.raises(ActionError, match="may not use h100 GPUs") as refused:
        actions.check_request(world.team_a, gpu_type="h100", gpus=1, duration_s=HOUR)
    assert refused.value.field == "gpu_type"
    ProvisioningPolicy.objects.create(workspace=world.team_b, auto_approve_max_s=86400, max_duration_s=86400,
                                      max_gpus=3)  # fmt: skip
    ask(world, gpus=2, workspace=world.team_b)
    with pytest.raises(ActionError, match="at most 3 h100 GPUs at once; its other requests over that time hold 2"):
        actions.check_request(world.team_b, gpu_type="h100", gpus=2, duration_s=HOUR)
    later = timezone.now() + timedelta(hours=6)  # after the first one ends: fine
    assert actions.check_request(world.team_b, gpu_type="h100", gpus=2, duration_s=HOUR, start_at=later).gpus == 2


def test_the_calendar_never_books_a_device_twice_and_gives_the_next_free_start(world: World) -> None:
    start = timezone.now() + timedelta(days=1)
    first = ask(world, gpus=4, start_at=start)
    second = ask(world, gpus=4, start_at=start, workspace=world.team_b)
    assert {first.state, second.state} == {State.APPROVED}
    assert not set(first.devices.all()) & set(second.devices.all())  # the node's other four
    third = ask(world, gpus=2, start_at=start)  # none left then: after the first ends
    assert third.earliest_start == first.held_end


def test_an_admin_approves_with_changes_or_rejects_with_a_reason_and_the_requester_is_mailed(
    world: World, settings: Any
) -> None:
    with smtp_server() as box:
        for key, value in box.settings().items():
            setattr(settings, key, value)
        gpr = ask(world, gpus=6, duration_s=10 * HOUR)
        later = timezone.now() + timedelta(days=2)
        with pytest.raises(ActionError, match="fewer GPUs than asked"):
            actions.do_approve(gpr, acting_user=world.admin, gpus=7)
        actions.do_approve(gpr, acting_user=world.admin, start_at=later, gpus=4, reason="Half the cluster at most.")
        gpr.refresh_from_db()
        assert (gpr.state, gpr.gpus, gpr.devices.count(), gpr.held_start) == (State.APPROVED, 4, 4, later)
        assert "with changes (4 GPUs instead of 6; from" in gpr.events.last().message
        other = ask(world, gpus=8, workspace=world.team_b)
        with pytest.raises(ActionError, match="Say why"):
            actions.do_reject(other, reason=" ", acting_user=world.admin)
        actions.do_reject(other, reason="The whole cluster for a day is too much.", acting_user=world.admin)
        with pytest.raises(Conflict, match="is rejected: it cannot be approved"):
            actions.do_approve(other, acting_user=world.admin)
        approved, rejected = box.wait_for(2)
    assert approved["To"] == "alice@example.org" and "approved" in approved["Subject"]
    assert "Half the cluster at most." in body_of(approved)
    assert "The whole cluster for a day is too much." in body_of(rejected)


def test_it_begins_and_ends_on_time_warns_before_the_end_and_reports_idleness(world: World, settings: Any) -> None:
    settings.PORTAL_GPR_IDLE_S = 600
    gpr = ask(world, gpus=1, duration_s=2 * HOUR)
    start = gpr.held_start
    actions.upkeep(start + timedelta(seconds=1))
    gpr.refresh_from_db()
    # Nothing of the holder's runs there: idle from when it began, reported once idle for long.
    assert gpr.state == State.ACTIVE and gpr.idle_since == start + timedelta(seconds=1)
    actions.upkeep(start + timedelta(seconds=500))
    gpr.refresh_from_db()
    assert gpr.idle_reported_at is None
    actions.upkeep(start + timedelta(seconds=700))
    gpr.refresh_from_db()
    assert gpr.idle_reported_at is not None
    actions.upkeep(gpr.held_end - timedelta(minutes=30))
    actions.upkeep(gpr.held_end)
    gpr.refresh_from_db()
    assert gpr.state == State.ENDED
    assert [e.kind for e in gpr.events.all()] == ["requested", "approved", "began", "idle", "warned", "ended"]


def test_extensions_beyond_the_policy_wait_for_an_admin_and_a_clash_is_refused(world: World) -> None:
    gpr = ask(world, gpus=4, duration_s=4 * HOUR)
    actions.do_modify(gpr, acting_user=world.alice, duration_s=8 * HOUR)  # within the policy's day
    gpr.refresh_from_db()
    assert gpr.held_end == gpr.held_start + timedelta(hours=8) and gpr.pending_change is None
    actions.do_modify(gpr, acting_user=world.alice, duration_s=30 * HOUR)
    gpr.refresh_from_db()
    assert gpr.pending_change["duration_s"] == 30 * HOUR and gpr.duration_s == 8 * HOUR
    actions.do_decide_change(gpr, approve=True, acting_user=world.admin)
    gpr.refresh_from_db()
    assert gpr.duration_s == 30 * HOUR and gpr.pending_change is None
    # Another workspace holds the same devices after it: it cannot be extended past their start.
    their_start = gpr.held_end + timedelta(hours=1)
    theirs = ask(world, gpus=8, start_at=their_start, workspace=world.team_b)
    actions.do_approve(theirs, acting_user=world.admin)
    with pytest.raises(ActionError, match="reserved for team-b from"):
        actions.do_modify(gpr, acting_user=world.admin, duration_s=40 * HOUR)
    actions.do_modify(gpr, acting_user=world.alice, gpus=2)
    assert gpr.devices.count() == 2
    with pytest.raises(ActionError, match="cannot grow"):
        actions.do_modify(gpr, acting_user=world.alice, gpus=3)


def test_cancel_before_it_begins_and_release_only_once_active(world: World) -> None:
    gpr = ask(world, gpus=1, start_at=timezone.now() + timedelta(days=1))
    with pytest.raises(Conflict, match="is approved: it cannot be released"):
        actions.do_release(gpr, acting_user=world.alice)
    actions.do_cancel(gpr, acting_user=world.alice)
    gpr.refresh_from_db()
    assert gpr.state == State.CANCELLED
    with pytest.raises(Conflict):
        actions.do_cancel(gpr, acting_user=world.alice)


def test_the_holders_job_runs_in_its_reservation_uncounted_and_another_long_job_waits(world: World) -> None:
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=Decimal("0"))  # no quota: only the reservation
    GPUQuota.objects.filter(workspace=world.team_b).update(gpus=Decimal("8"))  # quota enough for the cluster
    gpr = ask(world, gpus=4, workspace=world.team_a)
    actions.do_approve(gpr, acting_user=world.admin) if gpr.state == State.REQUESTED else None
    actions.upkeep()
    gpr.refresh_from_db()
    assert gpr.state == State.ACTIVE
    # team-b's job that may run past nothing (no limit, not preemptible) fits only on the other four.
    theirs = [job(world, "1", world.team_b, name=f"b{i}", preemptible=False) for i in range(5)]
    mine = job(world, "4", name="inside")
    run_cycle()
    mine.refresh_from_db()
    assert mine.state == Job.State.ADMITTED and mine.reservation_id == gpr.pk
    assert set(mine.allocations.values_list("gpu_id", flat=True)) == set(gpr.devices.values_list("pk", flat=True))
    states = sorted(Job.objects.get(pk=t.pk).state for t in theirs)
    assert states.count(Job.State.ADMITTED) == 4 and states.count(Job.State.QUEUED) == 1
    waiting = Job.objects.get(pk=next(t.pk for t in theirs if Job.objects.get(pk=t.pk).state == Job.State.QUEUED))
    assert "team-a's reservation" in waiting.wait_reason
    actions.do_release(gpr, acting_user=world.alice)
    mine.refresh_from_db()
    assert mine.reservation_id is None  # ordinary work from now on


def test_an_alert_rule_fires_on_a_reservation_left_idle_and_resolves_once_used(world: World) -> None:
    rule = do_save_rule(None, name="idle reservation", kind="reservation_idle", workspace=world.team_a,
                        threshold=Decimal("600"), acting_user=world.alice)  # fmt: skip
    gpr = ask(world, gpus=2)
    theirs = ask(world, gpus=2, workspace=world.team_b)  # another workspace's: not this rule's
    began = gpr.held_start + timedelta(seconds=1)
    actions.upkeep(began)
    assert ProvisioningRequest.objects.get(pk=theirs.pk).idle_since == began
    evaluate(began + timedelta(seconds=300))
    assert not Alert.objects.exists()
    evaluate(began + timedelta(seconds=700))
    alert = Alert.objects.get(rule=rule)
    assert (alert.state, alert.labels["gpr"], alert.labels["workspace"]) == ("firing", str(gpr.pk), "team-a")
    ProvisioningRequest.objects.filter(pk=gpr.pk).update(idle_since=None)  # its work runs there now
    evaluate(began + timedelta(seconds=800))
    assert Alert.objects.get(rule=rule).state == "resolved"
