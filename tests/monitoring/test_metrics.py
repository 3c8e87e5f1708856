"""`/metrics`: the portal's figures in Prometheus' text format, behind a bearer token, read from
the database so that any web process reports what every process did."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from apps.inventory.models import GPU, Node
from apps.jobs.actions import check_submit_job, do_cancel_job, do_preempt_job
from apps.jobs.models import Job
from apps.monitoring.cycles import timed_cycle
from apps.workloads.kinds import KINDS
from apps.workspaces.models import GPUQuota
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


def test_gauges_of_known_label_sets_are_zero_rather_than_missing(
    world: World, django_capture_on_commit_callbacks: Any
) -> None:
    """A graph of what is allocated or waiting shows 0, not "no data": every cluster and GPU type of
    the inventory, every workspace and GPU type with a quota, and every kind the queue has."""
    scheduled = sorted(name for name, info in KINDS.items() if info.scheduling is not None)
    quotas = set(GPUQuota.objects.values_list("workspace__name", "gpu_type"))
    inventory = set(GPU.objects.values_list("node__pool__cluster__name", "gpu_type"))
    assert quotas and inventory and "job" in scheduled

    def all_zero(samples: dict[str, dict[tuple[tuple[str, str], ...], float]]) -> None:
        for workspace, gpu_type in quotas:
            key = (("gpu_type", gpu_type), ("workspace", workspace))
            assert samples["gpuportal_workspace_gpus_allocated"][key] == 0, key
            assert samples["gpuportal_queue_gpus"][key] == 0, key
            assert samples["gpuportal_queue_oldest_wait_seconds"][key] == 0, key
            for kind in scheduled:
                assert samples["gpuportal_queue_workloads"][(key[0], ("kind", kind), key[1])] == 0, (key, kind)
        for cluster, gpu_type in inventory:
            assert samples["gpuportal_gpus_allocated"][(("cluster", cluster), ("gpu_type", gpu_type))] == 0

    all_zero(scrape())  # nothing has run yet

    job = check_submit_job(
        world.team_a, name="one", command="true", gpu_type="h100", gpus_per_replica=Decimal(2), acting_user=world.bob
    )
    with django_capture_on_commit_callbacks(execute=True):
        timed_cycle()
    held = scrape()
    assert held["gpuportal_workspace_gpus_allocated"][(("gpu_type", "h100"), ("workspace", "team-a"))] == 2
    assert held["gpuportal_gpus_allocated"][(("cluster", "local"), ("gpu_type", "h100"))] == 2
    with django_capture_on_commit_callbacks(execute=True):
        do_cancel_job(Job.objects.get(pk=job.pk), acting_user=world.bob)
    all_zero(scrape())  # back to 0, not gone

    Node.objects.update(state=Node.State.DOWN)  # no node takes work: no GPUs, still a sample
    for cluster, gpu_type in inventory:
        assert scrape()["gpuportal_gpus"][(("cluster", cluster), ("gpu_type", gpu_type))] == 0
