"""The `gpuportal` command line against a live embedded portal, over real HTTP, as a user runs it."""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import requests
from gpuportal import Client
from gpuportal.errors import AuthenticationError

from tests.sdk.conftest import GPUPORTAL, LivePortal, Run, submitted_id, wait_for

pytestmark = pytest.mark.slow


def test_it_logs_in_with_a_password_and_then_works_from_the_saved_token(
    live_portal: LivePortal, cli_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in cli_env.items() if k not in ("GPUPORTAL_URL", "GPUPORTAL_TOKEN")}

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([GPUPORTAL, *args], env=env, input=input, capture_output=True, text=True, timeout=60)

    refused = run("login", "--url", live_portal.url, "--username", "demo", "--password-stdin", input="wrong\n")
    assert refused.returncode == 1
    assert "Wrong username or password." in refused.stderr
    assert "Traceback" not in refused.stderr

    done = run("login", "--url", live_portal.url, "--username", "demo", "--password-stdin",
               input=live_portal.passwords["demo"] + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"Logged in to {live_portal.url} as demo" in done.stdout
    config = Path(env["GPUPORTAL_CONFIG"])
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert "token:" in config.read_text()

    whoami = run("whoami")
    assert whoami.returncode == 0, whoami.stderr
    assert whoami.stdout.startswith(f"demo on {live_portal.url}")
    assert "(default: demo)" in whoami.stdout

    assert run("login", "--workspace", "demo-team").returncode == 0
    assert "(default: demo-team)" in run("whoami").stdout
    workspaces = run("workspaces")
    assert re.search(r"demo-team\s+shared\s+owner\s+\S+/4 h100", workspaces.stdout), workspaces.stdout

    token = re.search(r"token: (\S+)", config.read_text())
    assert token is not None
    logged_out = run("logout")
    assert logged_out.returncode == 0 and "revoked it on the portal" in logged_out.stdout, logged_out
    with pytest.raises(AuthenticationError, match="revoked"):
        Client(live_portal.url, token.group(1)).me()  # the token is of no use to anyone any more
    signed_out = run("whoami")
    assert signed_out.returncode == 1
    assert "No portal token configured" in signed_out.stderr


def test_a_script_job_runs_to_success_with_its_logs_and_artifact_bytes(cli: Run, tmp_path: Path) -> None:
    payload = bytes(range(256)) * 40 + os.urandom(3000)
    (tmp_path / "train.sh").write_text(
        'echo "rank $RANK of $WORLD_SIZE, epochs $EPOCHS"\n'
        "mkdir -p out\n"
        "base64 -d > out/weights.bin <<'DATA'\n"
        f"{base64.b64encode(payload).decode()}\n"
        "DATA\n"
        'echo "wrote $(wc -c < out/weights.bin) bytes"\n'
    )
    (tmp_path / "job.yaml").write_text(
        "name: train\nworkspace: demo-team\nscript: train.sh\nenv: {EPOCHS: 3}\ngpus: 1\n"
        "max_runtime: 5m\npriority: 5\nartifacts: [out]\n"
    )

    submit = cli("submit", "job.yaml", "--wait")
    assert submit.returncode == 0, submit.stderr
    job_id = submitted_id(submit.stderr)
    assert f"Job {job_id} train: SUCCEEDED" in submit.stderr  # the progress display's last line

    logs = cli("logs", str(job_id))
    assert logs.returncode == 0
    assert logs.stdout == f"rank 0 of 1, epochs 3\nwrote {len(payload)} bytes\n"

    status = json.loads(cli("status", str(job_id), "--json").stdout)
    assert (status["state"], status["exit_code"], status["gpu_type"], status["priority"]) == ("SUCCEEDED", 0, "h100", 5)
    assert status["max_runtime_s"] == 300
    assert [a["path"] for a in status["artifacts"]] == ["out/weights.bin"]

    get = cli("artifacts", "get", str(job_id), "-o", "downloaded")
    assert get.returncode == 0, get.stderr
    assert get.stdout.split() == ["downloaded/out/weights.bin"]
    assert (tmp_path / "downloaded" / "out" / "weights.bin").read_bytes() == payload

    listing = cli("ls", "-w", "demo-team")
    assert re.search(rf"^{job_id}\s+train\s+demo-team\s+1 × H100\s+SUCCEEDED\s+exit code 0$", listing.stdout, re.M)


def test_a_failing_job_gives_its_exit_code_to_the_shell(cli: Run, tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "job.yaml").write_text("name: fails\ncommand: exit 0\n")
    (tmp_path / "fail.sh").write_text("echo going down >&2\nexit 7\n")
    overtime = cli("submit", "-q", "--name", "overtime", "--command", "sleep 60", "--max-runtime", "1s").stdout
    # --script replaces the spec's command, and is found from the current folder.
    submit = cli("submit", "specs/job.yaml", "--script", "fail.sh", "--wait", "--logs")
    assert submit.returncode == 7
    job_id = submitted_id(submit.stderr)
    assert submit.stdout == "going down\n"  # --logs prints the log as it runs
    assert f"Job {job_id} fails: FAILED with exit code 7" in submit.stderr
    assert cli("wait", str(job_id)).returncode == 7  # waiting again on an ended job answers at once

    timed_out = cli("wait", overtime.strip())
    assert timed_out.returncode == 124  # killed after its max runtime
    assert "FAILED with exit code 124" in timed_out.stderr
    assert "killed after exceeding max runtime of 1s" in timed_out.stderr


def test_a_running_job_is_cancelled_and_whoever_follows_it_stops(cli: Run, cli_env: dict[str, str]) -> None:
    follower = subprocess.Popen(
        [GPUPORTAL, "submit", "-q", "--name", "sleeper", "--command", "echo started; sleep 300", "--wait"],
        env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert follower.stdout is not None
        job_id = int(follower.stdout.readline())
        with Client(cli_env["GPUPORTAL_URL"], cli_env["GPUPORTAL_TOKEN"]) as client:
            wait_for(client, job_id, lambda job: job.state == "RUNNING" and "started" in job.logs())
        log_follower = subprocess.Popen(
            [GPUPORTAL, "logs", "-f", str(job_id)], env=cli_env, stdout=subprocess.PIPE, text=True
        )
        cancel = cli("cancel", str(job_id))
        assert cancel.returncode == 0, cancel.stderr
        assert cancel.stdout.startswith(f"Job {job_id} sleeper: CANCELLED")
        assert follower.wait(timeout=30) == 130
        assert log_follower.communicate(timeout=30)[0].startswith("started\n")  # then bash's "Terminated"
        assert log_follower.returncode == 0
    finally:
        follower.kill()
    again = cli("cancel", str(job_id))
    assert again.returncode == 1
    assert "Job sleeper has already finished (cancelled)." in again.stderr


def test_a_queued_job_shows_its_position_and_reason_while_the_quota_is_full(cli: Run, cli_env: dict[str, str]) -> None:
    hog = int(cli("submit", "-q", "--name", "hog", "--command", "sleep 300", "--gpus", "1", "-w", "demo").stdout)
    client = Client(cli_env["GPUPORTAL_URL"], cli_env["GPUPORTAL_TOKEN"])
    try:
        wait_for(client, hog, lambda job: job.state == "RUNNING")
        waiter = int(cli("submit", "-q", "--name", "waiter", "--command", "true", "--gpus", "1", "-w", "demo").stdout)
        job = wait_for(client, waiter, lambda job: job.queue_info.position is not None)
        reason = "waiting for quota: 1 of 1 h100 in use in workspace demo, this needs 1"
        assert job.state == "QUEUED"
        assert (job.queue_info.position, job.queue_info.reason) == (1, reason)

        queue = cli("queue", "-w", "demo", "--json")
        assert [(j["id"], j["workspace_queue_position"], j["wait_reason"]) for j in json.loads(queue.stdout)] == [
            (waiter, 1, reason)
        ]
        table = cli("queue", "-w", "demo").stdout
        assert re.search(rf"^\d+\s+1\s+{waiter}\s+waiter\s+demo\s+1 × H100\s+.*{reason}$", table, re.M), table

        waited = cli("wait", str(waiter), "--timeout", "1")
        assert waited.returncode == 124
        assert f"Job {waiter} waiter: QUEUED, #1 in demo" in waited.stderr
        assert reason in waited.stderr
        assert f"Job {waiter} is still QUEUED after waiting 1 s." in waited.stderr
    finally:
        for job in client.jobs.list("demo", state=["QUEUED", "RUNNING", "ADMITTED"]):
            client.jobs.cancel(job.id)
        client.close()


@pytest.mark.parametrize(
    ("spec", "code", "message"),
    [
        ("name: ok\ncommand: x\nreplicas: two\n", 2, "job.yaml: replicas: should be a whole number, not text ('two')"),
        ("name: ok\ncommand: x\ngpu: 1\n", 2, "job.yaml: gpu: not a job spec field (did you mean 'gpus'?)"),
        ("name: ok\nscript: missing.sh\n", 2, "job.yaml: script: no such file: "),
        ("name: Big_Model\ncommand: x\n", 2, "job.yaml: name: 'Big_Model' is not a name: use 1 to 63 lowercase"),
        ("name: ok\n  command: x: y\n", 2, "job.yaml: not valid YAML: mapping values are not allowed here (line 2,"),
        ("- name: ok\n", 2, "job.yaml: a job spec is a mapping of fields"),
        ("name: ok\ncommand: x\npriority: 5000\n", 2, "priority: Ensure this value is less than or equal to 1000."),
        ("name: ok\ncommand: x\nworkspace: nowhere\n", 2, "workspace: Object with name=nowhere does not exist."),
        (  # the API's words, and the pages' (tests/web/test_form_refusals.py)
            "name: ok\ncommand: x\ngpus: 0.3\nworkspace: demo\n",
            2,
            "gpus: 0.3 GPUs: a share of one device is 0.25, 0.333, 0.5, 0.667 or 0.75 (or 0 for no GPU, or a whole "
            "number of devices).",
        ),
        (
            "name: ok\ncommand: x\ngpus: 16\nworkspace: demo\n",
            1,
            "This asks for 16 h100 GPUs; workspace demo can never",
        ),
    ],
)
def test_a_bad_spec_is_refused_with_a_message_naming_the_field(
    cli: Run, tmp_path: Path, spec: str, code: int, message: str
) -> None:
    (tmp_path / "job.yaml").write_text(spec)
    refused = cli("submit", "job.yaml")
    assert (refused.returncode, refused.stdout) == (code, "")
    assert refused.stderr.startswith(f"Error: {message}"), refused.stderr
    assert "Traceback" not in refused.stderr


def test_it_lists_profiles_and_jobs_as_tables_and_json(cli: Run) -> None:
    profiles = cli("profiles")
    assert profiles.returncode == 0
    assert re.search(r"^gpu-1\s+1 × H100, 8 CPU, 64 GB\s+One H100$", profiles.stdout, re.M)
    assert re.search(r"^minimal\s+quay.io/jupyter/minimal-notebook", profiles.stdout, re.M)
    data = json.loads(cli("profiles", "--json").stdout)
    assert {p["name"] for p in data["notebook"]} == {"minimal", "data-science", "spark", "tensorflow"}
    assert isinstance(json.loads(cli("ls", "--json").stdout), list)
    listing = cli("ls").stdout
    assert re.match(r"ID\s+Name\s+Workspace\s+GPUs\s+State\s+Queue / running for\n", listing) or listing == "(none)\n"
    missing = cli("status", "999999")
    assert (missing.returncode, missing.stderr) == (1, "Error: Job 999999 was not found (or you cannot see it).\n")


def _web_session(url: str, username: str, password: str) -> requests.Session:
    """A browser's session on the portal's pages, signed in with a password."""
    browser = requests.Session()
    browser.get(f"{url}/login/", timeout=30)
    signed_in = browser.post(
        f"{url}/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": browser.cookies["csrftoken"]},
        allow_redirects=False,
        timeout=30,
    )
    assert signed_in.status_code == 302, signed_in.text[:500]
    return browser


def _decide(browser: requests.Session, link: str, decision: str) -> str:
    page = browser.get(link, timeout=30)
    assert page.status_code == 200 and "Is this the code your terminal shows?" in page.text, page.text[:500]
    code = link.rsplit("=", 1)[1]
    answer = browser.post(
        link,
        data={"code": code, "decision": decision, "csrfmiddlewaretoken": browser.cookies["csrftoken"]},
        timeout=30,
    )
    return answer.text


def test_it_logs_in_through_the_browser_with_the_code_the_terminal_shows(
    live_portal: LivePortal, cli_env: dict[str, str]
) -> None:
    """`gpuportal login --browser` (what a portal with single sign-on needs): the terminal prints a
    link and a code; signed in on the web page, the person allows it; the token comes back."""
    env = {k: v for k, v in cli_env.items() if k not in ("GPUPORTAL_URL", "GPUPORTAL_TOKEN")}
    browser = _web_session(live_portal.url, "demo", live_portal.passwords["demo"])

    def login() -> tuple[subprocess.Popen[str], str]:
        cli = subprocess.Popen(
            [GPUPORTAL, "login", "--url", live_portal.url, "--browser", "--no-open"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert cli.stdout is not None
        shown = cli.stdout.readline() + cli.stdout.readline()
        link = re.search(r"go straight to (\S+)\)", shown)
        assert link and re.search(r"allow the code [A-Z]{4}-[A-Z]{4}", shown), shown
        return cli, link.group(1)

    refused, link = login()
    assert "Refused" in _decide(browser, link, "refuse")
    _, err = refused.communicate(timeout=60)
    assert refused.returncode == 1 and "refused in the browser" in err and "Traceback" not in err
    assert "No sign-in waits for the code" in browser.get(link, timeout=30).text  # decided once only

    allowed, link = login()
    assert "Allowed" in _decide(browser, link, "allow")
    out, err = allowed.communicate(timeout=60)
    assert allowed.returncode == 0, err
    assert f"Logged in to {live_portal.url} as demo" in out
    whoami = subprocess.run([GPUPORTAL, "whoami"], env=env, capture_output=True, text=True, timeout=60)
    assert whoami.stdout.startswith(f"demo on {live_portal.url}"), whoami


def test_a_browser_login_code_gives_its_token_once_and_only_to_its_device_code(live_portal: LivePortal) -> None:
    api = requests.Session()
    started = api.post(f"{live_portal.url}/api/v1/auth/device/", json={"name": "laptop"}, timeout=30).json()
    collect = f"{live_portal.url}/api/v1/auth/device/token/"
    pending = api.post(collect, json={"device_code": started["device_code"]}, timeout=30)
    assert pending.status_code == 400 and pending.json()["error"]["code"] == "authorization_pending"
    guessed = api.post(collect, json={"device_code": started["device_code"][:-2] + "xx"}, timeout=30)
    assert guessed.status_code == 400 and guessed.json()["error"]["code"] == "invalid_grant"

    browser = _web_session(live_portal.url, "demo", live_portal.passwords["demo"])
    _decide(browser, started["verification_uri_complete"], "allow")
    token = api.post(collect, json={"device_code": started["device_code"]}, timeout=30)
    assert token.status_code == 200
    assert Client(live_portal.url, token.json()["token"]).me().username == "demo"
    again = api.post(collect, json={"device_code": started["device_code"]}, timeout=30)
    assert again.status_code == 400 and again.json()["error"]["code"] == "invalid_grant"
