"""An instance and a notebook launched through the API on the real Slurm cluster: the instance
is a batch job holding its GPU, the notebook a batch job running Jupyter, reached through the
same proxy as local notebooks, on its own host name, with the same sign-in; deleting them leaves
nothing in squeue."""

from __future__ import annotations

import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

from apps.catalog.models import ComputeProfile, NotebookProfile
from apps.compute.models import Instance, Notebook
from apps.inventory.actions import do_register_cluster
from apps.workspaces.unix import ensure_account
from tests.conftest import SHARED_ENV_DIR
from tests.personas import PASSWORD, World
from tests.proxy import Proxy, browser_session, sign_in
from tests.slurm.conftest import squeue


def test_instance_and_notebook_run_as_slurm_jobs(
    proxy: Proxy, tx_world: World, settings: Any, shared_work: Path
) -> None:
    # The workspace's account runs the server on the node: its directory and its environment (and
    # the interpreter behind it) are on storage the accounts can reach, as a cluster's are.
    settings.PORTAL_WORK_DIR = shared_work
    settings.PORTAL_NOTEBOOK_ENV_DIR = SHARED_ENV_DIR
    settings.PORTAL_NOTEBOOK_PYTHON = "/usr/bin/python3"
    do_register_cluster("slurm", kind="slurm", connection={"partition": "gpu"}, acting_user=tx_world.admin)
    NotebookProfile.objects.create(name="kernel-only", image="quay.io/jupyter/base-notebook", published=True)
    # Slurm's simulated nodes are small: 1 GPU, 1 core, 1 GB.
    ComputeProfile.objects.create(
        name="gpu-small", gpu_type="h100", gpu_count=Decimal(1), cpu_cores=1, memory_gb=1, published=True
    )
    client = tx_world.client(tx_world.alice)
    body = {"workspace": "team-a", "name": "on-slurm", "profile": "gpu-small", "cluster": "slurm"}
    response = client.post("/api/v1/instances/", body, format="json")
    assert response.status_code == 201, response.content
    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == Instance.State.RUNNING, instance.failure_reason
    assert instance.cluster is not None and instance.cluster.name == "slurm"
    holder = instance.backend_state["job_id"]
    assert "RUNNING" in squeue(holder)

    body = {"workspace": "team-a", "name": "lab", "instance": instance.pk, "profile": "kernel-only"}
    response = client.post("/api/v1/notebooks/", body, format="json")
    assert response.status_code == 201, response.content
    notebook = Notebook.objects.get(pk=response.json()["id"])
    assert notebook.state == Notebook.State.READY, notebook.failure_reason
    server = notebook.backend_state["job_id"]
    assert "RUNNING" in squeue(server)
    users = subprocess.run(["squeue", "-h", "-j", f"{holder},{server}", "-o", "%u %a"], capture_output=True, text=True)
    account = ensure_account(tx_world.team_a).user
    assert users.stdout.split("\n")[:2] == [f"{account} team-a"] * 2  # the workspace's accounts
    # The server imports the portal's identity module from its environment, which the portal alone
    # writes: a copy in the workspace's directory could be replaced by the workspace's code.
    assert not list(shared_work.rglob("portal_identity.py"))
    identity = next(SHARED_ENV_DIR.glob("*/share/gpuportal/identity/portal_identity.py"))
    for path in (identity, identity.parent):
        assert path.stat().st_uid == 0 and path.stat().st_mode & 0o022 == 0, path

    # On its own host: a member signs in through the portal, someone of another workspace is not
    # let in, and the server's token works for scripts.
    status = f"{notebook.url}api/status"
    assert sign_in(proxy.url, "bob", PASSWORD).get(status, timeout=30).status_code == 200
    assert sign_in(proxy.url, "charlie", PASSWORD).get(status, timeout=30).status_code == 404
    token = {"Authorization": f"token {notebook.access_token}"}
    assert browser_session().get(status, headers=token, timeout=10).status_code == 200
    assert browser_session().get(status, allow_redirects=False, timeout=10).status_code == 302

    response = client.delete(f"/api/v1/instances/{instance.pk}/")
    assert response.status_code in (200, 204), response.content
    instance.refresh_from_db()
    notebook.refresh_from_db()
    assert (instance.state, notebook.state) == (Instance.State.DELETED, Notebook.State.STOPPED)
    assert squeue(holder) == "" and squeue(server) == ""
    assert all("portal_notebook" not in route for route in proxy.routes().values())
