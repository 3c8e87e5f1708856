"""Nothing slow holds up a job: whatever can take seconds (a notebook environment's build, an
instance or notebook start, a Slurm or Kubernetes start, a stop's grace period) goes to the
``provision`` queue and its own workers, while cycles and local job starts keep the quick one.

A notebook start that finds its environment missing hands the build to a task of its own, and
the start follows once it is built. In the embedded portal, started as deploy/run.sh starts it,
a job submitted while a real environment build runs is running before the build is done."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import requests

from apps.compute.actions import check_launch_instance, check_launch_notebook, do_delete_instance
from apps.compute.models import Instance, Notebook
from apps.inventory.actions import do_register_cluster
from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.workloads.host import converge
from portal.celery import app
from tests.broker import own_queues as broker_queues
from tests.broker import queued
from tests.personas import World
from tests.test_embedded import EmbeddedPortal


def _queue_of(name: str, *args: Any) -> str:
    """The queue Celery's router picks for task `name` sent with `args`."""
    return str(app.amqp.router.route({}, name, args, {})["queue"].name)


def test_slow_tasks_go_to_the_provision_queue_and_quick_ones_do_not(tx_world: World, settings: Any) -> None:
    assert settings.PROVISION_QUEUE == "provision" and app.conf.task_default_queue == "celery"
    for kind in ("instance", "notebook"):
        assert _queue_of("portal.converge", kind, 1) == "provision"
    assert _queue_of("portal.build_notebook_environment", 1) == "provision"
    assert _queue_of("portal.schedule_cycle", time.time()) == "celery"

    # A job's start: quick on this machine, provisioning on Slurm (which returns once the job runs).
    slurm = do_register_cluster("slurm", kind="slurm", connection={"partition": "gpu"}, acting_user=tx_world.admin)
    job = check_submit_job(
        tx_world.team_a,
        name="train",
        command="true",
        gpu_type="h100",
        gpus_per_replica=Decimal(1),
        acting_user=tx_world.alice,
    )
    job.refresh_from_db()
    assert job.cluster is not None and job.cluster.kind == "local"
    assert _queue_of("portal.converge", "job", job.pk) == "celery"
    Job.objects.filter(pk=job.pk).update(cluster=slurm)
    assert _queue_of("portal.converge", "job", job.pk) == "provision"
    # Its stop (once cancelled or preempted) waits out its grace period: provisioning too.
    Job.objects.filter(pk=job.pk).update(cluster=job.cluster, state=Job.State.CANCELLED)
    assert _queue_of("portal.converge", "job", job.pk) == "provision"


@pytest.fixture
def own_queues(settings: Any) -> Iterator[tuple[str, str]]:
    """Queues of this test's own on the real broker (Redis in the suite), emptied afterwards."""
    with broker_queues(settings) as names:
        yield names


def _queued(queue: str) -> list[tuple[str, str]]:
    """The tasks waiting in a Redis queue: (name, args) of each, oldest first."""
    messages = [message["headers"] for message in reversed(queued(queue))]  # LPUSHed: newest first
    return [(headers["task"], headers["argsrepr"]) for headers in messages]


def test_a_notebook_start_hands_its_environment_build_to_a_task_of_its_own(
    tx_world: World, own_queues: tuple[str, str], settings: Any, tmp_path: Path
) -> None:
    assert settings.CELERY_BROKER_URL.startswith("redis://"), "the suite runs against Redis"
    quick, provision = own_queues
    settings.PORTAL_NOTEBOOK_ENV_DIR = tmp_path / "envs"  # nothing built there yet
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"
    instance = check_launch_instance(
        tx_world.team_a, name="box", profile=tx_world.cpu_small, acting_user=tx_world.alice
    )
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING
    try:
        settings.PORTAL_WORKLOAD_TRIGGER = "off"
        notebook = check_launch_notebook(
            tx_world.team_a, instance=instance, name="lab", profile=tx_world.minimal, acting_user=tx_world.alice
        )

        # The worker's start returns at once: the notebook is starting, unclaimed, and its build
        # waits on the provision queue (only there), the start to follow once it is built.
        settings.PORTAL_WORKLOAD_TRIGGER = "task"
        began = time.monotonic()
        converge("notebook", notebook.pk)
        assert time.monotonic() - began < 5  # a build takes a quarter of a minute or more
        notebook.refresh_from_db()
        assert notebook.state == Notebook.State.STARTING
        assert notebook.start_claim is None and notebook.backend_state is None
        assert _queued(provision) == [("portal.build_notebook_environment", f"({notebook.pk},)")]
        assert _queued(quick) == []
        assert not any((tmp_path / "envs").glob("*.building"))
    finally:
        settings.PORTAL_WORKLOAD_TRIGGER = "inline"
        do_delete_instance(Instance.objects.get(pk=instance.pk), acting_user=tx_world.alice)
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.DELETED


def _timestamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _until(read: Any, done: Any, what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        row = read()
        if done(row):
            return row
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {row}"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_job_runs_while_a_notebook_environment_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = tmp_path / "envs"  # nothing built there: the notebook's environment is built for real
    monkeypatch.setenv("PORTAL_NOTEBOOK_ENV_DIR", str(envs))
    portal = EmbeddedPortal(tmp_path / "portal-data")
    try:
        url = portal.wait_ready()
        api = requests.Session()
        api.headers.update(portal.admin_headers(url))

        def reader(kind: str, pk: int) -> Any:
            return lambda: api.get(f"{url}/api/v1/{kind}/{pk}/", timeout=10).json()

        def building() -> bool:
            return any(envs.glob("*.building"))

        box = api.post(f"{url}/api/v1/instances/", json={"workspace": "admin", "name": "box", "profile": "cpu-small"})
        assert box.status_code == 201, box.text
        _until(reader("instances", box.json()["id"]), lambda r: r["state"] == "RUNNING", "the instance")
        profile = {"name": "with-tqdm", "image": "quay.io/jupyter/base-notebook", "published": True,
                   "python_packages": ["tqdm"]}  # fmt: skip
        assert api.post(f"{url}/api/v1/notebook-profiles/", json=profile).status_code == 201
        body = {"workspace": "admin", "name": "lab", "instance": box.json()["id"], "profile": "with-tqdm"}
        notebook = api.post(f"{url}/api/v1/notebooks/", json=body)
        assert notebook.status_code == 201, notebook.text
        read_notebook = reader("notebooks", notebook.json()["id"])
        _until(building, bool, "the environment build to begin")

        # While pip builds the environment: a job is admitted and runs, and another instance
        # starts (the build holds one of the provisioning worker's threads, not all of them).
        job = api.post(f"{url}/api/v1/jobs/", json={"workspace": "admin", "name": "quick", "command": "sleep 1"})
        assert job.status_code == 201, job.text
        row = _until(reader("jobs", job.json()["id"]), lambda r: r["started_at"] is not None, "the job to start")
        still_building = building() and read_notebook()["state"] == "STARTING"
        other = api.post(
            f"{url}/api/v1/instances/", json={"workspace": "admin", "name": "other", "profile": "cpu-small"}
        )
        assert other.status_code == 201, other.text
        _until(reader("instances", other.json()["id"]), lambda r: r["state"] == "RUNNING", "the other instance")
        assert still_building and building(), "the environment was built before the job and the instance started"
        # Started by the quick worker, not by the scheduler loop's catch-up of lost starts (after
        # PORTAL_START_LOST_AFTER_S, 30 s): the figure is hundredths of a second on a quiet machine.
        waited = _timestamp(row["started_at"]) - _timestamp(row["admitted_at"])
        print(f"job admission to running while the environment builds: {waited:.3f} s")
        assert waited < 10

        # Once built, the notebook's start follows.
        ready = _until(read_notebook, lambda r: r["state"] in ("READY", "FAILED"), "the notebook", timeout_s=600)
        assert ready["state"] == "READY", ready
        assert not building() and any((env / ".ready").exists() for env in envs.iterdir())

        logs = tmp_path / "portal-data" / "logs"
        quick, provisioning = (logs / "worker.log").read_text(), (logs / "provision-worker.log").read_text()
        assert re.search(r"portal\.build_notebook_environment\[.*\] succeeded", provisioning)
        assert re.search(r"portal\.converge\[.*\]: converging notebook \d+", provisioning)
        assert re.search(r"portal\.converge\[.*\]: converging job \d+", quick)  # the job's start
        assert re.search(r"portal\.converge\[.*\] succeeded", quick)
        assert not re.search(r"Task portal\.build_notebook_environment\[|converging (notebook|instance)", quick)
    finally:
        assert portal.stop() == 0
