"""Small things a reliability review found, each fixed at its cause."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.management import call_command
from rest_framework.test import APIClient

from apps.inventory.models import Cluster
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from apps.scheduling.adapter import run_cycle
from tests.personas import World


def test_a_cancelled_running_job_closes_its_attempt(world: World, settings: Any) -> None:
    job = check_submit_job(
        world.team_a, name="j", command="true", acting_user=world.alice, gpu_type="h100", gpus_per_replica=Decimal(1)
    )
    run_cycle()
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING)
    job.attempt_set.create(number=1)

    do_cancel_job(Job.objects.get(pk=job.pk), acting_user=world.alice)

    attempt = job.attempt_set.get()
    assert attempt.finished_at is not None and attempt.outcome == "cancelled"


def test_work_without_gpus_waits_while_its_cluster_is_disabled(world: World) -> None:
    Cluster.objects.filter(is_default=True).update(enabled=False)
    job = check_submit_job(world.team_a, name="cpu", command="true", acting_user=world.alice)

    run_cycle()

    job.refresh_from_db()
    assert job.state == Job.State.QUEUED
    assert "is disabled" in job.wait_reason
    Cluster.objects.filter(is_default=True).update(enabled=True)
    run_cycle()
    job.refresh_from_db()
    assert job.state == Job.State.ADMITTED


def test_an_account_used_only_through_the_api_keeps_its_password(world: World, capsys: Any) -> None:
    call_command("seed_demo")
    first = capsys.readouterr().out
    password = first.split("Login: admin / ")[1].split()[0]
    client = APIClient()
    assert (
        client.post("/api/v1/auth/token/", {"username": "admin", "password": password}, format="json").status_code
        == 200
    )

    call_command("seed_demo")

    assert "Login: admin /" not in capsys.readouterr().out
    assert (
        client.post("/api/v1/auth/token/", {"username": "admin", "password": password}, format="json").status_code
        == 200
    )
