"""From a portal notebook's kernel, the SDK alone brings a Ray cluster up, submits a job to it with
Ray's own client, reads the job's logs and takes the cluster down, configured by nothing but the
notebook's environment: a real Jupyter server on the local backend (sandboxed, as the workspace's
account), the live portal behind the real proxy, the scheduler loop's work in a thread of its own,
and a real Ray cluster reached on its own host name through the portal's Ray proxy."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import ray
from django.db import connection

from apps.catalog.models import NotebookProfile
from apps.compute.models import Notebook
from apps.rayclusters.models import RayCluster
from apps.scheduling.adapter import run_cycle
from apps.workloads.host import reconcile
from tests.compute.test_notebook_sdk import run_in_kernel
from tests.leftovers import stop_everything_of
from tests.personas import World
from tests.proxy import Proxy
from tests.rayclusters.test_local_clusters import processes_of, wait_for

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)

# The notebook's cell. The job prints the key of the workload it runs in (every process of a
# cluster on the local backend has it) and a number that is in no command line, only in its output.
CELL = """
import shlex, time
from gpuportal.ray import Cluster, ClusterConfiguration
from ray.job_submission import JobStatus

cluster = Cluster(ClusterConfiguration(name="lab", num_workers=1, head_cpus=1, head_memory=2,
                                       worker_cpus=1, worker_memory=2))
cluster.up()
cluster.wait_ready(timeout=180)
status, ready = cluster.status()
client = cluster.job_client
driver = 'import os; print("ran in", os.environ["PORTAL_JOB_KEY"], "with", 6 * 7)'
job = client.submit_job(entrypoint=f"python -c {shlex.quote(driver)}")
deadline = time.monotonic() + 120
while (job_status := client.get_job_status(job)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
    assert time.monotonic() < deadline, job_status
    time.sleep(0.5)
logs = client.get_job_logs(job)
details = cluster.details(print_to_console=False)
down = cluster.down()
{"id": cluster.id, "status": status.name, "ready": ready, "job": str(job_status), "logs": logs,
 "nodes": [node.name for node in details.nodes], "dashboard": details.dashboard_url, "after_down": down.state}
"""


@pytest.fixture
def ray_profile(tx_world: World) -> NotebookProfile:
    """A notebook profile with Ray's job client, the version the portal's Ray nodes run (the
    environment is built once per machine, then cached)."""
    return NotebookProfile.objects.create(
        name="ray", image="rayproject/ray", python_packages=[f"ray[default]=={ray.__version__}"], published=True
    )


@pytest.fixture
def short_work(proxy: Proxy, settings: Any, tmp_path: Path) -> Iterator[Path]:
    """A work directory short enough for Ray's Unix sockets, which the workspaces' accounts can
    reach (as tests/rayclusters/test_local_clusters.py's); nothing started there outlives the test."""
    work = Path(f"/tmp/gpr-{os.getpid()}-{tmp_path.name[-12:]}")
    work.mkdir(mode=0o711)
    settings.PORTAL_WORK_DIR = work
    settings.PORTAL_RAY_START_TIMEOUT_S = 240
    # The notebook's start builds its environment (JupyterLab and Ray, ~600 MB) on a machine that has
    # none yet: minutes on a fresh, loaded one.
    settings.PORTAL_NOTEBOOK_START_TIMEOUT_S = 900
    try:
        yield work
    finally:
        stop_everything_of(str(work))
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def scheduler_loop(settings: Any, interval_s: float = 0.25) -> Iterator[None]:
    """What the portal's scheduler loop does (apps/scheduling/management/commands/run_scheduler.py),
    in a thread: reconcile every workload with its backend (a start, a watch, a stop), then run a
    scheduling cycle. Requests no longer start anything themselves, as with a worker."""
    settings.PORTAL_SCHEDULER_TRIGGER = "off"
    settings.PORTAL_WORKLOAD_TRIGGER = "off"
    stop, failed = threading.Event(), []

    def loop() -> None:
        try:
            while not stop.is_set():
                reconcile(sweep=False)
                run_cycle()
                stop.wait(interval_s)
        except BaseException as exc:  # the test fails with it once the loop is over
            failed.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=loop, name="scheduler-loop", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=120)
        assert not thread.is_alive() and not failed, failed


def test_a_notebooks_kernel_brings_a_cluster_up_runs_a_ray_job_reads_its_logs_and_takes_it_down(
    proxy: Proxy, tx_world: World, ray_profile: NotebookProfile, short_work: Path, settings: Any
) -> None:
    alice = tx_world.client(tx_world.alice)
    instance = {"workspace": "team-a", "name": "box", "profile": "cpu-small"}
    box = alice.post("/api/v1/instances/", instance, format="json")
    assert box.status_code == 201, box.content
    body = {"workspace": "team-a", "name": "lab", "instance": box.json()["id"], "profile": ray_profile.name}
    created = alice.post("/api/v1/notebooks/", body, format="json")
    assert created.status_code == 201, created.content
    notebook = Notebook.objects.get(pk=created.json()["id"])
    assert notebook.state == Notebook.State.READY, notebook.failure_reason

    with scheduler_loop(settings):
        result = run_in_kernel(notebook.url, notebook.access_token, CELL, timeout_s=300)
        # Taken down: the loop stops its nodes and records the end.
        ended = RayCluster.objects.filter(pk=result["id"], state=RayCluster.State.STOPPED)
        cluster = wait_for(ended.first, 120)

    # The cluster came up with its head and worker, through the notebook's own credential.
    assert (cluster.workspace.name, cluster.created_by) == ("team-a", tx_world.alice)
    assert (result["status"], result["ready"]) == ("READY", True)
    assert result["nodes"] == ["head", "worker-0"]
    assert result["dashboard"] == cluster.dashboard_url
    # The job ran in that cluster, and its output came back through the portal's proxy.
    assert result["job"] == "SUCCEEDED", result["logs"]
    assert f"ran in raycluster-{cluster.pk} with 42" in result["logs"]
    assert result["after_down"] in ("STOPPING", "STOPPED")

    # Down means gone: the workload ended, its resources are free and none of its Ray processes is left.
    assert cluster.proxy_target == "" and not cluster.allocations.exists()
    assert wait_for(lambda: not processes_of(cluster), 30)
