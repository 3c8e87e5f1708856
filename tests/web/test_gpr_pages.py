"""The GPU reservation pages: the workspace's requests, the request form (the policy approves a small
request at once, leaves a large one to an admin; refusals beside their fields, a 400) and its
as-you-type estimate, a request's page (timeline, use of what it holds, Cancel / Release early /
Extend or shrink), the cluster's calendar (every workspace's reservations, never another's
justification), and the console's queue (earliest start, what approving would displace, Approve with
changes, Reject with a reason, extensions). Who may do what: another tenant's request is a 404
everywhere, a viewer sees no buttons and is refused every change with a 403, the console is for
admins alone."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from apps.inventory.models import GPU, Allocation
from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.provisioning import actions
from apps.provisioning.models import ProvisioningRequest
from tests.personas import World
from tests.web.conftest import queries

SignedIn = Callable[[Any], Client]
State = ProvisioningRequest.State
LIST = "/w/team-a/gprs/"
NEW = "/w/team-a/gprs/new/"
ESTIMATE = "/w/team-a/gprs/estimate.json"


def form(**fields: str) -> dict[str, str]:
    return {
        "gpu_type": "h100", "gpus": "2", "cluster": "", "start": "asap", "start_at": "", "duration": "8",
        "unit": "hours", "priority": "0", "justification": "Fine-tune the 70B model before the review", **fields,
    }  # fmt: skip


def ask(world: World, *, gpus: int = 2, hours: float = 8, workspace: Any = None, user: Any = None,
        justification: str = "Evaluation sweep") -> ProvisioningRequest:  # fmt: skip
    """A request made as the form makes it: checked, then recorded (and approved where the policy says so)."""
    asked = actions.check_request(workspace or world.team_a, gpu_type="h100", gpus=gpus, duration_s=int(hours * 3600))
    return actions.do_request(asked, priority=0, justification=justification, acting_user=user or world.alice)


def active(gpr: ProvisioningRequest) -> ProvisioningRequest:
    """The approved request once its start has come (the scheduler's upkeep begins it)."""
    assert gpr.held_start is not None
    actions.upkeep(now=max(gpr.held_start, timezone.now()))
    gpr.refresh_from_db()
    assert gpr.state == State.ACTIVE
    return gpr


def error_of(page: str, field: str) -> str:
    """The error shown beside a field ('' for none)."""
    found = page.split(f'id="{field}-error">', 1)
    return found[1].split("</div>", 1)[0] if len(found) == 2 else ""


def page_of(gpr: ProvisioningRequest) -> str:
    return f"/w/{gpr.workspace.name}/gprs/{gpr.pk}/"


def running_job(world: World, workspace: Any, gpu: GPU, *, preemptible: bool = True) -> Job:
    """A job of the workspace running on one device, as the scheduler leaves it."""
    user = world.charlie if workspace == world.team_b else world.bob
    job = check_submit_job(workspace, name="busy", command="sleep 1000", gpu_type="h100",
                           gpus_per_replica=Decimal(1), acting_user=user)  # fmt: skip
    Job.objects.filter(pk=job.pk).update(state="RUNNING", preemptible=preemptible, cluster=gpu.node.pool.cluster,
                                         admitted_at=timezone.now(), started_at=timezone.now())  # fmt: skip
    Allocation.objects.create(gpu=gpu, fraction=Decimal(1), workload=job)
    return job


# -- the form ------------------------------------------------------------------------------------------


def test_the_policy_approves_a_small_request_at_once(world: World, signed_in: SignedIn) -> None:
    client = signed_in(world.alice)
    response = client.post(NEW, form())
    gpr = ProvisioningRequest.objects.get()
    assert response.status_code == 302 and response["Location"] == page_of(gpr)
    assert (gpr.state, gpr.auto_approved, gpr.gpus, gpr.duration_s, gpr.requested_by) == (
        State.APPROVED, True, 2, 8 * 3600, world.alice,
    )  # fmt: skip
    shown = client.get(page_of(gpr)).content.decode()
    assert "was approved by the workspace&#x27;s policy" in shown
    assert 'data-state="APPROVED"' in shown and gpr.justification in shown
    assert shown.count("<code>") >= 2  # its two devices, named


def test_a_request_beyond_the_quota_waits_for_an_admin(world: World, signed_in: SignedIn) -> None:
    response = signed_in(world.alice).post(NEW, form(gpus="6", start="at", start_at=_hence(days=2), duration="2",
                                                     unit="days", priority="7"))  # fmt: skip
    gpr = ProvisioningRequest.objects.get()
    assert response.status_code == 302
    assert (gpr.state, gpr.gpus, gpr.asap, gpr.duration_s, gpr.priority) == (State.REQUESTED, 6, False, 2 * 86400, 7)
    shown = signed_in(world.alice).get(page_of(gpr)).content.decode()
    assert "Waits for an admin" in shown and 'data-state="REQUESTED"' in shown


@pytest.mark.parametrize(
    ("fields", "field", "said"),
    [
        ({"gpus": "9"}, "gpus", "more than any one cluster could ever hold"),
        ({"gpus": "two"}, "gpus", "whole number"),
        ({"justification": " "}, "justification", "Say what the GPUs are for"),
        ({"start": "at", "start_at": "2020-01-01T10:00"}, "start_at", "lies in the past"),
        ({"start": "at", "start_at": "soon"}, "start_at", "date and a time"),
        ({"duration": "15", "unit": "days"}, "duration", "At most 14 days for workspace team-a"),
        ({"gpu_type": "a100"}, "gpu_type", "No cluster has a100 GPUs"),
        ({"cluster": "elsewhere"}, "cluster", "No cluster named elsewhere"),
    ],
)
def test_a_refusal_is_shown_beside_its_field(
    world: World, signed_in: SignedIn, fields: dict[str, str], field: str, said: str
) -> None:
    response = signed_in(world.alice).post(NEW, form(**fields))
    assert response.status_code == 400
    assert said in error_of(response.content.decode(), field)
    assert not ProvisioningRequest.objects.exists()


def test_the_estimate_says_the_earliest_start_and_who_decides(world: World, signed_in: SignedIn) -> None:
    client = signed_in(world.alice)
    small = client.get(ESTIMATE, form()).json()
    assert small["ok"] and small["auto"] and small["start_text"] == "now" and small["cluster"] == "local"
    ask(world, gpus=4, hours=6, workspace=world.team_b, user=world.charlie)  # holds 4 of the 8 for 6 hours
    large = client.get(ESTIMATE, form(gpus="6")).json()
    assert large["ok"] and not large["auto"] and "exceed the workspace's quota of 4" in large["why"]
    assert 5.9 * 3600 < (_parse(large["start"]) - timezone.now()).total_seconds() <= 6 * 3600
    refused = client.get(ESTIMATE, form(gpus="9", justification=""))
    assert refused.status_code == 400 and "could ever hold" in refused.json()["errors"]["gpus"][0]


# -- the list and a request's page -----------------------------------------------------------------------


def test_the_list_shows_each_request_with_its_use(world: World, signed_in: SignedIn) -> None:
    busy = active(ask(world, gpus=2))
    job = running_job(world, world.team_a, busy.devices.first())
    Job.objects.filter(pk=job.pk).update(reservation=busy)
    ask(world, gpus=6, hours=72)
    client = signed_in(world.alice)
    shown = client.get(LIST).content.decode()
    row = shown.split(f'data-gpr="{busy.pk}"', 1)[1].split("</tr>", 1)[0]
    assert "Active" in row and "1 of 2" in row and "2 × H100" in row
    assert shown.count("data-gpr=") == 2 and "Request GPUs" in shown
    # A list of many requests, active ones among them, costs what a list of two does.
    two = queries(client, LIST)
    extra = ask(world, gpus=1, hours=100)  # longer than the policy approves by itself
    active(actions.do_approve(extra, acting_user=world.admin))
    for _ in range(3):
        ask(world, gpus=1, hours=100)
    assert queries(client, LIST) == two


def test_a_requests_page_shows_its_devices_use_and_timeline(world: World, signed_in: SignedIn) -> None:
    gpr = active(ask(world, gpus=2))
    device = gpr.devices.order_by("index").first()
    job = running_job(world, world.team_a, device)
    Job.objects.filter(pk=job.pk).update(reservation=gpr)
    shown = signed_in(world.bob).get(page_of(gpr)).content.decode()
    assert 'data-state="ACTIVE"' in shown and "1 of 2 GPUs" in shown
    devices = shown.split('id="gpr-devices"', 1)[1].split("</table>", 1)[0]
    assert f"{device.node.name}:{device.index}" in devices and "busy" in devices
    timeline = shown.split('id="gpr-timeline"', 1)[1].split("</ol>", 1)[0]
    assert [k for k in re.findall(r'data-kind="(\w+)"', timeline)] == ["requested", "approved", "began"]
    assert "Release early…" in shown and "Cancel request" not in shown and "Extend or shrink" in shown


# -- changes -----------------------------------------------------------------------------------------------


def test_cancel_release_and_change(world: World, signed_in: SignedIn) -> None:
    client = signed_in(world.alice)
    waiting = ask(world, gpus=6, hours=72)
    asked = client.get(f"{page_of(waiting)}cancel/").content.decode()  # asks first
    assert f"Cancel request #{waiting.pk}?" in asked and "Cancel the request" in asked
    assert ProvisioningRequest.objects.get(pk=waiting.pk).state == State.REQUESTED
    response = client.post(f"{page_of(waiting)}cancel/", follow=True)
    assert f"Request {waiting.pk} was cancelled" in response.content.decode()
    assert ProvisioningRequest.objects.get(pk=waiting.pk).state == State.CANCELLED

    held = active(ask(world, gpus=3))
    response = client.post(f"{page_of(held)}modify/", {"gpus": "1", "duration": "8", "unit": "hours"})
    assert response.status_code == 302
    assert (held.devices.count(), ProvisioningRequest.objects.get(pk=held.pk).gpus) == (1, 1)
    response = client.post(f"{page_of(held)}modify/", {"gpus": "1", "duration": "3", "unit": "days"}, follow=True)
    held.refresh_from_db()
    assert held.pending_change and held.duration_s == 8 * 3600
    assert "waits for an admin&#x27;s approval" in response.content.decode()
    response = client.post(f"{page_of(held)}release/", follow=True)
    assert "was released" in response.content.decode()
    assert ProvisioningRequest.objects.get(pk=held.pk).state == State.RELEASED


def test_a_change_its_state_no_longer_allows_is_a_409(world: World, signed_in: SignedIn) -> None:
    held = ask(world, gpus=2)
    waiting = ask(world, gpus=6, hours=72)
    response = signed_in(world.alice).post(f"{page_of(waiting)}release/")
    assert response.status_code == 409
    assert f"GPR {waiting.pk} is requested: it cannot be released." in response.content.decode()
    response = signed_in(world.alice).post(f"{page_of(held)}modify/", {"gpus": "3", "duration": "8", "unit": "hours"})
    assert response.status_code == 400 and "cannot grow" in error_of(response.content.decode(), "gpus")
    assert ProvisioningRequest.objects.get(pk=waiting.pk).state == State.REQUESTED


# -- who may do what -----------------------------------------------------------------------------------------


def test_another_tenants_request_is_a_404_everywhere(world: World, signed_in: SignedIn) -> None:
    gpr = ask(world, gpus=6, hours=72)
    charlie = signed_in(world.charlie)
    for url in (LIST, NEW, ESTIMATE, "/w/team-a/gprs/calendar/", page_of(gpr)):
        assert charlie.get(url).status_code == 404, url
    # Under his own workspace's name it is not found either.
    assert charlie.get(f"/w/team-b/gprs/{gpr.pk}/").status_code == 404
    for verb in ("cancel", "release", "modify"):
        assert charlie.post(f"/w/team-b/gprs/{gpr.pk}/{verb}/", {"gpus": "1", "duration": "1"}).status_code == 404
        assert charlie.post(f"{page_of(gpr)}{verb}/").status_code == 404
    for verb in ("cancel", "release"):
        assert charlie.get(f"{page_of(gpr)}{verb}/").status_code == 404
        assert charlie.get(f"/w/team-b/gprs/{gpr.pk}/{verb}/").status_code == 404
    assert ProvisioningRequest.objects.get(pk=gpr.pk).state == State.REQUESTED


def test_a_viewer_sees_the_pages_without_buttons_and_may_change_nothing(world: World, signed_in: SignedIn) -> None:
    gpr = ask(world, gpus=6, hours=72)
    victor = signed_in(world.victor)
    listed = victor.get(LIST).content.decode()
    assert f'data-gpr="{gpr.pk}"' in listed and "Request GPUs" not in listed
    shown = victor.get(page_of(gpr)).content.decode()
    assert "Cancel request" not in shown and "Extend or shrink" not in shown and 'action="' not in shown.split(
        '<main', 1)[1]  # fmt: skip
    assert victor.get(NEW).status_code == 403 and victor.post(NEW, form()).status_code == 403
    assert victor.get(ESTIMATE, form()).status_code == 403
    for verb in ("cancel", "release", "modify"):
        assert victor.post(f"{page_of(gpr)}{verb}/", {"gpus": "1", "duration": "1"}).status_code == 403
    assert victor.get(f"{page_of(gpr)}cancel/").status_code == 403
    assert ProvisioningRequest.objects.get(pk=gpr.pk).state == State.REQUESTED
    assert ProvisioningRequest.objects.count() == 1


# -- the calendar ------------------------------------------------------------------------------------------------


def test_the_calendar_shows_every_workspaces_reservations_but_no_others_justification(
    world: World, signed_in: SignedIn
) -> None:
    mine = ask(world, gpus=2, justification="our own plan")
    theirs = ask(world, gpus=4, hours=20, workspace=world.team_b, user=world.charlie, justification="secret plan B")
    ask(world, gpus=6, hours=72, justification="waiting plan")  # not approved: not on the calendar
    shown = signed_in(world.alice).get("/w/team-a/gprs/calendar/").content.decode()
    table = shown.split("gpr-calendar-table", 1)[1]
    assert f'data-reservation="{mine.pk}"' in table and f'data-reservation="{theirs.pk}"' in table
    assert table.count("data-reservation=") == 2
    assert "team-b" in table and "4 × H100" in table
    assert "secret plan B" not in shown and "waiting plan" not in shown
    assert page_of(mine) in table and f"/w/team-b/gprs/{theirs.pk}/" not in table
    assert shown.count('class="gpr-bar ') == 2


# -- the console ------------------------------------------------------------------------------------------------


def test_the_console_is_for_admins(world: World, signed_in: SignedIn) -> None:
    gpr = ask(world, gpus=6, hours=72)
    alice = signed_in(world.alice)
    assert alice.get("/console/gprs/").status_code == 403
    assert alice.get("/console/gprs/calendar/").status_code == 403
    assert alice.post(f"/console/gprs/{gpr.pk}/approve/").status_code == 403
    assert alice.post(f"/console/gprs/{gpr.pk}/reject/", {"reason": "no"}).status_code == 403
    assert ProvisioningRequest.objects.get(pk=gpr.pk).state == State.REQUESTED


def test_the_queue_says_what_approving_would_displace(world: World, signed_in: SignedIn) -> None:
    first = GPU.objects.order_by("index").first()
    running_job(world, world.team_b, first)  # preemptible: the reservation would take its device
    queued = check_submit_job(world.team_b, name="waits", command="true", gpu_type="h100",
                              gpus_per_replica=Decimal(1), acting_user=world.charlie)  # fmt: skip
    low = ask(world, gpus=8, hours=72)
    urgent = ask(world, gpus=6, hours=72)
    ProvisioningRequest.objects.filter(pk=urgent.pk).update(priority=9)
    shown = signed_in(world.admin).get("/console/gprs/").content.decode()
    assert shown.index(f'data-gpr="{urgent.pk}"') < shown.index(f'data-gpr="{low.pk}"')
    row = shown.split(f'data-gpr="{low.pk}"', 1)[1].split("</li>", 1)[0]
    assert "busy" in row and "team-b" in row and "no declared end" in row
    assert "1 workload of H100 queued in other workspaces" in row and queued.state == "QUEUED"


def test_an_admin_approves_with_changes_and_the_requester_is_mailed(world: World, signed_in: SignedIn) -> None:
    gpr = ask(world, gpus=6, hours=72)
    mail.outbox.clear()
    later = _hence(days=1)
    response = signed_in(world.admin).post(
        f"/console/gprs/{gpr.pk}/approve/", {"start_at": later, "gpus": "5", "duration": "48", "unit": "hours",
                                             "reason": "Five is what is free"}, follow=True,
    )  # fmt: skip
    assert f"Request {gpr.pk} was approved" in response.content.decode()
    gpr.refresh_from_db()
    assert (gpr.state, gpr.gpus, gpr.duration_s, gpr.decided_by) == (State.APPROVED, 5, 48 * 3600, world.admin)
    assert gpr.held_start is not None and gpr.held_start.strftime("%Y-%m-%dT%H:%M") == later
    [sent] = mail.outbox
    assert sent.to == ["alice@example.org"] and f"GPR {gpr.pk} approved" in sent.subject
    assert f"/w/team-a/gprs/{gpr.pk}/" in sent.body and "Five is what is free" in sent.body


def test_a_rejection_needs_a_reason(world: World, signed_in: SignedIn) -> None:
    gpr = ask(world, gpus=6, hours=72)
    admin = signed_in(world.admin)
    response = admin.post(f"/console/gprs/{gpr.pk}/reject/", {"reason": " "})
    assert response.status_code == 400 and "Say why it is rejected" in response.content.decode()
    assert ProvisioningRequest.objects.get(pk=gpr.pk).state == State.REQUESTED
    response = admin.post(f"/console/gprs/{gpr.pk}/approve/", {"gpus": "7"})
    assert response.status_code == 400 and "fewer GPUs than asked" in response.content.decode()
    admin.post(f"/console/gprs/{gpr.pk}/reject/", {"reason": "The cluster is booked for the review"})
    gpr.refresh_from_db()
    assert (gpr.state, gpr.decision_reason) == (State.REJECTED, "The cluster is booked for the review")
    again = admin.post(f"/console/gprs/{gpr.pk}/approve/")
    assert again.status_code == 409 and "it cannot be approved" in again.content.decode()
    shown = signed_in(world.alice).get(page_of(gpr)).content.decode()
    assert "The cluster is booked for the review" in shown and 'data-state="REJECTED"' in shown


def test_an_admin_decides_an_extension(world: World, signed_in: SignedIn) -> None:
    gpr = ask(world, gpus=2)
    actions.do_modify(gpr, duration_s=72 * 3600, acting_user=world.alice)
    admin = signed_in(world.admin)
    shown = admin.get("/console/gprs/").content.decode()
    assert f'data-change="{gpr.pk}"' in shown
    admin.post(f"/console/gprs/{gpr.pk}/change/", {"decision": "approve"})
    gpr.refresh_from_db()
    assert gpr.duration_s == 72 * 3600 and gpr.pending_change is None
    actions.do_modify(gpr, duration_s=96 * 3600, acting_user=world.alice)
    admin.post(f"/console/gprs/{gpr.pk}/change/", {"decision": "refuse", "reason": "Not this week"})
    gpr.refresh_from_db()
    assert gpr.duration_s == 72 * 3600 and gpr.pending_change is None
    assert "Not this week" in gpr.events.last().message


def _hence(**delta: float) -> str:
    return (timezone.now() + timedelta(**delta)).strftime("%Y-%m-%dT%H:%M")


def _parse(text: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(text)
