"""One workload whose backend keeps failing is retried less and less often; the others go on."""

from __future__ import annotations

from typing import Any

from apps.jobs.models import Job
from apps.scheduling.backoff import Backoff
from apps.workloads.host import reconcile
from tests.personas import World


def test_delays_double_up_to_the_cap_and_reset_on_success() -> None:
    backoff = Backoff(base_s=2, max_s=10)
    assert backoff.due("job", 1, now=0)
    assert [backoff.failed("job", 1, now=0) for _ in range(4)] == [2, 4, 8, 10]
    assert not backoff.due("job", 1, now=9.9) and backoff.due("job", 1, now=10)
    assert backoff.due("job", 2, now=0)  # others are not held back
    backoff.succeeded("job", 1)
    assert backoff.due("job", 1, now=0)
    assert backoff.failed("job", 1, now=0) == 2


def test_reconcile_backs_off_a_broken_job_and_converges_the_rest(world: World, settings: Any) -> None:
    settings.PORTAL_START_LOST_AFTER_S = 1
    broken = Job.objects.create(workspace=world.team_a, name="broken", command="true", state=Job.State.RUNNING,
                                backend_state={"version": 999})  # fmt: skip
    first = reconcile(sweep=False)
    assert first["failed"] == 1
    second = reconcile(sweep=False)  # within its backoff: not tried again
    assert second["failed"] == 0 and second["converged"] == 0
    broken.refresh_from_db()
    assert broken.state == Job.State.RUNNING
