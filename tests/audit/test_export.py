"""The audit log exported through the API as CSV or JSON, with the list's filters and its tenancy:
an admin gets every event, a member their workspaces' and their own, another tenant nothing of
theirs; a cell a spreadsheet would run as a formula is made inert."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

from django.contrib.auth.models import Group
from django.utils import timezone

from apps.audit.actions import Origin, do_log_event
from apps.audit.events import Event
from apps.audit.models import AuditEvent
from tests.personas import World


def _export(client: object, query: str = "") -> object:
    response = client.get(f"/api/v1/audit-events/export/{query}")  # type: ignore[attr-defined]
    assert response.status_code == 200, response.content[:500]
    return response


def _csv(response: object) -> list[dict[str, str]]:
    body = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    return list(csv.DictReader(io.StringIO(body)))


def _json(response: object) -> list[dict[str, object]]:
    return json.loads(b"".join(response.streaming_content))  # type: ignore[attr-defined]


def test_an_admin_exports_every_event_and_filters_them(world: World) -> None:
    do_log_event(Event.WORKSPACE_UPDATE, world.team_b, acting_user=world.charlie, workspace=world.team_b,
                 origin=Origin(via="web", ip_address="10.1.2.3"), data={"display_name": "B"})  # fmt: skip
    admin = world.client(world.admin)
    everything = _csv(_export(admin))
    assert len(everything) == AuditEvent.objects.count() > 5
    assert [int(r["id"]) for r in everything] == sorted(int(r["id"]) for r in everything)  # oldest first
    row = next(r for r in everything if r["action"] == "workspace.update")
    assert (row["actor"], row["workspace"], row["ip_address"], json.loads(row["data"])) == (
        "charlie",
        "team-b",
        "10.1.2.3",
        {"display_name": "B"},
    )
    response = _export(admin, "?format=csv")
    assert response["Content-Type"].startswith("text/csv") and "attachment" in response["Content-Disposition"]

    filtered = _json(_export(admin, "?format=json&workspace=team-b&action=workspace.update&actor=charlie"))
    assert [e["action"] for e in filtered] == ["workspace.update"] and filtered[0]["ip_address"] == "10.1.2.3"
    later = (timezone.now() + timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    assert _json(_export(admin, f"?format=json&created_at__gte={later}")) == []


def test_a_member_exports_their_workspaces_events_and_no_other_tenants(world: World) -> None:
    do_log_event(Event.WORKSPACE_UPDATE, world.team_b, acting_user=world.charlie, workspace=world.team_b)
    alice = _json(_export(world.client(world.alice), "?format=json"))
    assert alice and all(e["workspace"] in ("team-a", "alice", None) for e in alice)
    assert not any(e["workspace"] == "team-b" for e in alice)
    assert _json(_export(world.client(world.alice), "?format=json&workspace=team-b")) == []


def test_bad_exports_get_a_clear_error(world: World) -> None:
    admin = world.client(world.admin)
    for query, field in (("?format=xml", "format"), ("?colour=red", "colour"), ("?created_at__gte=yesterday", None)):
        response = admin.get(f"/api/v1/audit-events/export/{query}")
        assert response.status_code == 400, (query, response.content[:300])
        if field:
            assert field in response.json()["error"]["fields"]
    assert world.client(world.admin).get("/api/v1/audit-events/export/").status_code == 200
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/audit-events/export/").status_code in (401, 403)


def test_a_cell_that_a_spreadsheet_would_run_is_inert(world: World) -> None:
    group = Group.objects.create(name="=2+3")
    do_log_event(Event.GROUP_CREATE, group, acting_user=world.admin)
    rows = _csv(_export(world.client(world.admin), "?action=group.create"))
    assert [row["target_repr"] for row in rows] == ["'=2+3"]
    assert all(not cell.startswith(("=", "+", "-", "@")) for row in rows for cell in row.values())
    assert _json(_export(world.client(world.admin), "?format=json&action=group.create"))[0]["target_repr"] == "=2+3"


def test_moments_with_any_offset_the_standard_allows_are_answered(world: World) -> None:
    """PostgreSQL refuses an offset past 15:59 and a moment before year 1 in UTC: the filter asks in
    UTC, and clamps what lies beyond the calendar."""
    admin = world.client(world.admin)
    total = AuditEvent.objects.count()
    for query, count in (
        ("created_at__lt=1148-02-26T05:18:53.65-19:22", 0),
        ("created_at__gte=0001-01-01T00:00:00%2B13:44", total),
        ("created_at__lt=9999-12-31T23:59:00-13:44", total),
    ):
        answer = admin.get(f"/api/v1/audit-events/?{query}")
        assert answer.status_code == 200 and answer.json()["count"] == count, (query, answer.content[:300])
    assert admin.get("/api/v1/audit-events/?created_at__lt=").status_code == 400
