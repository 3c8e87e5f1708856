"""On Slurm, a cordoned or drained node is drained in Slurm too (Slurm then starts nothing there) and
resumed when it comes back.

The first tests run against the real Slurm of deploy/slurm.sh (node3: node1-4 are the static nodes,
node5 and node6 the elastic pool's) and skip, saying why, where Slurm's commands are not installed.
The last ones stand a recording `scontrol` in for Slurm's where no Slurm runs, to check what the
portal asks of it and that a refusal changes nothing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from apps.errors import ActionError
from apps.inventory.actions import do_discover_cluster, do_register_cluster
from apps.inventory.maintenance import do_cordon_node, do_drain_node, do_uncordon_node
from apps.inventory.models import Cluster, Node, NodePool
from tests.personas import World

NODE = "node3"

real_slurm = pytest.mark.skipif(
    shutil.which("scontrol") is None,
    reason="Slurm's commands (scontrol) are not installed here: `bash deploy/slurm.sh start` installs and starts Slurm",
)


def slurm_state(node: str) -> tuple[str, str]:
    """The node's State and Reason as `scontrol show node` prints them."""
    out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True, timeout=15)
    fields = dict(f.split("=", 1) for f in out.stdout.split() if "=" in f)
    reason = out.stdout.split("Reason=", 1)[1].split(" [", 1)[0] if "Reason=" in out.stdout else ""
    return fields.get("State", ""), reason


@real_slurm
def test_a_cordoned_node_is_drained_in_slurm_and_resumed_when_back(world: World) -> None:
    cluster = do_register_cluster("slurm", kind="slurm", connection={"partition": "gpu"}, acting_user=world.admin)
    node = Node.objects.get(pool__cluster=cluster, name=NODE)
    client = world.client(world.admin)
    try:
        response = client.post(f"/api/v1/nodes/{node.pk}/cordon/", {"reason": "firmware"}, format="json")
        assert response.status_code == 200, response.json()
        state, reason = slurm_state(NODE)
        assert "DRAIN" in state and reason.startswith("gpuportal: firmware")

        do_discover_cluster(cluster, acting_user=world.admin)  # Slurm now reports it drained
        node.refresh_from_db()
        assert (node.state, node.maintenance) == (Node.State.DRAINED, "cordoned")

        response = client.post(f"/api/v1/nodes/{node.pk}/uncordon/")
        assert response.status_code == 200 and response.json()["maintenance"] == ""
        assert "DRAIN" not in slurm_state(NODE)[0]
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={NODE}", "State=RESUME"], capture_output=True, timeout=15)


@real_slurm
def test_a_drained_slurm_node_ends_drained_in_both(world: World) -> None:
    cluster = do_register_cluster("slurm", kind="slurm", connection={"partition": "gpu"}, acting_user=world.admin)
    node = Node.objects.get(pool__cluster=cluster, name=NODE)
    try:
        node = do_drain_node(node, reason="disk swap", acting_user=world.admin)
        assert node.maintenance == "drained" and "DRAIN" in slurm_state(NODE)[0]
    finally:
        do_uncordon_node(node, acting_user=world.admin)
    assert "DRAIN" not in slurm_state(NODE)[0]


# --- What the portal asks of scontrol, where no Slurm runs -----------------------------------------

FAKE_SCONTROL = """#!/bin/sh
echo "$@" >> {log}
case "$*" in
  *Invalid*) echo "scontrol: error: Invalid node name specified" >&2; exit 1;;
  "show node -o"*) echo "NodeName=node3 Arch=x86_64 State=IDLE+DRAIN Reason=gpuportal:_x [root@h]";;
esac
"""


@pytest.fixture
def scontrol(tmp_path: Path, monkeypatch: Any) -> Path:
    """A `scontrol` first on the PATH that records its arguments, one call a line."""
    log = tmp_path / "calls"
    log.touch()
    script = tmp_path / "bin" / "scontrol"
    script.parent.mkdir()
    script.write_text(FAKE_SCONTROL.format(log=log))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{Path('/usr/bin')}:{Path('/bin')}")
    return log


def slurm_node(name: str = NODE) -> Node:
    cluster = Cluster.objects.create(name="slurm", kind=Cluster.Kind.SLURM, connection={"partition": "gpu"})
    return Node.objects.create(pool=NodePool.objects.create(cluster=cluster, name="gpu"), name=name)


def test_it_asks_slurm_to_drain_and_resume_the_node(world: World, scontrol: Path) -> None:
    node = slurm_node()

    do_cordon_node(node, reason="new  fans", acting_user=world.admin)
    do_uncordon_node(node, acting_user=world.admin)

    assert scontrol.read_text().splitlines() == [
        "update NodeName=node3 State=DRAIN Reason=gpuportal: new fans",
        "show node -o",
        "update NodeName=node3 State=RESUME",
    ]


def test_a_refusal_by_slurm_changes_nothing(world: World, scontrol: Path) -> None:
    node = slurm_node("Invalid")

    with pytest.raises(ActionError, match="Invalid node name"):
        do_drain_node(node, reason="firmware", acting_user=world.admin)

    node.refresh_from_db()
    assert node.maintenance == "" and node.cordoned_at is None


def test_the_local_cluster_asks_no_scontrol(world: World, scontrol: Path) -> None:
    do_drain_node(Node.objects.get(pool__cluster__name="local"), acting_user=world.admin)

    assert scontrol.read_text() == ""
