"""GPU provisioning requests through the SDK (``client.gprs``), against a live embedded portal over
real HTTP.

The portal's local cluster has 8 H100; workspace demo-team's quota is 4 of them, and the portal's
default policy approves by itself what fits the quota and lasts at most a day. Every request here
starts days ahead, so that nothing is held while the other SDK tests run, and each is withdrawn
before its test ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from gpuportal import GPR, Client, Conflict, NotFound, PermissionDenied, Reservation, SpecError, ValidationError

from tests.sdk.conftest import LivePortal

pytestmark = pytest.mark.slow

WHY = "Fine-tuning before the review."


def days_ahead(days: float) -> datetime:
    return datetime.now(UTC) + timedelta(days=days)


@contextmanager
def withdrawn(client: Client) -> Iterator[list[GPR]]:
    """The requests a test makes (it appends them), cancelled at its end whatever happened."""
    made: list[GPR] = []
    try:
        yield made
    finally:
        for gpr in made:
            if gpr.refresh().state in ("REQUESTED", "APPROVED"):
                client.gprs.cancel(gpr)


def test_a_request_is_estimated_made_changed_seen_and_cancelled(portal_client: Client) -> None:
    start = days_ahead(3)
    terms = {"workspace": "demo-team", "gpu_type": "h100", "gpus": 2, "duration": "6h", "start": start}
    estimate = portal_client.gprs.estimate(**terms)
    assert (estimate.cluster, estimate.gpus, estimate.auto_approve, estimate.needs_admin) == ("local", 2, True, "")
    assert estimate.earliest_start is not None and estimate.earliest_start >= start - timedelta(seconds=1)
    with withdrawn(portal_client) as made:
        gpr = portal_client.gprs.create(justification=WHY, priority=10, **terms)
        made.append(gpr)
        assert (gpr.state, gpr.auto_approved, gpr.held_gpus, gpr.held_cluster, gpr.priority) == (
            "APPROVED", True, 2, "local", 10
        )  # fmt: skip
        assert gpr.held_start == estimate.earliest_start and gpr.duration_s == 6 * 3600
        assert portal_client.gprs.get(gpr.id).justification == WHY
        assert gpr.id in [g.id for g in portal_client.gprs.list("demo-team", state=["REQUESTED", "APPROVED"])]
        assert [e.kind for e in gpr.events()] == ["requested", "approved"]

        gpr.modify(duration=timedelta(hours=3))
        assert gpr.held_end is not None and gpr.held_start is not None
        assert (gpr.duration_s, gpr.held_end - gpr.held_start) == (3 * 3600, timedelta(hours=3))
        booked = portal_client.gprs.calendar(days_ahead(2), days_ahead(5))
        ours = Reservation(workspace="demo-team", gpu_type="h100", gpus=2, cluster="local", start=gpr.held_start,
                           end=gpr.held_end, state="APPROVED")  # fmt: skip
        assert ours.summary() in [r.summary() for r in booked]

        assert gpr.cancel().state == "CANCELLED"
        with pytest.raises(Conflict, match="cannot be cancelled"):
            gpr.cancel()
        with pytest.raises(Conflict, match="cannot be released"):
            portal_client.gprs.release(gpr.id)


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"gpus": 0}, "gpus", "greater than or equal to 1"),
        ({"gpus": 9}, "gpus", "could ever hold"),
        ({"gpu_type": "a100"}, "gpu_type", "No cluster has a100 GPUs"),
        ({"start": datetime(2020, 1, 1, tzinfo=UTC)}, "start_at", "in the past"),
        ({"duration": "20d"}, "duration", "At most 14 days"),
        ({"duration": 20 * 86400}, "duration_s", "At most 14 days"),
        ({"cluster": "nowhere"}, "cluster", "No cluster is named nowhere"),
    ],
)
def test_refused_terms_raise_a_validation_error_naming_the_field(
    portal_client: Client, changes: dict[str, object], field: str, words: str
) -> None:
    terms = {"workspace": "demo-team", "gpu_type": "h100", "gpus": 1, "duration": "1h", "start": days_ahead(3),
             "justification": WHY, **changes}  # fmt: skip
    before = len(portal_client.gprs.list("demo-team", limit=None))
    with pytest.raises(ValidationError) as refused:
        portal_client.gprs.create(**terms)
    assert words in " ".join(refused.value.fields[field]), refused.value.fields
    assert len(portal_client.gprs.list("demo-team", limit=None)) == before


def test_what_cannot_be_sent_or_found_is_said_so(portal_client: Client) -> None:
    with pytest.raises(NotFound, match="GPR 987654321 was not found"):
        portal_client.gprs.get(987654321)
    with pytest.raises(SpecError, match="gpus: give gpus, duration or start"):
        portal_client.gprs.modify(987654321)
    with pytest.raises(SpecError, match="start: 'tomorrow' is not a time"):
        portal_client.gprs.estimate(gpu_type="h100", gpus=1, duration="1h", start="tomorrow")


def test_an_admin_approves_with_changes_or_rejects_saying_why(portal_client: Client, live_portal: LivePortal) -> None:
    with Client.login(live_portal.url, "admin", live_portal.passwords["admin"]) as admin, withdrawn(admin) as made:
        big = portal_client.gprs.create(workspace="demo-team", gpu_type="h100", gpus=6, duration="12h",
                                        start=days_ahead(4), justification=WHY)  # fmt: skip
        made.append(big)
        assert big.state == "REQUESTED" and big.held_start is None
        with pytest.raises(PermissionDenied, match="Only platform admins"):
            portal_client.gprs.approve(big, gpus=3)
        assert big.id in [g.id for g in admin.gprs.list(state="REQUESTED")]
        approved = admin.gprs.approve(big, gpus=3, duration="6h", start=days_ahead(5), reason="Three will do.")
        assert (approved.state, approved.held_gpus, approved.duration_s, approved.decided_by) == (
            "APPROVED", 3, 6 * 3600, "admin"
        )  # fmt: skip
        assert approved.decision_reason == "Three will do." and not approved.auto_approved

        other = portal_client.gprs.create(workspace="demo-team", gpu_type="h100", gpus=5, duration="1h",
                                          start=days_ahead(4), justification=WHY)  # fmt: skip
        made.append(other)
        with pytest.raises(ValidationError) as blank:
            admin.gprs.reject(other, "")
        assert "reason" in blank.value.fields
        rejected = admin.gprs.reject(other, "The cluster is booked for the review.")
        assert (rejected.state, rejected.decision_reason) == ("REJECTED", "The cluster is booked for the review.")
