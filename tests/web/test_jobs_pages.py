"""The job pages and the dashboard: submit, queue position and reason, cancel, usage over time."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.test import Client
from django.utils import timezone

from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job, JobAttempt
from apps.web.usage import gpu_series, held_intervals
from tests.personas import World
from tests.web.conftest import queries

SignedIn = Callable[[Any], Client]


def submit(world: World, name: str = "train", gpus: int = 1, user: Any = None, **kwargs: Any) -> Job:
    return check_submit_job(
        kwargs.pop("workspace", world.team_a), name=name, command="true", gpu_type="h100",
        gpus_per_replica=Decimal(gpus), acting_user=user or world.alice, **kwargs,
    )  # fmt: skip


def test_a_job_is_submitted_through_the_api_serializer_and_action(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    form = alice.get("/w/team-a/jobs/new/").content.decode()
    assert '<option value="h100" selected>' in form
    response = alice.post("/w/team-a/jobs/new/", {
        "name": "train", "command": "python train.py", "gpu_type": "h100", "gpus_per_replica": "2", "replicas": "2",
        "priority": "5", "cpu_cores": "2", "memory_gb": "8", "env": "EPOCHS=3\nLR = 0.1", "artifact_paths": "model.pt",
        "preemptible": "on",
    })  # fmt: skip
    job = Job.objects.get(name="train")
    assert response["Location"] == f"/w/team-a/jobs/{job.pk}/"
    assert (job.replicas, job.gpus_per_replica, job.priority) == (2, Decimal("2"), 5)
    assert job.env == {"EPOCHS": "3", "LR": "0.1"}
    assert job.artifact_paths == ["model.pt"] and job.preemptible and job.created_by == world.alice


def test_job_form_errors_show_next_to_their_fields(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    nothing = alice.post("/w/team-a/jobs/new/", {"name": "train", "gpus_per_replica": "1", "replicas": "1"})
    assert nothing.status_code == 400
    assert 'id="command-error"><p class="field-error">Give the job a command, an image, or both.' in (
        nothing.content.decode()
    )
    bad_env = alice.post("/w/team-a/jobs/new/", {"name": "t", "command": "true", "env": "1X=2"}).content.decode()
    assert 'id="env-error"' in bad_env and "is not a variable name" in bad_env
    no_equals = alice.post("/w/team-a/jobs/new/", {"name": "t", "command": "true", "env": "A=1\nB"}).content.decode()
    assert "Line 2: write NAME=value." in no_equals
    too_big = alice.post("/w/team-a/jobs/new/", {"name": "t", "command": "true", "gpu_type": "h100",
                                                 "gpus_per_replica": "1.5"}).content.decode()  # fmt: skip
    assert 'id="gpus_per_replica-error"' in too_big and "more than one device must be a whole number" in too_big
    assert not Job.objects.exists()


def test_the_queue_shows_position_reason_and_estimated_start(world: World, signed_in: SignedIn, committed: Any) -> None:
    with committed():
        submit(world, "big", gpus=4)
    with committed():
        waiting = submit(world, "waits", gpus=2)
    page = signed_in(world.alice).get("/w/team-a/jobs/?tab=queue").content.decode()
    waiting.refresh_from_db()
    assert waiting.state == Job.State.QUEUED and waiting.wait_reason
    assert 'data-job="waits"' in page and 'data-state="ADMITTED">Admitted' in page  # big was admitted at once
    assert waiting.wait_reason in page.replace("&#x27;", "'")
    running = signed_in(world.alice).get("/w/team-a/jobs/?tab=running").content.decode()
    assert "Nothing running" in running  # admitted, not yet started: it is in the queue tab's states


def test_the_job_list_costs_the_same_queries_for_many_rows(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    submit(world, "job-0", gpus=0)
    few = {tab: queries(alice, f"/w/team-a/jobs/?tab={tab}") for tab in ("queue", "all")}
    dashboard = queries(alice, "/w/team-a/")
    for i in range(1, 30):
        submit(world, f"job-{i}", gpus=1, user=world.bob if i % 2 else world.alice)
    assert {tab: queries(alice, f"/w/team-a/jobs/?tab={tab}") for tab in ("queue", "all")} == few
    assert queries(alice, "/w/team-a/") == dashboard


def test_a_job_is_cancelled_from_its_page(world: World, signed_in: SignedIn) -> None:
    job = submit(world, "big", gpus=4)
    alice = signed_in(world.alice)
    page = alice.get(f"/w/team-a/jobs/{job.pk}/").content.decode()
    assert "Cancel job" in page and f'data-log-url="/api/v1/jobs/{job.pk}/logs/"' in page
    # The button is a link to a question, as deleting a notebook is: one click cancels nothing.
    assert f'<a class="btn btn-danger" href="/w/team-a/jobs/{job.pk}/cancel/">Cancel job…</a>' in page
    assert f'action="/w/team-a/jobs/{job.pk}/cancel/"' not in page
    question = alice.get(f"/w/team-a/jobs/{job.pk}/cancel/")
    assert question.status_code == 200
    assert "Cancel job big?" in question.content.decode() and 'role="alertdialog"' in question.content.decode()
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED  # asking changed nothing
    alice.post(f"/w/team-a/jobs/{job.pk}/cancel/")
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED
    again = alice.post(f"/w/team-a/jobs/{job.pk}/cancel/", follow=True).content.decode()
    assert "Job big has already finished (cancelled)." in again
    assert alice.get(f"/w/team-a/jobs/{job.pk}/cancel/")["Location"] == f"/w/team-a/jobs/{job.pk}/"


def test_a_live_update_takes_the_cancel_button_away_once_the_job_ended(world: World, signed_in: SignedIn) -> None:
    job = submit(world, "short", gpus=4)
    alice = signed_in(world.alice)
    url = f"/w/team-a/jobs/{job.pk}/?part=status"
    queued = alice.get(url, headers={"HX-Request": "true"}).content.decode()
    assert '<div id="job-actions" class="actions" hx-swap-oob="true">' in queued and "Cancel job" in queued
    Job.objects.filter(pk=job.pk).update(state=Job.State.SUCCEEDED, finished_at=timezone.now())
    ended = alice.get(url, headers={"HX-Request": "true"}).content.decode()
    assert '<div id="job-actions" class="actions" hx-swap-oob="true">' in ended and "Cancel job" not in ended
    assert "Cancel job" not in alice.get(f"/w/team-a/jobs/{job.pk}/").content.decode()


def test_gpu_use_over_time_comes_from_the_runs(world: World, committed: Any) -> None:
    with committed():
        job = submit(world, "ran", gpus=2)
    now = timezone.now()
    JobAttempt.objects.create(job=job, number=1, started_at=now - timedelta(minutes=30),
                              finished_at=now - timedelta(minutes=15))  # fmt: skip
    data = gpu_series([world.team_a.pk], "1h")
    values = data["series"]["h100"]
    assert len(values) == 60 and len(data["labels"]) == 60
    assert values[5] == 0 and values[35] == 2.0 and values[50] == 0
    # `ran` was admitted at once and holds its 2 GPUs from then until now: counted as held
    assert ("h100", 2.0) in [(t, g) for t, g, _, _ in held_intervals([world.team_a.pk], now, timezone.now())]
    assert gpu_series([world.team_b.pk], "1h")["series"] == {}


def test_the_dashboard_shows_my_queue_progress_and_quota(world: World, signed_in: SignedIn, committed: Any) -> None:
    with committed():
        submit(world, "big", gpus=4, user=world.bob)
    with committed():
        mine = submit(world, "mine-waits", gpus=1)
    alice = signed_in(world.alice)
    page = alice.get("/w/team-a/").content.decode()
    assert "mine-waits" in page and "big" not in page.split('id="myqueue-title"')[1].split("</section>")[0]
    assert "4 / 4" in page  # bob's job holds the whole quota
    usage = alice.get("/w/team-a/usage.json?window=24h").json()
    assert usage["limits"] == {"h100": 4.0} and usage["window"] == "24h" and len(usage["labels"]) == 96
    assert mine.pk
