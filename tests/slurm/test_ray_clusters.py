"""A Ray cluster through the portal on the development Slurm: requested through the API, admitted
as a whole, started by the workload host as one batch job (the head, then its workers through
``srun``), and a fire-and-forget Ray job on it that uses every worker and leaves artifacts the API
hands back; nothing of it stays in Slurm's queue."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from apps.rayclusters.models import RayCluster
from tests.conftest import SHARED_ENV_DIR
from tests.rayclusters.test_local_clusters import DRIVER
from tests.slurm.conftest import Portal, squeue
from tests.slurm.test_ray import NODE_PYTHON

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)


@pytest.fixture
def ray_portal(portal: Portal, settings: Any) -> Portal:
    settings.PORTAL_NOTEBOOK_ENV_DIR = SHARED_ENV_DIR  # the Ray environment the nodes run from
    settings.PORTAL_NOTEBOOK_PYTHON = NODE_PYTHON
    settings.PORTAL_RAY_START_TIMEOUT_S = 300
    return portal


def test_a_ray_job_on_slurm_uses_every_worker_and_hands_back_its_artifacts(ray_portal: Portal) -> None:
    client = ray_portal.client
    body = {"workspace": "team-a", "name": "slurm-ray", "cluster": "slurm", "workers": 2, "gpu_type": "h100",
            "worker_gpus": "1", "head_memory_gb": 1, "worker_memory_gb": 1,
            "entrypoint": f"python -c {shlex.quote(DRIVER)}", "artifact_paths": ["artifacts"]}  # fmt: skip
    with ray_portal.capture(execute=True):
        response = client.post("/api/v1/ray-clusters/", body, format="json")
    assert response.status_code == 201, response.json()
    pk = response.json()["id"]
    cluster = RayCluster.objects.get(pk=pk)
    assert cluster.cluster is not None and cluster.cluster.name == "slurm"

    from apps.workloads.host import reconcile

    def state() -> str:
        reconcile(sweep=False)
        return RayCluster.objects.get(pk=pk).state

    import time

    deadline = time.monotonic() + 300
    while state() not in ("SUCCEEDED", "FAILED"):
        assert time.monotonic() < deadline, RayCluster.objects.get(pk=pk).state
        time.sleep(1)
    ended = client.get(f"/api/v1/ray-clusters/{pk}/").json()
    assert (ended["state"], ended["exit_code"]) == ("SUCCEEDED", 0), (
        ended,
        client.get(f"/api/v1/ray-clusters/{pk}/logs/").json(),
    )
    path = next(a["path"] for a in ended["artifacts"] if a["path"].endswith("nodes.json"))
    download = client.get(f"/api/v1/ray-clusters/{pk}/artifact/", {"path": path})
    assert download.status_code == 200
    nodes = json.loads(b"".join(download.streaming_content))
    assert sorted(nodes) == ["worker-0", "worker-1"] and len({node for _, node in nodes.values()}) == 2
    assert squeue(str(RayCluster.objects.get(pk=pk).backend_state.get("job_id", ""))) == ""
