"""A real worker killed in the middle of provisioning a notebook: after a new worker starts,
reconcile converges, with no orphaned process, proxy route or Slurm job left behind. The new
start takes the dead one's over: it adopts the server the dead worker launched where that start
left a record of it (Backend.adopt), else the sweep stops it; either way one server runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from apps.catalog.models import ComputeProfile, NotebookProfile
from apps.compute.actions import check_launch_instance, check_launch_notebook, do_delete_instance
from apps.compute.models import Instance, Notebook
from apps.inventory.actions import do_register_cluster
from apps.workloads.host import reconcile
from portal.celery import app
from tests.conftest import SHARED_ENV_DIR
from tests.personas import World
from tests.proxy import Proxy, browser_session
from tests.workers.conftest import ROOT, _database_url_for
from workers.tasks import converge

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)

WAIT_S = 90.0


def _start_worker(queue: str, settings: Any) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DATABASE_URL": _database_url_for(connection.settings_dict),
        "PORTAL_SCHEDULER_TRIGGER": "off",
        "PORTAL_WORKLOAD_TRIGGER": "off",
        "PORTAL_WORK_DIR": str(settings.PORTAL_WORK_DIR),
        "PORTAL_NOTEBOOK_ENV_DIR": str(settings.PORTAL_NOTEBOOK_ENV_DIR),
        "PORTAL_NOTEBOOK_PYTHON": str(settings.PORTAL_NOTEBOOK_PYTHON),
        "PORTAL_PROXY_API_URL": settings.PORTAL_PROXY_API_URL,
        "PORTAL_PROXY_AUTH_TOKEN": settings.PORTAL_PROXY_AUTH_TOKEN,
        "PORTAL_INTERNAL_URL": settings.PORTAL_INTERNAL_URL,
    }
    argv = [sys.executable, "-m", "celery", "-A", "portal", "worker", "--pool=solo", "-Q", queue,
            "-n", f"{uuid.uuid4().hex[:8]}@%h", "--without-mingle", "--without-gossip"]  # fmt: skip
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.terminate()
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def _server_pids(owner: str, key: str) -> list[int]:
    """Leaders of the process groups the local backend started for `key`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes().split(b"\0")[3:4] != [b"portal-job"]:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if f"PORTAL_JOB_KEY={key}".encode() in environ and f"PORTAL_OWNER={owner}".encode() in environ:
            found.append(int(entry.name))
    return found


def _slurm_jobs(owner: str, key: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%k"], capture_output=True, text=True, timeout=15).stdout
    return [line.split("|")[0] for line in out.splitlines() if line.split("|")[1:] == [key, owner]]


def _until(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def worker_queue(proxy: Proxy, settings: Any) -> Iterator[str]:
    """A queue of our own: tasks queued without naming one, and provisioning, go there."""
    queue = f"crash-{uuid.uuid4().hex[:10]}"
    default, routes = app.conf.task_default_queue, app.conf.task_routes
    app.conf.task_default_queue = queue
    app.conf.task_routes = {"portal.converge": {"queue": queue}}
    _reroute()
    try:
        yield queue
    finally:
        app.conf.task_default_queue, app.conf.task_routes = default, routes
        _reroute()


def _reroute() -> None:
    """Make the app read its routes again (it keeps them once read)."""
    app.amqp.flush_routes()
    app.amqp.__dict__.pop("router", None)


@pytest.mark.parametrize("cluster", ["local", "slurm"])
def test_worker_killed_mid_provisioning_converges_without_orphans(
    cluster: str, proxy: Proxy, worker_queue: str, tx_world: World, settings: Any, shared_work: Path
) -> None:
    target = None
    if cluster == "slurm":
        # The notebook runs as the workspace's account: on storage it can reach, as a cluster's.
        settings.PORTAL_WORK_DIR = shared_work
        settings.PORTAL_NOTEBOOK_ENV_DIR = SHARED_ENV_DIR
        settings.PORTAL_NOTEBOOK_PYTHON = "/usr/bin/python3"
        target = do_register_cluster("slurm", kind="slurm", connection={"partition": "gpu"}, acting_user=tx_world.admin)
    profile = ComputeProfile.objects.create(
        name="gpu-small", gpu_type="h100", gpu_count=Decimal(1), cpu_cores=1, memory_gb=1, published=True
    )
    nb_profile = NotebookProfile.objects.create(name="kernel-only", image="jupyter/base-notebook", published=True)
    instance = check_launch_instance(
        tx_world.team_a, name="box", profile=profile, requested_cluster=target, acting_user=tx_world.alice
    )
    instance.refresh_from_db()  # admitted and started on commit (the proxy fixture runs workloads inline)
    assert instance.state == Instance.State.RUNNING, instance.failure_reason
    assert instance.cluster is not None and instance.cluster.kind == cluster
    settings.PORTAL_WORKLOAD_TRIGGER = "off"  # from here on, only real workers start things
    notebook = check_launch_notebook(
        tx_world.team_a, instance=instance, name="lab", profile=nb_profile, acting_user=tx_world.alice
    )
    key, owner = f"notebook-{notebook.pk}", str(settings.PORTAL_WORK_DIR)

    # A worker starts provisioning the notebook, and is killed once the server is launched but
    # before the worker recorded it.
    first = _start_worker(worker_queue, settings)
    try:
        converge.apply_async(args=["notebook", notebook.pk], queue=worker_queue)
        if cluster == "local":
            _until(lambda: _server_pids(owner, key), "the notebook server to be launched")
        else:
            _until(lambda: _slurm_jobs(owner, key), "the notebook's Slurm job to be submitted")
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        _stop(first)
    notebook.refresh_from_db()
    assert notebook.state == Notebook.State.STARTING and notebook.backend_state is None
    assert not any(route.get("portal_notebook") == notebook.pk for route in proxy.routes().values())

    # A new worker starts; the scheduler loop's reconcile hands it the notebook again, which
    # adopts what the dead worker launched or starts it anew and stops what was left behind.
    settings.PORTAL_WORKLOAD_TRIGGER = "task"
    second = _start_worker(worker_queue, settings)
    try:
        reconcile()
        _until(lambda: Notebook.objects.get(pk=notebook.pk).state == Notebook.State.READY, "the notebook to be ready")
        reconcile()
    finally:
        _stop(second)
    notebook.refresh_from_db()
    run = notebook.backend_state
    if cluster == "local":
        # One server: the dead worker's, adopted, or a new one, the dead worker's stopped.
        assert _server_pids(owner, key) == [run["replicas"][0]["pid"]]
    else:
        assert _until(lambda: _slurm_jobs(owner, key) == [run["job_id"]], "only the recorded Slurm job to remain")
    routes = [prefix for prefix, route in proxy.routes().items() if route.get("portal_notebook") == notebook.pk]
    assert len(routes) == 1
    token = {"Authorization": f"token {notebook.access_token}"}  # on the notebook's own host
    assert browser_session().get(f"{notebook.url}api/status", headers=token, timeout=10).status_code == 200

    # Deleting the instance leaves nothing of either attempt.
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"
    do_delete_instance(Instance.objects.get(pk=instance.pk), acting_user=tx_world.alice)
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.DELETED
    assert _server_pids(owner, key) == [] and _server_pids(owner, f"instance-{instance.pk}") == []
    if cluster == "slurm":
        assert _until(lambda: not _slurm_jobs(owner, key), "the notebook's Slurm jobs to leave the queue")
    assert not any("portal_notebook" in route for route in proxy.routes().values())
