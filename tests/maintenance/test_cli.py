"""`gpuportal admin node` and `gpuportal admin maintenance` against a live embedded portal: admins
cordon, drain and bring back its node and announce a window; anyone else is refused with the
portal's reason; bad input is a message and a non-zero exit."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from gpuportal import Client

from tests.sdk.conftest import LivePortal, Run

pytestmark = pytest.mark.slow


def test_an_admin_maintains_the_node_from_the_command_line(
    live_portal: LivePortal, cli: Run, cli_env: dict[str, str]
) -> None:
    admin = Client.login(live_portal.url, "admin", live_portal.passwords["admin"])
    node = admin.request("GET", "nodes/", params={"pool__cluster__name": "local"})["results"][0]
    target = f"local/{node['name']}"

    refused = cli("admin", "node", "cordon", target)
    assert refused.returncode == 1 and refused.stderr.strip() == "Error: Only platform admins can do this."

    cli_env["GPUPORTAL_TOKEN"] = str(admin.token)
    try:
        cordoned = cli("admin", "node", "cordon", target, "--reason", "fan noise")
        assert cordoned.returncode == 0, cordoned.stderr
        assert cordoned.stdout.strip() == f"Node {target}: cordoned (fan noise); the cluster reports it ready."
        drained = cli("admin", "node", "drain", target, "--grace", "5", "--json")
        assert drained.returncode == 0, drained.stderr
        assert json.loads(drained.stdout)["maintenance"] in ("draining", "drained")
    finally:
        back = cli("admin", "node", "uncordon", target)
    assert back.returncode == 0 and back.stdout.startswith(f"Node {target}: in service")

    assert cli("admin", "node", "cordon", "local").returncode == 2  # no node named
    missing = cli("admin", "node", "cordon", "local/no-such-node")
    assert missing.returncode == 1 and "No node no-such-node in cluster local" in missing.stderr
    assert cli("admin", "node", "drain", target, "--grace", "-1").returncode == 2

    start = datetime.now(UTC) + timedelta(days=2)
    begin, end = f"{start:%Y-%m-%dT%H:%MZ}", f"{start + timedelta(hours=2):%Y-%m-%dT%H:%MZ}"
    announced = cli("admin", "maintenance", "announce", "local", "--start", begin, "--end", end,
                    "--reason", "New power supply")  # fmt: skip
    assert announced.returncode == 0, announced.stderr
    window = admin.maintenance_windows("local")[-1]
    listed = cli("admin", "maintenance", "list")
    assert listed.returncode == 0 and "New power supply" in listed.stdout
    backwards = cli("admin", "maintenance", "announce", "local", "--start", begin, "--end", begin, "--reason", "x")
    assert backwards.returncode != 0 and "end_at" in backwards.stderr
    withdrawn = cli("admin", "maintenance", "withdraw", str(window["id"]))
    assert withdrawn.returncode == 0 and not admin.maintenance_windows("local")
