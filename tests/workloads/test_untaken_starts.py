"""A job's start that no worker takes is made by the scheduler loop itself: a worker can still run
yet no longer take work (its broker restarted under it). The loop sends the start to the workers,
on the real broker, again each pass; once `PORTAL_START_UNTAKEN_S` has passed without a worker
taking it, it starts the job here. An instance's start stays the workers' (it may wait rightly
behind a long environment build)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from apps.compute.actions import check_launch_instance
from apps.compute.models import Instance
from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.scheduling.adapter import run_cycle
from apps.workloads.host import reconcile
from tests.broker import own_queues, queued
from tests.personas import World

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(settings: Any, tmp_path: Path) -> Iterator[Any]:
    """Start requests go to queues of this test's own on the real broker, which no worker reads."""
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    settings.PORTAL_WORKLOAD_TRIGGER = "task"
    settings.PORTAL_SCHEDULER_TRIGGER = "off"
    with own_queues(settings) as names:
        yield lambda: [m["headers"]["argsrepr"] for m in queued(*names)]


def test_a_job_no_worker_takes_is_started_by_the_loop(tx_world: World, sent: Any, settings: Any) -> None:
    settings.PORTAL_START_LOST_AFTER_S, settings.PORTAL_START_UNTAKEN_S = 1, 4
    job = check_submit_job(tx_world.team_a, name="echo", command="echo hi", gpu_type="h100",
                           gpus_per_replica=Decimal(1), acting_user=tx_world.alice)  # fmt: skip
    box = check_launch_instance(tx_world.team_a, name="box", profile=tx_world.gpu_1, acting_user=tx_world.alice)
    run_cycle()
    assert Job.objects.get(pk=job.pk).state == Job.State.ADMITTED
    time.sleep(1.1)  # lost: the loop asks again
    reconcile(sweep=False)
    assert f"('job', {job.pk})" in sent()  # sent to the workers, not started here
    assert Job.objects.get(pk=job.pk).state == Job.State.ADMITTED
    time.sleep(3)
    reconcile(sweep=False)  # untaken for longer than PORTAL_START_UNTAKEN_S since admitted: started here
    deadline = time.monotonic() + 30
    while Job.objects.get(pk=job.pk).state not in (Job.State.RUNNING, Job.State.SUCCEEDED):
        assert time.monotonic() < deadline, Job.objects.get(pk=job.pk).state
        reconcile(sweep=False)
        time.sleep(0.2)
    # The instance's start was sent again each pass, and is still the workers' to make.
    assert Instance.objects.get(pk=box.pk).state == Instance.State.PROVISIONING
    assert sent().count(f"('instance', {box.pk})") >= 2
