"""Tasks cross a real broker to a real worker process and act on the real database."""

from __future__ import annotations

import time
from decimal import Decimal

from django.conf import settings
from django.db import connection

from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from tests.personas import World
from workers.tasks import ping, schedule_cycle


def test_it_round_trips_a_task_through_the_worker(tx_world: World, celery_queue: str) -> None:
    result = ping.apply_async(queue=celery_queue).get(timeout=60)
    assert result == {"pong": True, "database": connection.settings_dict["NAME"]}
    assert settings.CELERY_BROKER_URL.startswith("redis://"), "the suite runs against Redis"


def test_it_admits_a_queued_job_in_the_worker(tx_world: World, celery_queue: str, settings) -> None:
    settings.PORTAL_SCHEDULER_TRIGGER = "off"
    job = check_submit_job(
        tx_world.team_a,
        name="train",
        command="python train.py",
        gpu_type="h100",
        gpus_per_replica=Decimal("2"),
        replicas=2,
        acting_user=tx_world.alice,
    )
    assert Job.objects.get(pk=job.pk).state == Job.State.QUEUED

    schedule_cycle.apply_async(queue=celery_queue)

    deadline = time.monotonic() + 60
    while Job.objects.get(pk=job.pk).state == Job.State.QUEUED and time.monotonic() < deadline:
        time.sleep(0.2)
    job.refresh_from_db()
    assert job.state == Job.State.ADMITTED
    assert job.allocations.count() == 4
