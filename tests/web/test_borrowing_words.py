"""What a workspace may borrow reads the same in the console's quota table as in a refusal of work
too large for it (apps/scheduling/limits.py, borrowing)."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from apps.errors import LimitExceeded
from apps.jobs.actions import check_submit_job
from apps.workspaces.models import Cohort, GPUQuota, Workspace
from tests.personas import World
from tests.web.test_pages import SignedIn


def _may_borrow_cell(page: str) -> str:
    cell = re.search(r'<tr data-quota="h100">.*?<td data-label="May borrow" class="num">(.*?)</td>', page, re.S)
    assert cell, page
    return re.sub(r"<[^>]+>", "", cell.group(1)).strip()


def _refusal(world: World) -> str:
    with pytest.raises(LimitExceeded) as refused:
        check_submit_job(world.team_a, name="big", command="true", gpu_type="h100", gpus_per_replica=Decimal(8),
                         acting_user=world.alice)  # fmt: skip
    return refused.value.message


def test_a_workspace_that_does_not_borrow_says_so_in_the_console_and_in_refusals(
    world: World, signed_in: SignedIn
) -> None:
    page = signed_in(world.admin).get("/console/workspaces/team-a/").content.decode()

    assert _may_borrow_cell(page) == "no borrowing"
    assert "(4 nominal, no borrowing)" in _refusal(world)


def test_a_borrowing_workspace_shows_what_its_cohort_lends_within_its_limit(world: World, signed_in: SignedIn) -> None:
    cohort = Cohort.objects.create(name="lab")
    Workspace.objects.filter(pk__in=[world.team_a.pk, world.team_b.pk]).update(cohort=cohort, can_borrow=True)
    GPUQuota.objects.filter(workspace=world.team_a).update(borrowing_limit=Decimal(3))
    world.team_a.refresh_from_db()

    page = signed_in(world.admin).get("/console/workspaces/team-a/").content.decode()

    assert _may_borrow_cell(page) == "3 borrowable (limit 3)"
    assert "(4 nominal + 3 borrowable)" in _refusal(world)
