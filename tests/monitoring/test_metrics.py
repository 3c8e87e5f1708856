"""`/metrics`: the portal's figures in Prometheus' text format, behind a bearer token, read from
the database so that any web process reports what every process did."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from apps.jobs.actions import check_submit_job, do_preempt_job
from apps.jobs.models import Job
from apps.monitoring.cycles import timed_cycle
from tests.personas import World

TOKEN = "a-scrapers-token-of-some-length"


@pytest.fixture(autouse=True)
def metrics_token(settings: Any) -> None:
    settings.PORTAL_METRICS_TOKEN = TOKEN


def scrape() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    response = Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/plain; version=")
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_it_needs_the_bearer_token_and_is_off_without_one(world: World, settings: Any) -> None:
    assert Client().get("/metrics").status_code == 401
    wrong = Client().get("/metrics", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and b"gpuportal" not in wrong.content
    # A signed-in admin's session is no scraper's token.
    admin = Client()
    admin.force_login(world.admin)
    assert admin.get("/metrics").status_code == 401
    settings.PORTAL_METRICS_TOKEN = ""
    assert Client().get("/metrics", headers={"Authorization": "Bearer "}).status_code == 404


def test_it_reports_the_queue_capacity_quota_and_states(world: World, django_capture_on_commit_callbacks: Any) -> None:
    waiting = check_submit_job(
        world.team_a, name="big", command="true", gpu_type="h100", gpus_per_replica=Decimal(2), replicas=2,
        acting_user=world.bob,
    )  # fmt: skip
    check_submit_job(
        world.team_a, name="small", command="true", gpu_type="h100", gpus_per_replica=Decimal(1), acting_user=world.bob
    )
    before = scrape()
    team_a_h100 = (("gpu_type", "h100"), ("workspace", "team-a"))
    assert before["gpuportal_queue_workloads"][(("gpu_type", "h100"), ("kind", "job"), ("workspace", "team-a"))] == 2
    assert before["gpuportal_queue_gpus"][team_a_h100] == 5
    assert before["gpuportal_queue_oldest_wait_seconds"][team_a_h100] >= 0
    assert before["gpuportal_gpus"][(("cluster", "local"), ("gpu_type", "h100"))] == 8
    assert before["gpuportal_workspace_quota_gpus"][team_a_h100] == 4
    assert before["gpuportal_workloads"][(("kind", "job"), ("state", "QUEUED"))] == 2
    assert before["gpuportal_workloads"][(("kind", "notebook"), ("state", "READY"))] == 0  # every state, always
    assert before["gpuportal_submissions_total"][(("kind", "job"),)] == 2
    assert before["gpuportal_scheduler_cycles_total"][()] == 0

    with django_capture_on_commit_callbacks(execute=True):
        timed_cycle()  # admits the 4-GPU gang, first in line; the 1-GPU job then exceeds team-a's quota of 4
    after = scrape()
    assert after["gpuportal_admissions_total"][(("kind", "job"),)] == 1
    assert after["gpuportal_gpus_allocated"][(("cluster", "local"), ("gpu_type", "h100"))] == 4
    assert after["gpuportal_workspace_gpus_allocated"][team_a_h100] == 4
    assert after["gpuportal_queue_workloads"][(("gpu_type", "h100"), ("kind", "job"), ("workspace", "team-a"))] == 1
    assert after["gpuportal_scheduler_cycles_total"][()] == 1
    assert after["gpuportal_scheduler_last_cycle_seconds"][()] > 0
    assert after["gpuportal_scheduler_last_cycle_timestamp_seconds"][()] > 0
    assert Job.objects.get(pk=waiting.pk).state != Job.State.QUEUED


def test_preemptions_are_counted_by_reason_and_waits_by_bucket(world: World) -> None:
    job = check_submit_job(world.team_a, name="victim", command="true", acting_user=world.bob)
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING)
    job.refresh_from_db()
    do_preempt_job(job, reason="preempted to give workspace team-b back its quota: workspace team-a borrowed")
    samples = scrape()
    reasons = samples["gpuportal_preemptions_total"]
    assert (reasons[(("reason", "quota"),)], reasons[(("reason", "priority"),)], reasons[(("reason", "other"),)]) == (
        1,
        0,
        0,
    )
    # Waits: a job started 90 s after its submission is in the 300-s bucket, not the 60-s one.
    from datetime import timedelta

    started = check_submit_job(world.team_a, name="waited", command="true", acting_user=world.bob)
    Job.objects.filter(pk=started.pk).update(started_at=started.created_at + timedelta(seconds=90))
    waits = scrape()
    assert waits["gpuportal_wait_seconds_bucket"][(("kind", "job"), ("le", "60.0"))] == 0
    assert waits["gpuportal_wait_seconds_bucket"][(("kind", "job"), ("le", "300.0"))] == 1
    assert waits["gpuportal_wait_seconds_count"][(("kind", "job"),)] == 1
    assert waits["gpuportal_wait_seconds_sum"][(("kind", "job"),)] == pytest.approx(90)


def test_no_label_names_a_single_workload(world: World) -> None:
    for i in range(5):
        check_submit_job(world.team_a, name=f"job-{i}", command="true", acting_user=world.bob)
    response = Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content.decode()
    labels = {name for family in text_string_to_metric_families(response) for s in family.samples for name in s.labels}
    assert labels <= {"workspace", "gpu_type", "kind", "state", "cluster", "reason", "le"}, labels
    assert "job-3" not in response
