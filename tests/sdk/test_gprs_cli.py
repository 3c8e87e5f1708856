"""`gpuportal gpr ...` against a live embedded portal, as a user's shell runs them.

As in test_gprs_sdk.py, every request starts days ahead (nothing is held while other tests run)
and is withdrawn before the test ends.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from gpuportal import Client

from tests.sdk.conftest import GPUPORTAL, LivePortal, Run

pytestmark = pytest.mark.slow


def days_ahead(days: float) -> str:
    return (datetime.now(UTC) + timedelta(days=days)).replace(microsecond=0).isoformat()


@pytest.fixture
def withdrawn(portal_client: Client) -> Iterator[list[int]]:
    """The ids of the requests a test makes (it appends them), cancelled at its end."""
    made: list[int] = []
    yield made
    for ident in made:
        if portal_client.gprs.get(ident).state in ("REQUESTED", "APPROVED"):
            portal_client.gprs.cancel(ident)


def test_a_request_is_estimated_made_listed_changed_and_cancelled(cli: Run, withdrawn: list[int]) -> None:
    terms = ["-w", "demo-team", "-t", "h100", "-g", "2", "-d", "6h", "--start", days_ahead(3)]
    estimate = cli("gpr", "estimate", *terms)
    assert estimate.returncode == 0, estimate.stderr
    assert re.search(r"^Cluster:\s+local$", estimate.stdout, re.M) and "Approval:       at once" in estimate.stdout

    made = cli("gpr", "create", *terms, "-j", "Fine-tuning before the review.", "--priority", "5", "-q")
    assert made.returncode == 0, made.stderr
    ident = int(made.stdout)
    withdrawn.append(ident)
    listing = cli("gpr", "ls", "-w", "demo-team").stdout
    assert re.search(rf"^{ident}\s+demo-team\s+2 h100\s+local\s+6h\s+5\s+APPROVED\s+\d{{4}}-", listing, re.M), listing
    shown = cli("gpr", "show", str(ident)).stdout
    assert (
        "Justification:  Fine-tuning before the review." in shown
        and "Decided:        by the workspace's policy" in shown
    )
    data = json.loads(cli("gpr", "show", str(ident), "--json").stdout)
    assert (data["id"], data["state"], data["held_gpus"]) == (ident, "APPROVED", 2)

    shorter = cli("gpr", "modify", str(ident), "--duration", "3h")
    assert shorter.returncode == 0 and shorter.stdout.startswith(f"GPR {ident}: APPROVED"), shorter.stderr
    assert cli("gpr", "show", str(ident), "--json").stdout.count('"duration_s": 10800') == 1
    booked = cli("gpr", "calendar", "--from", days_ahead(2), "--to", days_ahead(5)).stdout
    assert re.search(r"demo-team\s+2 h100\s+local\s+APPROVED$", booked, re.M), booked
    steps = cli("gpr", "events", str(ident)).stdout
    assert re.search(r"requested\s+demo\s+Asked for 2 h100", steps) and "changed" in steps, steps

    cancelled = cli("gpr", "cancel", str(ident), "--yes")
    assert (cancelled.returncode, cancelled.stdout) == (0, f"GPR {ident}: CANCELLED\n")
    again = cli("gpr", "cancel", str(ident), "--yes")
    assert (again.returncode, again.stderr) == (1, f"Error: GPR {ident} is cancelled: it cannot be cancelled.\n")


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (["-g", "0"], "Error: --gpus: Ensure this value is greater than or equal to 1.\n"),
        (["-d", "20d"], "Error: --duration: At most 14 days for workspace demo-team; ask an admin for a longer one.\n"),
        (["-d", "soon"], "Error: --duration: 'soon' is not a duration such as 3d, 36h or 90m.\n"),
        (["--start", "2020-01-01T00:00Z"],
         "Error: --start: The start lies in the past; leave it out to start as soon as possible.\n"),
        (["--start", "tomorrow"], "Error: --start: 'tomorrow' is not a time such as 2026-12-01T09:00\n"),
        (["-t", "a100"], "Error: --type: No cluster has a100 GPUs.\n"),
    ],
)  # fmt: skip
def test_refused_terms_exit_2_naming_the_option(cli: Run, options: list[str], error: str) -> None:
    terms = {"-t": "h100", "-g": "1", "-d": "1h", "--start": days_ahead(3)}
    terms.update(dict(zip(options[::2], options[1::2], strict=True)))
    args = [part for pair in terms.items() for part in pair]
    refused = cli("gpr", "estimate", "-w", "demo-team", *args)
    assert (refused.returncode, refused.stdout, refused.stderr) == (2, "", error)


def test_only_an_admin_decides(
    cli: Run, cli_env: dict[str, str], live_portal: LivePortal, withdrawn: list[int]
) -> None:
    made = cli("gpr", "create", "-w", "demo-team", "-t", "h100", "-g", "6", "-d", "12h", "--start", days_ahead(4),
               "-j", "Pre-training.", "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    ident = made.stdout.strip()
    withdrawn.append(int(ident))
    assert cli("gpr", "show", ident, "--json").stdout.count('"state": "REQUESTED"') == 1
    refused = cli("gpr", "approve", ident)
    assert (refused.returncode, refused.stderr) == (1, "Error: Only platform admins decide provisioning requests.\n")

    admin_env = {**cli_env, "GPUPORTAL_TOKEN": Client.login(live_portal.url, "admin",
                                                            live_portal.passwords["admin"]).token or ""}  # fmt: skip

    def as_admin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([GPUPORTAL, *args], env=admin_env, capture_output=True, text=True, timeout=90)

    queue = as_admin("gpr", "ls", "--state", "REQUESTED").stdout
    assert re.search(rf"^{ident}\s+demo-team\s+6 h100\s+any\s+12h\s+0\s+REQUESTED", queue, re.M), queue
    no_reason = as_admin("gpr", "reject", ident)
    assert no_reason.returncode == 2 and "Missing option '--reason'" in no_reason.stderr
    more = as_admin("gpr", "approve", ident, "--gpus", "8")
    assert (more.returncode, more.stderr) == (
        2,
        "Error: --gpus: An approval may give fewer GPUs than asked (6), not more.\n",
    )
    approved = as_admin("gpr", "approve", ident, "--gpus", "3", "--duration", "6h", "--reason", "Three will do.")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.startswith(f"GPR {ident}: APPROVED by admin: 3 h100 on local, "), approved.stdout


def test_the_help_says_what_each_command_does(cli: Run) -> None:
    shown = cli("gpr", "--help").stdout
    for line in (
        "create    Ask for GPUs ahead of time.",
        "calendar  Every reservation (approved or active) in the window,",
        "approve   Platform admins: approve a pending request,",
        "release   End active reservations now:",
    ):
        assert line in shown, shown
    create = cli("gpr", "create", "--help").stdout
    assert "-d, --duration TEXT" in create and "3d, 36h, 90m" in create and "--justification" in create
