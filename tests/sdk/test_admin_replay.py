"""`gpuportal admin replay` against a live embedded portal: the demo user's real jobs make the
history, the portal's own Celery worker (filesystem broker) runs the replay in the background, and
the command waits for it, prints the figures side by side and writes the CSV."""

from __future__ import annotations

import csv
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from gpuportal import Client

from tests.sdk.conftest import LivePortal, Run, submitted_id, wait_for

pytestmark = pytest.mark.slow


def test_an_admin_replays_the_portal_s_history_from_the_command_line(
    live_portal: LivePortal, cli: Run, cli_env: dict[str, str], tmp_path: Path, portal_client: Client
) -> None:
    since = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name in ("first", "second"):
        done = cli("submit", "--name", name, "--command", "sleep 1", "--gpus", "1", "-w", "demo")
        assert done.returncode == 0, done.stderr
        wait_for(portal_client, submitted_id(done.stdout), lambda job: job.is_final)

    # The demo user is no admin: refused, with the portal's reason, and nothing is started.
    refused = cli("admin", "replay", "--since", since, "--wait")
    assert refused.returncode == 1
    assert refused.stderr.strip() == "Error: Only platform admins can run or see what-if replays."

    admin = Client.login(live_portal.url, "admin", live_portal.passwords["admin"])
    cli_env["GPUPORTAL_TOKEN"] = str(admin.token)
    out = tmp_path / "replay.csv"
    replayed = cli("admin", "replay", "--since", since, "--quota", "demo=+1", "--cluster-gpus", "+8",
                   "--wait", "--timeout", "120", "--csv", str(out), timeout=150)  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr
    lines = replayed.stdout.splitlines()
    assert lines[0].startswith("Changes: quota of demo: +1 GPUs; cluster: +8 GPUs")
    assert lines[1].split()[:3] == ["WORKSPACE", "JOBS", "NEVER"]
    demo = next(line for line in lines if line.startswith("demo "))
    assert demo.split()[1:3] == ["2", "(2)"]  # both jobs, in both replays
    rows = {row["workspace"]: row for row in csv.DictReader(out.open())}
    assert rows["demo"]["jobs_baseline"] == rows["demo"]["jobs_whatif"] == "2"
    assert rows["(all)"]["not_run_whatif"] == "0"

    shown = admin.replay(admin.request("GET", "admin/whatif/")["results"][0]["id"])
    assert shown["state"] == "SUCCEEDED"
    assert (
        shown["result"]["settings"]["whatif"]["cluster_gpus"]
        == shown["result"]["settings"]["baseline"]["cluster_gpus"] + 8
    )


NOT_A_TIME = "Error: --since: 'last week' is not a date or time, such as 2026-11-20 or 2026-11-20T09:00Z."
NOT_A_SIZE = (
    "Error: quotas.0: 'demo=lots': the quota must be +N, -N or N whole GPUs, "
    "such as team-b=+16, team-b=-4 or team-b=24."
)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "last week"], NOT_A_TIME),
        (["--since", "2026-11-20", "--quota", "demo=lots"], NOT_A_SIZE),
        (["--since", "2026-11-20", "--quota", "nobody=+1"], "Error: quotas: There is no workspace named nobody."),
        (["--since", "2026-11-20", "--until", "2026-11-19"], "Error: until: The window must end after it begins."),
        (["--since", "2026-11-20", "--csv", "o.csv"], "Error: --csv needs --wait: the figures exist once it is done."),
        (["--since", "2026-11-20", "--min-runtime", "-5"], "Error: --min-runtime must be 0 seconds or more."),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    live_portal: LivePortal, cli: Run, cli_env: dict[str, str], args: list[str], message: str
) -> None:
    cli_env["GPUPORTAL_TOKEN"] = str(Client.login(live_portal.url, "admin", live_portal.passwords["admin"]).token)
    refused = cli("admin", "replay", *args)
    assert refused.returncode == 2, refused
    assert refused.stderr.strip() == message
