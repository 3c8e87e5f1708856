"""The report agrees exactly with the run records: random histories of jobs (several attempts each,
the last one perhaps still running) and instances (with notebooks), across month and year
boundaries, workspaces, users and GPU types, against GPU-seconds computed in plain Python."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.accounting.queries import GROUPS, Month, usage_cells, usage_report
from apps.workspaces.models import Workspace
from tests.accounting import history
from tests.accounting.history import Run
from tests.personas import World

NOW = datetime(2027, 2, 14, 10, 30, 15, 123457, tzinfo=UTC)
EARLIEST = datetime(2026, 10, 20, tzinfo=UTC)
SPAN_US = int((NOW - EARLIEST) / timedelta(microseconds=1))
# Instants on and next to month boundaries are drawn often: that is where splitting goes wrong.
BOUNDARIES = [
    datetime(2026, 11, 1, tzinfo=UTC),
    datetime(2026, 12, 1, tzinfo=UTC),
    datetime(2027, 1, 1, tzinfo=UTC),
    datetime(2027, 2, 1, tzinfo=UTC),
]
WORKSPACES = ("team-a", "team-b", "team-c")
USERS = ("alice", "bob", "charlie", None)  # None: an account deleted since
GPU_TYPES = ("h100", "a100", "l4")


def _moment(before: datetime = NOW) -> st.SearchStrategy[datetime]:
    anywhere = st.integers(0, SPAN_US - 1).map(lambda us: EARLIEST + timedelta(microseconds=us))
    near_a_boundary = st.tuples(st.sampled_from(BOUNDARIES), st.sampled_from([-1, 0, 1])).map(
        lambda bd: bd[0] + timedelta(microseconds=bd[1])
    )
    return st.one_of(anywhere, near_a_boundary).filter(lambda moment: moment < before)


@st.composite
def _interval(draw: Any, open_allowed: bool) -> tuple[datetime, datetime | None]:
    began = draw(_moment())
    if open_allowed and draw(st.booleans()):
        return began, None
    ended = draw(st.one_of(_moment(), st.just(began)).filter(lambda moment: moment >= began))
    return began, ended


_owner = st.tuples(st.sampled_from(WORKSPACES), st.sampled_from(USERS), st.sampled_from(GPU_TYPES))
_gpus = st.one_of(st.just(Decimal(0)), st.integers(1, 8000).map(lambda n: Decimal(n) / 1000))


@st.composite
def _job(draw: Any) -> dict[str, Any]:
    attempts = draw(st.lists(_interval(open_allowed=False), max_size=3))
    if draw(st.booleans()):
        attempts.append(draw(_interval(open_allowed=True)))
    return {"owner": draw(_owner), "gpus": draw(_gpus), "replicas": draw(st.integers(1, 4)), "attempts": attempts}


@st.composite
def _instance(draw: Any) -> dict[str, Any]:
    ran = draw(st.one_of(st.none(), _interval(open_allowed=True)))
    return {"owner": draw(_owner), "gpus": draw(_gpus), "ran": ran, "notebooks": draw(st.integers(0, 2))}


def _places(world: World) -> tuple[dict[str, Workspace], dict[str | None, Any]]:
    workspaces = {"team-a": world.team_a, "team-b": world.team_b}
    workspaces["team-c"] = Workspace.objects.get_or_create(name="team-c")[0]
    users: dict[str | None, Any] = {name: getattr(world, name) for name in USERS if name}
    users[None] = None
    return workspaces, users


def _write(world: World, jobs: list[dict[str, Any]], instances: list[dict[str, Any]]) -> list[Run]:
    """The records, and the runs they stand for."""
    workspaces, users = _places(world)
    runs: list[Run] = []
    for spec in jobs:
        workspace, user, gpu_type = spec["owner"]
        history.job(
            workspaces[workspace],
            users[user],
            spec["attempts"],
            gpu_type=gpu_type,
            gpus=spec["gpus"],
            replicas=spec["replicas"],
        )
        total = spec["gpus"] * spec["replicas"]
        runs += [Run(workspace, user, gpu_type, total, began, ended) for began, ended in spec["attempts"]]
    for spec in instances:
        workspace, user, gpu_type = spec["owner"]
        began, ended = spec["ran"] or (None, None)
        history.instance(
            world,
            workspaces[workspace],
            users[user],
            began,
            ended,
            gpu_type=gpu_type,
            gpus=spec["gpus"],
            notebooks=spec["notebooks"],
        )
        if began is not None:
            runs.append(Run(workspace, user, gpu_type, spec["gpus"], began, ended))
    return runs


def _cells(rows: Any) -> dict[tuple[Any, ...], Decimal]:
    return {(r.month, r.workspace, r.user, r.gpu_type): r.gpu_seconds for r in rows}


@pytest.mark.django_db
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    jobs=st.lists(_job(), max_size=8),
    instances=st.lists(_instance(), max_size=5),
    month=st.sampled_from(["2026-10", "2026-11", "2026-12", "2027-01", "2027-02", "2027-03"]),
)
def test_it_agrees_exactly_with_the_records(
    world: World, jobs: list[dict[str, Any]], instances: list[dict[str, Any]], month: str
) -> None:
    with transaction.atomic():
        runs = _write(world, jobs, instances)
        expected = history.expected_cells(runs, NOW)

        report = usage_report(world.admin, now=NOW)
        assert _cells(report.rows) == expected
        # The same, cut and summed outside the database, as on the embedded default's SQLite.
        here = usage_cells(workspace_ids=None, workspace=None, month=None, now=NOW, portable=True)
        assert _cells(here) == expected
        in_month = usage_cells(workspace_ids=None, workspace=None, month=Month.parse(month), now=NOW, portable=True)
        assert _cells(in_month) == {cell: s for cell, s in expected.items() if cell[0] == month}
        for row in report.rows:
            assert row.gpu_hours == history.hours(expected[(row.month, row.workspace, row.user, row.gpu_type)])

        one_month = usage_report(world.admin, month=Month.parse(month), now=NOW)
        assert _cells(one_month.rows) == {cell: s for cell, s in expected.items() if cell[0] == month}

        for group_by in [(), ("workspace",), ("user", "gpu_type"), GROUPS]:
            sums: dict[tuple[Any, ...], Decimal] = defaultdict(Decimal)
            for (m, workspace, user, gpu_type), gpu_seconds in expected.items():
                key = (
                    m,
                    workspace if "workspace" in group_by else None,
                    user if "user" in group_by else None,
                    gpu_type if "gpu_type" in group_by else None,
                )
                sums[key] += gpu_seconds
            assert _cells(usage_report(world.admin, group_by=group_by, now=NOW).rows) == dict(sums)

        alice_owns = usage_report(world.alice, now=NOW)
        assert _cells(alice_owns.rows) == {cell: s for cell, s in expected.items() if cell[1] == "team-a"}
        transaction.set_rollback(True)
