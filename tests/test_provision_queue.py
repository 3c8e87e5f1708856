"""Provisioning never holds up a job: instances and notebooks start on a worker of their own
(the "provision" queue), so while that worker is stuck (a long environment build, a slow Slurm or
Kubernetes start; here it is simply stopped), jobs still start and finish at once, in the
embedded portal started exactly as deploy/run.sh starts it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import requests

from tests.test_embedded import EmbeddedPortal
from tests.test_supervisor import _portal_process, _until


def test_instances_and_notebooks_go_to_the_provision_queue_and_jobs_do_not() -> None:
    from django.conf import settings

    routes = settings.CELERY_TASK_ROUTES
    assert routes["portal.converge_instance"]["queue"] == routes["portal.converge_notebook"]["queue"] == "provision"
    for quick in ("portal.schedule_cycle", "portal.start_job", "portal.sync_job"):
        assert quick not in routes  # the default queue, "celery"


@pytest.mark.slow
def test_a_stuck_provisioning_worker_does_not_delay_a_job(tmp_path: Path) -> None:
    portal = EmbeddedPortal(tmp_path / "portal-data")
    try:
        url = portal.wait_ready()
        headers = portal.admin_headers(url)
        provisioner = _portal_process(portal.data_dir, "-n provision@")
        assert provisioner is not None
        os.kill(provisioner, signal.SIGSTOP)
        try:
            body = {"workspace": "admin", "name": "box", "profile": "cpu-small"}
            instance = requests.post(f"{url}/api/v1/instances/", json=body, headers=headers, timeout=10).json()
            instance_url = f"{url}/api/v1/instances/{instance['id']}/"
            _until(
                lambda: requests.get(instance_url, headers=headers, timeout=10).json()["state"] == "PROVISIONING",
                "the instance to be admitted",
            )
            body = {"workspace": "admin", "name": "quick", "command": "echo done"}
            job = requests.post(f"{url}/api/v1/jobs/", json=body, headers=headers, timeout=10).json()
            job_url = f"{url}/api/v1/jobs/{job['id']}/"
            started = time.monotonic()
            _until(
                lambda: requests.get(job_url, headers=headers, timeout=10).json()["state"] == "SUCCEEDED",
                "the job, while provisioning is stuck",
                timeout_s=30,
            )
            # The instance waits for its worker: it was never the job's.
            assert requests.get(instance_url, headers=headers, timeout=10).json()["state"] == "PROVISIONING"
            print(f"job submitted to succeeded with provisioning stuck: {time.monotonic() - started:.2f} s")
        finally:
            os.kill(provisioner, signal.SIGCONT)
        _until(
            lambda: requests.get(instance_url, headers=headers, timeout=10).json()["state"] == "RUNNING",
            "the instance once its worker goes on",
        )
    finally:
        assert portal.stop() == 0
