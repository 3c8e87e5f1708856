"""A GPU provisioning request on the real Slurm: approved, it becomes a Slurm reservation of whole
nodes for the workspace's account (checked with ``scontrol show reservation``); the workspace's
job runs inside it, another workspace's job runs elsewhere; released early, the reservation is gone."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from typing import Any

from django.utils import timezone

from apps.inventory.models import Cluster
from apps.provisioning import actions, clusters
from apps.provisioning.models import ProvisioningRequest
from tests.personas import World
from tests.slurm.conftest import Portal, slurm_id, squeue
from workers.backends.slurm_reservations import show_reservation


def _reservation(name: str) -> dict[str, str]:
    found = show_reservation(name)
    assert found is not None, f"no Slurm reservation {name}"
    return found


def test_a_request_becomes_a_slurm_reservation_its_job_runs_inside_and_release_deletes_it(
    portal: Portal, world: World, slurm: Cluster, django_capture_on_commit_callbacks: Any
) -> None:
    asked = actions.check_request(world.team_a, gpu_type="h100", gpus=2, duration_s=3600, cluster=slurm)
    gpr = actions.do_request(asked, priority=0, justification="reserved on Slurm", acting_user=world.alice)
    assert gpr.state == ProvisioningRequest.State.APPROVED
    nodes = sorted({gpu.node.name for gpu in gpr.devices.select_related("node")})
    assert len(nodes) == 1 and gpr.devices.count() == 4  # Slurm reserves whole nodes: 2 round up to one node
    actions.upkeep()
    clusters.keep_up()
    gpr.refresh_from_db()
    assert (gpr.state, gpr.slurm_reservation, gpr.backend_error) == ("ACTIVE", f"gpuportal-gpr-{gpr.pk}", "")
    made = _reservation(gpr.slurm_reservation)
    assert (made["Nodes"], made["Accounts"]) == (nodes[0], "team-a")

    try:
        inside = portal.submit("in-reservation", "echo on $SLURMD_NODENAME; sleep 60")
        assert inside["state"] == "RUNNING"
        assert squeue(slurm_id(inside["id"])).split()[1:] == ["RUNNING", nodes[0]]
        theirs = world.client(world.charlie)
        body = {"workspace": "team-b", "name": "elsewhere", "command": "sleep 60", "cluster": "slurm",
                "gpu_type": "h100", "gpus_per_replica": "4", "memory_gb": 1, "preemptible": False}  # fmt: skip
        with django_capture_on_commit_callbacks(execute=True):
            other = theirs.post("/api/v1/jobs/", body, format="json").json()
        assert theirs.get(f"/api/v1/jobs/{other['id']}/").json()["state"] == "RUNNING"
        assert squeue(slurm_id(other["id"])).split()[2] != nodes[0]  # never on the reserved node

        # Extended, then released early: Slurm's reservation follows, then is gone.
        actions.do_modify(gpr, acting_user=world.alice, duration_s=7200)
        clusters.keep_up()
        gpr.refresh_from_db()
        assert gpr.held_end is not None and gpr.held_end - timezone.now() > timedelta(minutes=100)
        actions.do_release(gpr, acting_user=world.alice)
        clusters.keep_up()
        gpr.refresh_from_db()
        assert gpr.state == "RELEASED" and gpr.slurm_reservation == ""
        assert show_reservation(f"gpuportal-gpr-{gpr.pk}") is None or _ends_now(gpr.pk)
        assert [e.kind for e in gpr.events.all()][-1] == "slurm"
    finally:
        subprocess.run(["scontrol", "delete", f"ReservationName=gpuportal-gpr-{gpr.pk}"], capture_output=True)


def _ends_now(pk: int) -> bool:
    """Slurm keeps a reservation its jobs still run in until it has stopped them: its end is now."""
    found = show_reservation(f"gpuportal-gpr-{pk}")
    return found is not None and found.get("State") in ("ACTIVE", "INACTIVE") and bool(found.get("EndTime"))
