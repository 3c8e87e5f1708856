"""GPU provisioning requests through the API (``/api/v1/gprs/``): asked, estimated, refused per
field, decided by the policy or an admin, changed, withdrawn, and seen by whom.

The world's local cluster has 8 H100 on one node; team-a's quota is 4 of them, and the portal's
default policy approves by itself what fits the quota and lasts at most a day (14 days at most).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.inventory.models import GPU, Allocation
from apps.jobs.actions import check_submit_job
from apps.provisioning import actions
from apps.provisioning.models import ProvisioningPolicy, ProvisioningRequest
from apps.workloads.models import Workload
from tests.personas import World

State = ProvisioningRequest.State


def ask(world: World, user: Any, **data: Any) -> Any:
    body = {"workspace": "team-a", "gpu_type": "h100", "gpus": 2, "duration": "6h",
            "justification": "Fine-tuning before the deadline.", **data}  # fmt: skip
    return world.client(user).post("/api/v1/gprs/", body, format="json")


def asked(world: World, user: Any, **data: Any) -> dict[str, Any]:
    answer = ask(world, user, **data)
    assert answer.status_code == 201, answer.json()
    return answer.json()


def later(days: float) -> str:
    return (timezone.now() + timedelta(days=days)).isoformat()


def moment(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_it_approves_at_once_what_fits_the_quota_and_the_policy(world: World) -> None:
    data = asked(world, world.bob, gpus=2, duration="6h", priority=5)
    assert (data["state"], data["auto_approved"], data["workspace"], data["requested_by"]) == (
        "APPROVED", True, "team-a", "bob"
    )  # fmt: skip
    assert (data["gpus"], data["held_gpus"], data["held_cluster"], data["duration_s"], data["priority"]) == (
        2, 2, "local", 6 * 3600, 5
    )  # fmt: skip
    assert data["asap"] is True and data["cluster"] is None and data["in_use"] == 0
    assert moment(data["held_end"]) - moment(data["held_start"]) == timedelta(hours=6)
    assert data["earliest_start"] == data["held_start"]
    assert data["url"].endswith(f"/{data['id']}/")
    steps = world.client(world.victor).get(f"/api/v1/gprs/{data['id']}/events/").json()
    assert [step["kind"] for step in steps] == ["requested", "approved"]
    assert steps[0]["actor"] == "bob" and "6 hours" in steps[0]["message"]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"gpus": 5}, "exceed the workspace's quota of 4"),  # beyond its quota
        ({"duration": "2d"}, "longer than the 24 hours"),  # beyond what the policy approves by itself
    ],
)
def test_it_leaves_to_an_admin_what_the_policy_does_not_approve(world: World, data: dict[str, Any], why: str) -> None:
    made = asked(world, world.alice, **data)
    held = (made["state"], made["held_start"], made["held_gpus"], made["auto_approved"])
    assert held == ("REQUESTED", None, 0, False)
    assert made["earliest_start"] is not None
    steps = world.client(world.alice).get(f"/api/v1/gprs/{made['id']}/events/").json()
    assert steps[-1]["kind"] == "pending" and why in steps[-1]["message"], steps


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"gpu_type": "a100"}, "gpu_type", "No cluster has a100 GPUs"),
        ({"gpu_type": "H100!"}, "gpu_type", "short lowercase name"),
        ({"gpus": 0}, "gpus", "greater than or equal to 1"),
        ({"gpus": 9}, "gpus", "more than any one cluster could ever hold (at most 8 ready)"),
        ({"gpus": "2"}, "gpus", "Expected a whole number"),
        ({"start_at": "2020-01-01T00:00:00Z"}, "start_at", "lies in the past"),
        ({"duration": "15d"}, "duration", "At most 14 days"),
        ({"duration": None, "duration_s": 15 * 86400}, "duration_s", "At most 14 days"),
        ({"duration": "soon"}, "duration", "not a duration"),
        ({"duration": "5m"}, "duration", "from 10 minutes"),
        ({"duration": None}, "duration", "Say how long"),
        ({"duration_s": 3600}, "duration", "not both"),
        ({"cluster": "nowhere"}, "cluster", "No cluster is named nowhere"),
        ({"justification": None}, "justification", "required"),
        ({"justification": "   "}, "justification", "Say what the GPUs are for"),
        ({"start_at": "9999-12-31T00:00:00Z"}, "start_at", "within a year"),
        ({"justification": "x" * 2001}, "justification", "no more than 2000"),
        ({"priority": 101}, "priority", "less than or equal to 100"),
        ({"workspace": "team-b"}, "workspace", "does not exist"),
        ({"color": "red"}, "color", "Unknown field"),
    ],
)
def test_it_refuses_bad_terms_naming_the_field_and_saves_nothing(
    world: World, data: dict[str, Any], field: str, words: str
) -> None:
    answer = ask_changed(world, data)
    assert answer.status_code == 400, answer.json()
    fields = answer.json()["error"]["fields"]
    assert field in fields, fields
    assert words in " ".join(fields[field]), fields
    assert not ProvisioningRequest.objects.exists()


def ask_changed(world: World, changes: dict[str, Any]) -> Any:
    """Alice's request of `ask`, with `changes`: a key set to None is left out."""
    body = {"workspace": "team-a", "gpu_type": "h100", "gpus": 2, "duration": "6h",
            "justification": "Fine-tuning before the deadline.", **changes}  # fmt: skip
    return world.client(world.alice).post("/api/v1/gprs/", {k: v for k, v in body.items() if v is not None},
                                          format="json")  # fmt: skip


def test_a_viewer_reads_but_cannot_ask(world: World) -> None:
    made = asked(world, world.alice)
    victor = world.client(world.victor)
    refused = ask(world, world.victor)
    assert refused.status_code == 403 and not ProvisioningRequest.objects.exclude(pk=made["id"]).exists()
    assert victor.get(f"/api/v1/gprs/{made['id']}/").json()["justification"] == "Fine-tuning before the deadline."
    assert victor.post(f"/api/v1/gprs/{made['id']}/cancel/").status_code == 403
    assert victor.patch(f"/api/v1/gprs/{made['id']}/", {"gpus": 1}, format="json").status_code == 403
    assert ProvisioningRequest.objects.get(pk=made["id"]).state == State.APPROVED


def test_another_tenants_request_is_not_found_anywhere(world: World) -> None:
    theirs = asked(world, world.charlie, workspace="team-b")
    alice = world.client(world.alice)
    url = f"/api/v1/gprs/{theirs['id']}/"
    assert alice.get(url).status_code == 404
    assert alice.get(f"{url}events/").status_code == 404
    assert alice.patch(url, {"gpus": 1}, format="json").status_code == 404
    for verb in ("cancel", "release", "approve", "reject", "decide-change"):
        assert alice.post(f"{url}{verb}/", {}, format="json").status_code == 404, verb
    assert theirs["id"] not in [row["id"] for row in alice.get("/api/v1/gprs/").json()["results"]]
    row = ProvisioningRequest.objects.get(pk=theirs["id"])
    assert (row.state, row.gpus) == (State.APPROVED, 2)


def test_only_an_admin_decides_and_may_change_the_terms(world: World) -> None:
    pending = asked(world, world.alice, gpus=4, duration="2d", start_at=later(3))
    url = f"/api/v1/gprs/{pending['id']}/"
    bob = world.client(world.bob)
    assert bob.post(f"{url}approve/", {}, format="json").status_code == 403
    assert bob.post(f"{url}reject/", {"reason": "no"}, format="json").status_code == 403
    assert ProvisioningRequest.objects.get(pk=pending["id"]).state == State.REQUESTED

    admin = world.client(world.admin)
    queue = admin.get("/api/v1/gprs/", {"state": "REQUESTED"}).json()["results"]
    assert [row["id"] for row in queue] == [pending["id"]]
    start = timezone.now() + timedelta(days=4)
    more = admin.post(f"{url}approve/", {"gpus": 5}, format="json")
    assert more.status_code == 400 and "fewer GPUs" in more.json()["error"]["fields"]["gpus"][0]
    approved = admin.post(f"{url}approve/", {"gpus": 3, "duration": "1d", "start_at": start.isoformat(),
                                             "reason": "Three from Thursday."}, format="json")  # fmt: skip
    assert approved.status_code == 200, approved.json()
    data = approved.json()
    assert (data["state"], data["gpus"], data["held_gpus"], data["duration_s"], data["decided_by"]) == (
        "APPROVED", 3, 3, 86400, "admin"
    )  # fmt: skip
    assert moment(data["held_start"]) >= start - timedelta(seconds=1) and data["auto_approved"] is False
    assert data["decision_reason"] == "Three from Thursday."
    again = admin.post(f"{url}approve/", {}, format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"


def test_a_rejection_says_why(world: World) -> None:
    pending = asked(world, world.alice, gpus=6)
    url = f"/api/v1/gprs/{pending['id']}/reject/"
    admin = world.client(world.admin)
    for body in ({}, {"reason": "  "}):
        refused = admin.post(url, body, format="json")
        assert refused.status_code == 400 and "reason" in refused.json()["error"]["fields"], refused.json()
    assert ProvisioningRequest.objects.get(pk=pending["id"]).state == State.REQUESTED
    rejected = admin.post(url, {"reason": "The cluster is booked for the review."}, format="json").json()
    assert (rejected["state"], rejected["decision_reason"]) == ("REJECTED", "The cluster is booked for the review.")


def test_cancel_and_release_refuse_what_their_state_does_not_allow(world: World) -> None:
    alice = world.client(world.alice)
    ahead = asked(world, world.alice, start_at=later(2))
    url = f"/api/v1/gprs/{ahead['id']}/"
    early = alice.post(f"{url}release/")
    assert early.status_code == 409 and "cannot be released" in early.json()["error"]["message"]
    assert alice.post(f"{url}cancel/").json()["state"] == "CANCELLED"
    twice = alice.post(f"{url}cancel/")
    assert twice.status_code == 409 and "cannot be cancelled" in twice.json()["error"]["message"]

    now = asked(world, world.alice)
    actions.upkeep()  # it begins
    url = f"/api/v1/gprs/{now['id']}/"
    late = alice.post(f"{url}cancel/")
    assert late.status_code == 409, late.json()
    released = alice.post(f"{url}release/").json()
    assert released["state"] == "RELEASED" and moment(released["held_end"]) <= timezone.now()
    assert alice.post(f"{url}release/").status_code == 409


def test_a_pending_request_is_changed_and_checked_again(world: World) -> None:
    pending = asked(world, world.bob, gpus=6)
    url = f"/api/v1/gprs/{pending['id']}/"
    bob = world.client(world.bob)
    changed = bob.patch(url, {"gpus": 3, "duration": "12h", "start_at": later(1)}, format="json")
    assert changed.status_code == 200, changed.json()
    assert (changed.json()["gpus"], changed.json()["duration_s"], changed.json()["asap"]) == (3, 12 * 3600, False)
    too_many = bob.patch(url, {"gpus": 9}, format="json")
    assert too_many.status_code == 400 and "gpus" in too_many.json()["error"]["fields"]
    too_long = bob.patch(url, {"duration": "20d"}, format="json")
    assert too_long.status_code == 400 and "duration" in too_long.json()["error"]["fields"]
    nothing = bob.patch(url, {}, format="json")
    assert nothing.status_code == 400 and "gpus" in nothing.json()["error"]["fields"]
    assert ProvisioningRequest.objects.get(pk=pending["id"]).gpus == 3


def test_an_estimate_says_when_and_whether_at_once_and_saves_nothing(world: World) -> None:
    alice = world.client(world.alice)
    body = {"workspace": "team-a", "gpu_type": "h100", "gpus": 2, "duration": "6h", "justification": "Try."}
    quick = alice.post("/api/v1/gprs/estimate/", body, format="json")
    assert quick.status_code == 200, quick.json()
    data = quick.json()
    assert (data["cluster"], data["gpus"], data["auto_approve"], data["needs_admin"]) == ("local", 2, True, "")
    assert abs(moment(data["earliest_start"]) - timezone.now()) < timedelta(minutes=1)
    big = alice.post("/api/v1/gprs/estimate/", {**body, "gpus": 6}, format="json").json()
    assert big["auto_approve"] is False and "quota of 4" in big["needs_admin"]
    # Beside a reservation of 6 for the next day, 4 more can only begin when it ends.
    ProvisioningPolicy.objects.create(workspace=world.team_b, auto_approve_max_s=86400 * 2, max_duration_s=86400 * 3)
    held = asked(world, world.admin, workspace="team-b", gpus=6, duration="1d")
    assert held["state"] == "REQUESTED"
    world.client(world.admin).post(f"/api/v1/gprs/{held['id']}/approve/", {}, format="json")
    after = alice.post("/api/v1/gprs/estimate/", {**body, "gpus": 4}, format="json").json()
    assert moment(after["earliest_start"]) >= moment(held["earliest_start"]) + timedelta(days=1) - timedelta(seconds=5)
    past = alice.post("/api/v1/gprs/estimate/", {**body, "start_at": "2020-01-01T00:00:00Z"}, format="json")
    assert past.status_code == 400 and "start_at" in past.json()["error"]["fields"]
    assert world.client(world.victor).post("/api/v1/gprs/estimate/", body, format="json").status_code == 403
    assert ProvisioningRequest.objects.count() == 1


def test_the_calendar_shows_everyones_reservations_without_their_details(world: World) -> None:
    asked(world, world.charlie, workspace="team-b", gpus=3, start_at=later(2),
                   justification="A secret project.")  # fmt: skip
    ours = asked(world, world.alice, gpus=1)
    asked(world, world.alice, gpus=5)  # pending: holds nothing
    listed = world.client(world.alice).get("/api/v1/gprs/calendar/", {"to": later(7)})
    assert listed.status_code == 200, listed.json()
    rows = listed.json()
    assert [(r["workspace"], r["gpus"], r["state"]) for r in rows] == [("team-a", 1, "APPROVED"),
                                                                        ("team-b", 3, "APPROVED")]  # fmt: skip
    assert set(rows[1]) == {"workspace", "gpu_type", "gpus", "cluster", "start", "end", "state"}
    assert "secret" not in listed.content.decode().lower()
    assert rows[0]["start"] == ours["held_start"] and rows[1]["cluster"] == "local"
    soon = world.client(world.alice).get("/api/v1/gprs/calendar/", {"to": later(1)}).json()
    assert [r["workspace"] for r in soon] == ["team-a"]  # the window: team-b's begins later
    backwards = world.client(world.alice).get("/api/v1/gprs/calendar/", {"from": later(2), "to": later(1)})
    assert backwards.status_code == 400 and "to" in backwards.json()["error"]["fields"]
    odd = world.client(world.alice).get("/api/v1/gprs/calendar/", {"since": later(1)})
    assert odd.status_code == 400 and "since" in odd.json()["error"]["fields"]


def test_lists_filter_by_state_type_and_workspace(world: World) -> None:
    approved = asked(world, world.alice)
    pending = asked(world, world.alice, gpus=5)
    theirs = asked(world, world.charlie, workspace="team-b")
    alice, admin = world.client(world.alice), world.client(world.admin)

    def ids(client: Any, **params: str) -> list[int]:
        answer = client.get("/api/v1/gprs/", params)
        assert answer.status_code == 200, answer.json()
        return sorted(row["id"] for row in answer.json()["results"])

    assert ids(alice) == sorted([approved["id"], pending["id"]])
    assert ids(alice, state__in="REQUESTED,APPROVED") == sorted([approved["id"], pending["id"]])
    assert ids(alice, state="APPROVED") == [approved["id"]]
    assert ids(admin, state="APPROVED") == sorted([approved["id"], theirs["id"]])
    assert ids(admin, workspace="team-b") == [theirs["id"]]
    assert ids(admin, gpu_type="a100") == []
    wrong = alice.get("/api/v1/gprs/", {"state__in": "APPROVED,LOST"})
    assert wrong.status_code == 400 and "LOST" in wrong.json()["error"]["fields"]["state__in"][0]


def test_in_use_counts_the_devices_its_work_runs_on_in_lists_too(world: World) -> None:
    made = asked(world, world.alice, gpus=2)
    actions.upkeep()  # it begins
    gpr = ProvisioningRequest.objects.get(pk=made["id"])
    held = list(gpr.devices.order_by("index"))
    ours = check_submit_job(world.team_a, name="tune", command="sleep 100", gpu_type="h100",
                            gpus_per_replica=Decimal(1), acting_user=world.alice)  # fmt: skip
    Workload.objects.filter(pk=ours.pk).update(reservation=gpr, state="RUNNING")
    Allocation.objects.create(gpu=held[0], fraction=Decimal(1), workload=ours)
    other = check_submit_job(world.team_a, name="other", command="sleep 100", gpu_type="h100",
                             gpus_per_replica=Decimal(1), acting_user=world.alice)  # fmt: skip
    Allocation.objects.create(gpu=GPU.objects.exclude(pk__in=[g.pk for g in held]).first(), fraction=Decimal(1),
                              workload=other)  # fmt: skip
    alice = world.client(world.alice)
    assert actions.in_use(gpr) == 1
    assert alice.get(f"/api/v1/gprs/{gpr.pk}/").json()["in_use"] == 1
    [listed] = alice.get("/api/v1/gprs/").json()["results"]
    assert (listed["in_use"], listed["held_gpus"], listed["state"]) == (1, 2, "ACTIVE")


def test_a_list_costs_the_same_queries_however_long(world: World, django_assert_max_num_queries: Any) -> None:
    alice = world.client(world.alice)
    for _ in range(2):
        asked(world, world.alice, gpus=1, start_at=later(2))
    with CaptureQueriesContext(connection) as captured:
        assert len(alice.get("/api/v1/gprs/").json()["results"]) == 2
    few = len(captured)  # read now: the next request empties the log it reads
    for _ in range(10):
        asked(world, world.alice, gpus=1, start_at=later(2))
    assert few > 0
    with django_assert_max_num_queries(few):
        assert len(alice.get("/api/v1/gprs/").json()["results"]) == 12


def test_a_longer_approved_request_waits_for_an_admins_decision(world: World) -> None:
    made = asked(world, world.bob, start_at=later(2))
    url = f"/api/v1/gprs/{made['id']}/"
    bob, admin = world.client(world.bob), world.client(world.admin)
    nothing = admin.post(f"{url}decide-change/", {"approve": True}, format="json")
    assert nothing.status_code == 409 and "No change" in nothing.json()["error"]["message"]
    longer = bob.patch(url, {"duration": "2d"}, format="json").json()  # beyond the day the policy approves
    assert (longer["duration_s"], longer["pending_change"]["duration_s"]) == (6 * 3600, 2 * 86400)
    assert bob.post(f"{url}decide-change/", {"approve": True}, format="json").status_code == 403
    decided = admin.post(f"{url}decide-change/", {"approve": True, "reason": "Fine."}, format="json").json()
    assert (decided["duration_s"], decided["pending_change"]) == (2 * 86400, None)
    assert moment(decided["held_end"]) - moment(decided["held_start"]) == timedelta(days=2)
