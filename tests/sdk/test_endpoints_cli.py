"""`gpuportal endpoints ...` against a live embedded portal, as a user's shell runs them.

As in test_endpoints_sdk.py, the admin's llama.cpp profile on CPU and a tiny model in the
workspace's directory make endpoints of workspace demo-team really start and serve.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from gpuportal import Client

from tests.sdk.conftest import LivePortal, Run, until
from tests.sdk.test_endpoints_sdk import MODEL, PROFILE, READY_S, model_job, prepared

pytestmark = pytest.mark.slow


@pytest.fixture
def served(live_portal: LivePortal) -> Iterator[Client]:
    with prepared(live_portal) as client:
        yield client


def test_endpoints_are_created_listed_shown_scaled_updated_and_deleted(
    cli: Run, served: Client, live_portal: LivePortal
) -> None:
    port = urlsplit(live_portal.url).port
    quick = cli("endpoints", "create", "cli-chat", "--path", MODEL, "-w", "demo-team", "--max", "2",
                "--wait", "--timeout", "0")  # fmt: skip
    assert quick.returncode == 124  # its server takes a second or two to start
    made = re.match(r"Deployed endpoint (\d+) \(cli-chat\) in workspace demo-team: models/tiny.gguf, 1 to 2 replicas\.",
                    quick.stderr)  # fmt: skip
    assert made, quick.stderr
    ident = made.group(1)
    assert f"Endpoint {ident} cli-chat: DEPLOYING, 0 of 1 serving" in quick.stderr
    url = f"http://ep-cli-chat-{ident}.localhost:{port}/v1"
    waited = cli("endpoints", "wait", "cli-chat", "-w", "demo-team", "--timeout", str(READY_S))
    assert (waited.returncode, waited.stdout) == (0, f"{url}\n"), waited.stderr

    listing = cli("endpoints", "ls", "-w", "demo-team").stdout
    assert re.search(rf"^{ident}\s+cli-chat\s+demo-team\s+{PROFILE}\s+{MODEL}\s+1/1-2\s+READY\s+{re.escape(url)}$",
                     listing, re.M), listing  # fmt: skip
    shown = cli("endpoints", "show", ident).stdout
    for line in ("State:         READY", f"URL:           {url}", "Replicas:      1 to 2; 1 wanted now",
                 "Scale to zero: never", "Serving:       1"):  # fmt: skip
        assert line in shown, shown
    assert re.search(r"^Replica 1:\s+\d+ cli-chat-1 \(v1\) READY$", shown, re.M), shown
    data = json.loads(cli("endpoints", "show", "cli-chat", "-w", "demo-team", "--json").stdout)
    assert (data["id"], data["state"], data["path"], data["max_replicas"]) == (int(ident), "READY", MODEL, 2)

    scaled = cli("endpoints", "scale", "cli-chat", "-w", "demo-team", "--min", "0", "--scale-to-zero", "10m")
    assert scaled.returncode == 0, scaled.stderr
    assert scaled.stdout.startswith(
        f"Endpoint {ident} cli-chat: 0 to 2 replicas, to zero after 600 s without requests.\n"
    )  # fmt: skip
    refused = cli("endpoints", "scale", ident, "--min", "3")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == "Error: --min: The minimum (3) must lie between 0 and the maximum (2).\n"
    never = cli("endpoints", "scale", ident, "--scale-to-zero", "never")  # no minimum: it must scale to zero
    assert (never.returncode, never.stderr) == (
        2, "Error: --min: An endpoint with no minimum replica scales to zero: give it a scale-to-zero delay.\n"
    )  # fmt: skip
    nothing = cli("endpoints", "scale", ident)
    assert (nothing.returncode, nothing.stderr) == (2, "Error: Give --min, --max or --scale-to-zero.\n")

    events = cli("endpoints", "events", ident).stdout
    assert re.search(r"^\d\d:\d\d:\d\d\s+0 -> 1\s+deployed with 1 replica$", events, re.M), events
    assert "Uvicorn running" in until(lambda: cli("endpoints", "logs", ident).stdout, lambda out: "Uvicorn" in out)
    bad_replica = cli("endpoints", "logs", ident, "--replica", "999999")
    assert (bad_replica.returncode, bad_replica.stderr) == (
        2, "Error: --replica: Give the id of one of this endpoint's replicas.\n"
    )  # fmt: skip
    token = cli("endpoints", "token", ident, "--name", "cli test", "--expires-in-days", "1")
    assert token.returncode == 0 and re.fullmatch(r"gpp_\w+_[\w-]+\n", token.stdout), token.stdout
    assert token.stderr == f"A token for endpoint cli-chat at {url} (shown only this once):\n"

    updated = cli("endpoints", "update", ident, "--path", MODEL, "--description", "v2", "--wait",
                  "--timeout", str(READY_S))  # fmt: skip
    assert (updated.returncode, updated.stdout) == (0, f"{url}\n"), updated.stderr
    assert f"Endpoint {ident} cli-chat: version 2, {MODEL} ({PROFILE})." in updated.stderr
    assert "Version:       2" in cli("endpoints", "show", ident).stdout

    asked = cli("endpoints", "delete", ident, input="n\n")
    assert (asked.returncode, asked.stderr.splitlines()[-1]) == (1, "Error: Not deleted.")
    deleted = cli("endpoints", "delete", ident, "--yes")
    assert deleted.returncode == 0 and re.fullmatch(rf"Endpoint {ident} cli-chat: DELET(ING|ED)\n", deleted.stdout)
    until(lambda: served.endpoints.get(int(ident)), lambda e: e.state == "DELETED")
    again = cli("endpoints", "delete", ident, "--yes")
    assert (again.returncode, again.stderr) == (1, "Error: Endpoint cli-chat is already deleted.\n")
    assert ident not in cli("endpoints", "ls", "-w", "demo-team").stdout  # ended ones only with --all
    assert re.search(rf"^{ident}\s+cli-chat\s.*DELETED", cli("endpoints", "ls", "--all").stdout, re.M)
    missing = cli("endpoints", "show", "cli-chat", "-w", "demo-team")
    assert (missing.returncode, missing.stderr) == (
        1, "Error: Endpoint cli-chat was not found in workspace demo-team (or you cannot see it).\n"
    )  # fmt: skip


def test_a_finished_jobs_artifact_is_deployed_from_the_command_line(cli: Run, served: Client) -> None:
    job = model_job(served)
    made = cli("endpoints", "create", "cli-job", "--from-job", str(job.id), "--artifact", "model/tiny.gguf",
               "-w", "demo-team", "--min", "0", "--scale-to-zero", "60", "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    shown = cli("endpoints", "show", made.stdout.strip()).stdout
    assert f"Model:         job {job.id}: model/tiny.gguf\n" in shown
    assert f"Served from:   job-{job.id}/model/tiny.gguf\n" in shown
    assert "State:         IDLE\n" in shown and "Scale to zero: after 60 s without requests\n" in shown
    waited = cli("endpoints", "wait", "cli-job", "-w", "demo-team", "--timeout", "5")  # scaled to zero: ready
    assert waited.returncode == 0 and waited.stdout.endswith("/v1\n")
    assert cli("endpoints", "delete", "cli-job", "-w", "demo-team", "--yes").returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--path", MODEL, "--min", "3", "--max", "2"],
         "--min: The minimum (3) must lie between 0 and the maximum (2)."),
        (["--path", MODEL, "--min", "0"],
         "--min: An endpoint with no minimum replica scales to zero: give it a scale-to-zero delay."),
        (["--path", MODEL, "--max", "0"], "--max: Ensure this value is greater than or equal to 1."),
        (["--path", MODEL, "--min", "0", "--scale-to-zero", "5"], "--scale-to-zero: The scale-to-zero delay is 60 to"),
        (["--path", MODEL, "--scale-to-zero", "soon"], "Invalid value for '--scale-to-zero': 'soon' is not seconds"),
        (["--path", "models/missing.gguf"], "--path: models/missing.gguf does not exist."),
        (["--path", "../escape.gguf"], "--path: Give a path relative to the workspace's directory, without '..'."),
        (["--path", MODEL, "--profile", "nope"], "--profile: No profile named nope is available to you."),
        ([], "Give the model: --path PATH, or --from-job JOB --artifact PATH."),
        (["--path", MODEL, "--from-job", "1", "--artifact", "m"],
         "Give --path, or --from-job with --artifact, not both."),
        (["--from-job", "1"], "--artifact: name the artifact of job 1 to serve"),
        (["--artifact", "model/"], "--artifact: an artifact is a job's: give --from-job too."),
        (["--from-job", "{team_job}", "--artifact", "model/"], "--from-job: No such job in this workspace."),
        (["--from-job", "{hidden_job}", "--artifact", "model/"], "--from-job: No job {hidden_job} is visible to you."),
    ],
)  # fmt: skip
def test_a_bad_endpoint_request_exits_with_a_message_naming_the_option(
    cli: Run, served: Client, live_portal: LivePortal, args: list[str], message: str
) -> None:
    jobs = {}
    if any("{team_job}" in a for a in args):  # a job of the user's other workspace
        jobs["team_job"] = served.jobs.submit(name="elsewhere", workspace="demo-team", command="true").id
    if any("{hidden_job}" in a for a in args):  # a job of a workspace the user cannot see
        with Client.login(live_portal.url, "admin", live_portal.passwords["admin"]) as admin:
            jobs["hidden_job"] = admin.jobs.submit(name="hidden", workspace="admin", command="true").id
    refused = cli("endpoints", "create", "cli-bad", "-w", "demo", *[a.format(**jobs) for a in args])
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.splitlines()[-1].startswith(f"Error: {message.format(**jobs)}"), refused.stderr
    assert "Traceback" not in refused.stderr
    assert served.endpoints.list(name="cli-bad") == []


def test_profiles_are_listed_and_the_help_says_what_the_commands_do(cli: Run, served: Client) -> None:
    listed = cli("endpoints", "profiles")
    assert re.search(rf"^{PROFILE}\s+llamacpp\s+1 CPU, 2 GB\s+llama.cpp on CPU$", listed.stdout, re.M), listed.stdout
    everything = cli("profiles")
    assert "\nInference profiles:\n" in everything.stdout and PROFILE in everything.stdout.split("Inference")[-1]
    assert [p["name"] for p in json.loads(cli("profiles", "--json").stdout)["inference"]] == [PROFILE]

    group = cli("endpoints", "--help").stdout
    for command in ("create", "ls", "show", "scale", "update", "delete", "wait", "events", "metrics", "logs",
                    "token", "profiles"):  # fmt: skip
        assert re.search(rf"^  {command}\s", group, re.M), group
    create = cli("endpoints", "create", "--help").stdout
    for option in ("--path", "--from-job", "--artifact", "--profile", "--min", "--max", "--scale-to-zero", "--wait"):
        assert option in create
    assert "gpuportal endpoints create chat --from-job 42 --artifact model/" in create
