"""Every start says what it is doing as it does it (JupyterHub's spawner progress): its steps, with
times, on the workload's row (``start_progress``), in the API and on its page; the shared
environments are built ahead when a profile is published, so that a start after it builds nothing.

Real jobs and a real Jupyter server on the local backend; the environments are the ones the other
tests share (built once per machine)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.test import Client as PageClient

from apps.catalog.actions import do_save_profile
from apps.catalog.models import NotebookProfile
from apps.compute.hosting import prebuild_environments
from apps.compute.models import Instance, Notebook
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from apps.workloads.host import converge
from tests.broker import own_queues, queued
from tests.personas import World

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def work(settings: Any, tmp_path: Path) -> Path:
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    return Path(settings.PORTAL_WORK_DIR)


def _times_in_order(steps: list[dict[str, Any]]) -> None:
    """Each step ended, no earlier than it began, and no later than the next one began."""
    for step, after in zip(steps, [*steps[1:], None], strict=True):
        assert step["ended_at"] is not None, step
        assert step["started_at"] <= step["ended_at"], step
        if after is not None:
            assert step["ended_at"] <= after["started_at"] + 0.001, (step, after)


def _when(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_jobs_start_records_its_steps_in_order_and_shows_them_to_its_workspace_alone(
    tx_world: World, work: Path
) -> None:
    world = tx_world
    job = check_submit_job(
        world.team_a, name="steps", command="sleep 30", gpu_type="h100", gpus_per_replica=Decimal(1),
        acting_user=world.alice,
    )  # fmt: skip
    job.refresh_from_db()
    assert job.state == Job.State.ADMITTED and job.start_progress == []

    # Before a worker takes it: the API says it waits for one, since its admission.
    answer = world.client(world.alice).get(f"/api/v1/jobs/{job.pk}/").json()
    [waiting] = answer["start_progress"]
    assert waiting["step"] == "queued" and waiting["ended_at"] is None and "worker" in waiting["detail"]
    assert abs(_when(waiting["started_at"]) - job.admitted_at.timestamp()) < 0.01

    started = converge("job", job.pk)
    assert started is not None and started.state == Job.State.RUNNING
    job.refresh_from_db()
    steps = job.start_progress
    assert [step["step"] for step in steps] == ["queued", "environment", "starting"]
    _times_in_order(steps)
    assert steps[0]["started_at"] == pytest.approx(job.admitted_at.timestamp(), abs=0.01)
    assert "SDK" in steps[1]["detail"] and "process" in steps[2]["detail"]

    # The API: the job's own endpoint and the list of every kind, as recorded.
    shown = world.client(world.alice).get(f"/api/v1/jobs/{job.pk}/").json()["start_progress"]
    assert [step["step"] for step in shown] == ["queued", "environment", "starting"]
    assert [_when(step["started_at"]) for step in shown] == pytest.approx([s["started_at"] for s in steps], abs=0.01)
    listed = world.client(world.alice).get("/api/v1/workloads/", {"kind": "job"}).json()["results"]
    assert [w["start_progress"] for w in listed if w["id"] == job.pk] == [shown]

    # Its page, folded once it started.
    page = PageClient()
    page.force_login(world.alice)
    html = page.get(f"/w/team-a/jobs/{job.pk}/").content.decode()
    assert "Started in" in html and "waiting for a worker to take the start" in html and "Python environment" in html

    # Another workspace's member finds neither the job nor its steps.
    hostile = world.client(world.charlie)
    assert hostile.get(f"/api/v1/jobs/{job.pk}/").status_code == 404
    assert hostile.get(f"/api/v1/workloads/{job.pk}/").status_code == 404
    assert all(w["id"] != job.pk for w in hostile.get("/api/v1/workloads/").json()["results"])
    charlie_page = PageClient()
    charlie_page.force_login(world.charlie)
    assert charlie_page.get(f"/w/team-a/jobs/{job.pk}/").status_code == 404

    do_cancel_job(Job.objects.get(pk=job.pk), acting_user=None)
    converge("job", job.pk)


def test_the_page_of_a_job_waiting_for_a_worker_says_so(tx_world: World, work: Path) -> None:
    world = tx_world
    job = check_submit_job(
        world.team_a, name="waits", command="true", gpu_type="h100", gpus_per_replica=Decimal(1),
        acting_user=world.alice,
    )  # fmt: skip
    page = PageClient()
    page.force_login(world.alice)
    html = page.get(f"/w/team-a/jobs/{job.pk}/").content.decode()
    assert 'id="start-progress"' in html and "waiting for a worker to take the start" in html and "under way" in html
    do_cancel_job(Job.objects.get(pk=job.pk), acting_user=None)


def test_a_notebooks_start_records_each_step_and_a_published_profiles_environment_is_built_ahead(
    tx_world: World, proxy: Any, settings: Any
) -> None:
    world = tx_world
    settings.PORTAL_PREBUILD_ENVIRONMENTS = True
    profile = NotebookProfile(name="kernel-only", image="quay.io/jupyter/base-notebook")
    # Publishing it builds its environment (a provisioning worker's task: here, inline).
    do_save_profile(profile, acting_user=world.admin, published=True)
    assert prebuild_environments([profile.pk])  # built (or found built): nothing left to build

    instance_id = (
        world.client(world.alice)
        .post("/api/v1/instances/", {"workspace": "team-a", "name": "box", "profile": "gpu-1"}, format="json")
        .json()["id"]
    )
    instance = Instance.objects.get(pk=instance_id)
    assert instance.state == Instance.State.RUNNING, instance.failure_reason
    assert [step["step"] for step in instance.start_progress] == ["queued", "environment", "starting"]

    body = {"workspace": "team-a", "name": "lab", "instance": instance_id, "profile": profile.name}
    answer = world.client(world.alice).post("/api/v1/notebooks/", body, format="json")
    assert answer.status_code == 201, answer.content
    notebook = Notebook.objects.get(pk=answer.json()["id"])
    assert notebook.state == Notebook.State.READY, notebook.failure_reason
    steps = notebook.start_progress
    assert [step["step"] for step in steps] == ["queued", "environment", "starting", "answering"]
    _times_in_order(steps)
    # Built ahead when it was published: the start found it built, and built nothing.
    assert "is ready" in steps[1]["detail"] and "building" not in steps[1]["detail"], steps[1]["detail"]
    assert "Jupyter" in steps[2]["detail"] and "Jupyter" in steps[3]["detail"]

    shown = world.client(world.alice).get(f"/api/v1/notebooks/{notebook.pk}/").json()["start_progress"]
    assert [step["step"] for step in shown] == ["queued", "environment", "starting", "answering"]
    assert world.client(world.charlie).get(f"/api/v1/notebooks/{notebook.pk}/").status_code == 404


def test_what_a_start_waits_for_is_shown_before_a_worker_takes_it(tx_world: World) -> None:
    world = tx_world  # no worker: nothing is started (PORTAL_WORKLOAD_TRIGGER is off)
    api = world.client(world.alice)
    box = api.post("/api/v1/instances/", {"workspace": "team-a", "name": "box", "profile": "gpu-1"}, format="json")
    assert api.get(f"/api/v1/instances/{box.json()['id']}/").json()["state"] == "PROVISIONING"  # admitted
    body = {"workspace": "team-a", "name": "lab", "instance": box.json()["id"], "profile": "minimal"}
    lab = api.post("/api/v1/notebooks/", body, format="json")
    assert lab.status_code == 201, lab.content

    listed = {w["kind"]: w["start_progress"] for w in api.get("/api/v1/workloads/").json()["results"]}
    assert [(s["step"], s["detail"], s["ended_at"]) for s in listed["instance"]] == [
        ("queued", "waiting for a worker to take the start", None)
    ]
    assert [(s["step"], s["detail"]) for s in listed["notebook"]] == [("queued", "waiting for its instance box to run")]
    shown = api.get(f"/api/v1/notebooks/{lab.json()['id']}/").json()["start_progress"]
    assert shown == listed["notebook"]
    assert world.client(world.charlie).get(f"/api/v1/notebooks/{lab.json()['id']}/").status_code == 404


def test_publishing_a_notebook_profile_queues_its_environment_build_for_a_provisioning_worker(
    tx_world: World, settings: Any
) -> None:
    settings.PORTAL_PREBUILD_ENVIRONMENTS = True
    settings.PORTAL_WORKLOAD_TRIGGER = "task"
    with own_queues(settings) as (quick, provision):
        draft = do_save_profile(
            NotebookProfile(name="draft", image="quay.io/jupyter/base-notebook"), acting_user=tx_world.admin
        )
        assert queued(quick, provision) == []  # not published: nothing to build
        do_save_profile(draft, acting_user=tx_world.admin, published=True)
        do_save_profile(draft, acting_user=tx_world.admin, description="no other packages")  # nothing new
        [message] = queued(provision)
        assert message["headers"]["task"] == "portal.prebuild_environments"
        assert message["headers"]["argsrepr"] == f"([{draft.pk}],)"
        assert queued(quick) == []
