"""`GET /api/v1/usage/`: who sees what, its input refused with the API's error shape, its CSV, and
work still running counted up to the report's moment."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework.test import APIClient

from apps.jobs.actions import check_submit_job, do_preempt_job, record_job_end, record_job_start
from apps.jobs.models import Job
from apps.workspaces.models import Workspace
from tests.accounting import history
from tests.personas import World

URL = "/api/v1/usage/"
NOV = datetime(2026, 11, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
def usage(world: World) -> World:
    """Two hours of one H100 in team-a by alice and half an A100 for four hours by bob, in
    November; charlie's two H100 for one hour in team-b, across the turn of the month."""
    history.job(world.team_a, world.alice, [(NOV + timedelta(days=3), NOV + timedelta(days=3, hours=2))])
    history.instance(
        world, world.team_a, world.bob, NOV + timedelta(days=9), NOV + timedelta(days=9, hours=4),
        gpu_type="a100", gpus=Decimal("0.5"),
    )  # fmt: skip
    history.job(world.team_b, world.charlie, [(DEC - timedelta(minutes=15), DEC + timedelta(minutes=45))], gpus=2)
    return world


def _rows(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.content
    rows: list[dict[str, Any]] = response.json()["rows"]
    return rows


def _cells(rows: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    return {(r["month"], r["workspace"], r["user"], r["gpu_type"], r["gpu_hours"]) for r in rows}


ALL = {
    ("2026-11", "team-a", "alice", "h100", "2.000000"),
    ("2026-11", "team-a", "bob", "a100", "2.000000"),
    ("2026-11", "team-b", "charlie", "h100", "0.500000"),
    ("2026-12", "team-b", "charlie", "h100", "1.500000"),
}


class TestWhoSeesWhat:
    def test_an_admin_sees_every_workspace(self, usage: World) -> None:
        assert _cells(_rows(usage.client(usage.admin).get(URL))) == ALL

    def test_an_owner_sees_their_workspace_and_nothing_of_others(self, usage: World) -> None:
        alice = usage.client(usage.alice)
        team_a = {cell for cell in ALL if cell[1] == "team-a"}
        assert _cells(_rows(alice.get(URL))) == team_a
        assert _cells(_rows(alice.get(URL, {"workspace": "team-a"}))) == team_a
        assert _rows(alice.get(URL, {"workspace": "team-b"})) == []
        # Another tenant's workspace answers as one that does not exist.
        assert _rows(alice.get(URL, {"workspace": "no-such-team"})) == []

    @pytest.mark.parametrize("persona", ["bob", "victor", "charlie"])
    def test_members_viewers_and_other_tenants_see_nothing_of_it(self, usage: World, persona: str) -> None:
        client = usage.client(getattr(usage, persona))
        assert _rows(client.get(URL)) == []
        assert _rows(client.get(URL, {"workspace": "team-a"})) == []
        assert _rows(client.get(URL, {"workspace": "team-b"})) == []

    def test_an_owner_of_a_workspace_through_its_assignment_sees_it(self, usage: World) -> None:
        usage.team_b.assigned_user = usage.charlie
        usage.team_b.save(update_fields=["assigned_user"])
        assert {cell[1] for cell in _cells(_rows(usage.client(usage.charlie).get(URL)))} == {"team-b"}

    def test_it_asks_who_you_are(self, usage: World) -> None:
        response = APIClient().get(URL)
        assert response.status_code == 401
        assert response.json()["error"]["status"] == 401

    def test_a_signed_in_page_session_may_read_it(self, usage: World) -> None:
        client = APIClient()
        client.force_login(usage.alice)
        assert {cell[1] for cell in _cells(_rows(client.get(URL)))} == {"team-a"}


class TestFilters:
    def test_it_reports_one_month(self, usage: World) -> None:
        response = usage.client(usage.admin).get(URL, {"month": "2026-12"})
        assert _cells(_rows(response)) == {cell for cell in ALL if cell[0] == "2026-12"}
        assert response.json()["month"] == "2026-12"

    def test_it_groups_as_asked(self, usage: World) -> None:
        admin = usage.client(usage.admin)
        by_workspace = _rows(admin.get(URL, {"month": "2026-11", "group_by": "workspace"}))
        assert _cells(by_workspace) == {
            ("2026-11", "team-a", None, None, "4.000000"),
            ("2026-11", "team-b", None, None, "0.500000"),
        }
        by_type = _rows(admin.get(URL, {"month": "2026-11", "group_by": "gpu_type,workspace"}))
        assert {(r["workspace"], r["gpu_type"], r["gpu_hours"]) for r in by_type} == {
            ("team-a", "h100", "2.000000"),
            ("team-a", "a100", "2.000000"),
            ("team-b", "h100", "0.500000"),
        }
        totals = _rows(admin.get(URL, {"group_by": ""}))
        assert _cells(totals) == {("2026-11", None, None, None, "4.500000"), ("2026-12", None, None, None, "1.500000")}

    @pytest.mark.parametrize("month", ["1000-01", "9999-12"])
    def test_it_reports_the_first_and_last_months_it_knows(self, usage: World, month: str) -> None:
        assert _rows(usage.client(usage.admin).get(URL, {"month": month})) == []

    def test_it_gives_exact_gpu_seconds_beside_the_hours(self, usage: World) -> None:
        [row] = _rows(usage.client(usage.admin).get(URL, {"month": "2026-12", "group_by": "workspace"}))
        assert row["gpu_seconds"] == "5400.000000000"
        assert row["gpu_hours"] == "1.500000"


class TestBadInput:
    @pytest.mark.parametrize(
        ("query", "field"),
        [
            ({"month": "2026-13"}, "month"),
            ({"month": "2026-00"}, "month"),
            ({"month": "26-11"}, "month"),
            ({"month": ""}, "month"),
            ({"group_by": "workspace,project"}, "group_by"),
            ({"group_by": ","}, "group_by"),
            ({"format": "xml"}, "format"),
            ({"workspace": "team\x00a"}, "workspace"),
            ({"colour": "blue"}, "colour"),
        ],
    )
    def test_it_refuses_it_naming_the_field(self, usage: World, query: dict[str, str], field: str) -> None:
        response = usage.client(usage.admin).get(URL, query)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["status"] == 400 and error["code"] == "invalid"
        assert list(error["fields"]) == [field]

    def test_it_refuses_a_parameter_given_twice(self, usage: World) -> None:
        response = usage.client(usage.admin).get(f"{URL}?month=2026-11&month=2026-12")
        assert response.status_code == 400
        assert list(response.json()["error"]["fields"]) == ["month"]


class TestCsv:
    def test_it_exports_the_same_rows_as_csv(self, usage: World) -> None:
        response = usage.client(usage.admin).get(URL, {"month": "2026-11", "format": "csv"})
        assert response.status_code == 200
        assert response["Content-Type"] == "text/csv; charset=utf-8"
        assert response["Content-Disposition"] == 'attachment; filename="gpu-usage-2026-11.csv"'
        lines = list(csv.reader(io.StringIO(response.content.decode())))
        assert lines == [
            ["month", "workspace", "user", "gpu_type", "gpu_hours", "gpu_seconds", "measured_gpu_hours"],
            ["2026-11", "team-a", "alice", "h100", "2.000000", "7200.000000000", ""],  # no telemetry: empty
            ["2026-11", "team-a", "bob", "a100", "2.000000", "7200.000000000", ""],
            ["2026-11", "team-b", "charlie", "h100", "0.500000", "1800.000000000", ""],
        ]

    def test_an_owner_exports_only_their_workspace(self, usage: World) -> None:
        response = usage.client(usage.alice).get(URL, {"format": "csv", "workspace": "team-a", "group_by": "user"})
        assert response["Content-Disposition"] == 'attachment; filename="gpu-usage-all-months-team-a.csv"'
        assert response.content.decode().splitlines()[1:] == [
            "2026-11,,alice,,2.000000,7200.000000000,",
            "2026-11,,bob,,2.000000,7200.000000000,",
        ]

    def test_its_cells_are_never_formulas(self, usage: World) -> None:
        mallory = get_user_model().objects.create_user("@mallory", "m@example.org")
        history.job(usage.team_a, mallory, [(NOV, NOV + timedelta(hours=1))])
        text = usage.client(usage.admin).get(URL, {"format": "csv", "group_by": "user"}).content.decode()
        assert "\n2026-11,,'@mallory,,1.000000," in text

    def test_a_deleted_creators_use_stays_without_a_name(self, usage: World) -> None:
        dora = get_user_model().objects.create_user("dora", "dora@example.org")
        history.job(usage.team_a, dora, [(NOV, NOV + timedelta(minutes=6))], gpu_type="l4")
        dora.delete()
        rows = _rows(usage.client(usage.admin).get(URL, {"workspace": "team-a"}))
        assert ("2026-11", "team-a", None, "l4", "0.100000") in _cells(rows)


class TestRunningWork:
    def test_a_running_job_counts_up_to_the_reports_moment(self, world: World) -> None:
        began = timezone.now() - timedelta(hours=2)
        earlier = (began - timedelta(hours=5), began - timedelta(hours=4))
        history.job(world.team_a, world.alice, [earlier, (began, None)], gpus=Decimal("0.25"), replicas=4)
        history.instance(world, world.team_a, world.alice, began, None, gpu_type="l4", gpus=Decimal("2"))
        response = world.client(world.alice).get(URL, {"group_by": "gpu_type"})
        as_of = parse_datetime(response.json()["as_of"])
        assert as_of is not None
        expected = history.expected_cells(
            [
                history.Run("team-a", "alice", "h100", Decimal(1), *earlier),
                history.Run("team-a", "alice", "h100", Decimal(1), began, None),
                history.Run("team-a", "alice", "l4", Decimal(2), began, None),
            ],
            as_of,
        )
        by_type: dict[str, Decimal] = {}
        for (_, _, _, gpu_type), gpu_seconds in expected.items():
            by_type[gpu_type] = by_type.get(gpu_type, Decimal(0)) + gpu_seconds
        got: dict[str, Decimal] = {}
        for row in _rows(response):
            got[row["gpu_type"]] = got.get(row["gpu_type"], Decimal(0)) + Decimal(row["gpu_seconds"])
        assert got == by_type
        assert got["l4"] >= 2 * 7200

    def test_it_counts_the_attempts_the_job_actions_record(self, world: World) -> None:
        """Submitted, started, preempted, started again and finished through the actions: its
        GPU-seconds are the attempts' lengths as recorded, times its GPUs."""
        job = check_submit_job(
            world.team_a, name="train", command="true", gpu_type="h100", gpus_per_replica=Decimal("0.5"),
            replicas=2, acting_user=world.alice,
        )  # fmt: skip
        Job.objects.filter(pk=job.pk).update(state=Job.State.ADMITTED, admitted_at=timezone.now())
        record_job_start(Job.objects.get(pk=job.pk), endpoint="test")
        do_preempt_job(Job.objects.get(pk=job.pk), reason="room for another")
        record_job_start(Job.objects.get(pk=job.pk), endpoint="test")
        record_job_end(Job.objects.get(pk=job.pk), Job.State.SUCCEEDED, exit_code=0, reason="")
        attempts = list(Job.objects.get(pk=job.pk).attempt_set.values_list("started_at", "finished_at"))
        assert len(attempts) == 2 and all(ended is not None for _, ended in attempts)
        expected = history.expected_cells(
            [history.Run("team-a", "alice", "h100", Decimal(1), began, ended) for began, ended in attempts],
            timezone.now(),
        )
        rows = _rows(world.client(world.alice).get(URL, {"workspace": "team-a", "group_by": ""}))
        assert sum((Decimal(r["gpu_seconds"]) for r in rows), Decimal(0)) == sum(expected.values(), Decimal(0))


def test_it_answers_in_a_bounded_number_of_queries(usage: World, django_assert_max_num_queries: Any) -> None:
    for n in range(30):
        workspace = Workspace.objects.create(name=f"lab-{n}")
        history.job(workspace, usage.alice, [(NOV + timedelta(hours=n), NOV + timedelta(hours=n + 1))])
        history.instance(usage, workspace, usage.bob, NOV, DEC + timedelta(days=n), gpu_type="a100")
    admin = usage.client(usage.admin)
    with django_assert_max_num_queries(4):  # the token, its user, the report
        assert len(_rows(admin.get(URL))) > 60
    alice = usage.client(usage.alice)
    alice.get(URL)
    with django_assert_max_num_queries(5):  # the token, its user, her workspaces, the report
        assert _rows(alice.get(URL))


def test_measured_use_is_reported_beside_what_was_held_where_telemetry_exists(usage: World, settings: Any) -> None:
    """Each sample's utilisation times the time it stands for (the sampling period as measured, the
    bucket once folded), for the work that held the device: here 30 samples of 10 s at 50 %, and an
    hour folded at 25 %, of alice's h100 in November."""
    from apps.inventory.models import GPU
    from apps.telemetry.models import GpuSample

    settings.PORTAL_TELEMETRY_EVERY_S = 10
    job = history.job(usage.team_a, usage.alice, [(NOV, NOV + timedelta(hours=2))], gpu_type="h100", gpus=Decimal(1))
    gpu = GPU.objects.first()
    common = {"gpu": gpu, "memory_used_mb": 1, "memory_total_mb": 2, "workload": job, "workspace": usage.team_a}
    GpuSample.objects.bulk_create(
        [GpuSample(at=NOV + timedelta(seconds=10 * i), resolution_s=0, utilisation=50.0, **common) for i in range(30)]
        + [GpuSample(at=NOV + timedelta(hours=1), resolution_s=3600, utilisation=25.0, **common)]
    )
    rows = usage.client(usage.admin).get(URL, {"month": "2026-11", "workspace": "team-a"}).json()["rows"]
    alice = next(r for r in rows if r["user"] == "alice" and r["gpu_type"] == "h100")
    assert Decimal(alice["measured_gpu_hours"]) == Decimal("0.291667")  # (30 x 10 s x 0.5 + 3600 s x 0.25) / 3600
    bob = next(r for r in rows if r["user"] == "bob")
    assert bob["measured_gpu_hours"] == "0.000000"  # measured on the platform, but none of his devices
