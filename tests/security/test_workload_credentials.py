"""The reported attack, for real: alice's notebook (its server in its sandbox, behind the real
proxy) is shared with wendy, a read-write collaborator who is no member of team-a. From a kernel,
wendy takes the notebook's token from its environment, reads what she can of team-a's files (a
job's among them), and asks the portal to make her an owner of team-a.

She gets nothing: the sandbox holds the instance's directory alone (not the workspace's, where
the job's files are), the token acts as a collaborator of that one instance (none of team-a's
jobs), never administers (the membership is refused), and ends once alice changes her password.
An instance's own processes see its directory alone too."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from apps.accounts.actions import do_save_user
from apps.catalog.models import NotebookProfile
from apps.compute.collaborators import do_set_collaborator
from apps.compute.hosting import instance_dir
from apps.jobs.models import Job
from apps.workspaces.models import Membership
from tests.compute.test_local_notebooks import run_cell
from tests.personas import PASSWORD, World
from tests.proxy import Proxy, browser_session
from tests.security.test_hostile_notebooks import launch

# What a kernel or an instance's process tries: the files, then (with the token in its
# environment) the portal. It prints what it got.
PROBE = r"""
import json, os, sys, urllib.request, urllib.error
t = json.loads(sys.argv[1])
got = {}
for name, path in t["read"].items():
    try:
        with open(path) as f:
            got["read:" + name] = f.read().strip()
    except OSError as exc:
        got["read:" + name] = type(exc).__name__
try:
    with open(t["write"], "a") as f:
        f.write("wendy was here\n")
    got["write:workspace"] = "written"
except OSError as exc:
    got["write:workspace"] = type(exc).__name__

def call(method, path, body=None):
    request = urllib.request.Request(
        os.environ["GPUPORTAL_URL"] + "/api/v1/" + path, method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": "Token " + os.environ["GPUPORTAL_TOKEN"], "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, {}

if t.get("api") and "GPUPORTAL_TOKEN" in os.environ:
    got["me"] = call("GET", "me/")[0]
    status, jobs = call("GET", "jobs/")
    got["jobs"] = [job["name"] for job in jobs.get("results", [])] if status == 200 else status
    got["make-owner"] = call("POST", "memberships/", {"workspace": "team-a", "user": "wendy", "role": "owner"})[0]
RESULT = "GOT=" + json.dumps(got)
print(RESULT)
"""


def _got(output: str) -> dict[str, Any]:
    for line in output.splitlines():
        if line.startswith("GOT="):
            return dict(json.loads(line.removeprefix("GOT=")))
    raise AssertionError(f"the probe printed no result: {output!r}")


def _in_kernel(notebook: Any, targets: dict[str, Any]) -> dict[str, Any]:
    """The probe run in a new kernel of the notebook, reached through the proxy with the notebook's
    own token (as an IDE does)."""
    code = f"import sys\nsys.argv = ['probe', {json.dumps(json.dumps(targets))}]\nexec({PROBE!r})\nRESULT"
    token = {"Authorization": f"token {notebook.access_token}"}
    return _got(ast.literal_eval(run_cell(browser_session(), notebook, code, token)))


def _in_instance(instance: Any, targets: dict[str, Any]) -> dict[str, Any]:
    """The probe run inside the instance's sandbox (its namespaces, its account), as a shell on
    the instance would run it."""
    holder = _sandboxed(instance.backend_state["replicas"][0]["pid"])
    uid = Path(f"/proc/{holder}").stat().st_uid
    entered = subprocess.run(
        ["nsenter", "-t", str(holder), "-m", "-p", "-i", "-u", "-S", str(uid), "-G", str(uid), "--",
         "python3", "-c", PROBE, json.dumps(targets)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return _got(entered.stdout + entered.stderr)


def _sandboxed(wrapper_pid: int, timeout_s: float = 15.0) -> int:
    """A process the wrapper started inside the sandbox: below it, in a mount namespace other than
    this one's (not the wrapper's log writer, nor bubblewrap itself)."""
    own = os.readlink("/proc/self/ns/mnt")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in _descendants(wrapper_pid):
            try:
                if os.readlink(f"/proc/{pid}/ns/mnt") != own and not os.readlink(f"/proc/{pid}/exe").endswith("/bwrap"):
                    return pid
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError(f"no process of {wrapper_pid}'s runs in a sandbox")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _running_job(world: World) -> Job:
    """team-a's job, which keeps a secret of its own in its directory."""
    body = {"workspace": "team-a", "name": "secret-job", "command": "echo job-secret > secret.txt; exec sleep 300"}
    response = world.client(world.alice).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    deadline = time.monotonic() + 30
    while not (job.backend_state and Path(job.backend_state["job_dir"], "secret.txt").exists()):
        assert time.monotonic() < deadline, (job.state, job.failure_reason)
        time.sleep(0.1)
        job.refresh_from_db()
    return job


@pytest.mark.skipif(os.geteuid() != 0, reason="workspace accounts, and entering a sandbox, need root")
def test_a_collaborator_in_a_shared_notebook_gets_nothing_of_the_workspace(
    proxy: Proxy, tx_world: World, tmp_path: Path, settings: Any
) -> None:
    NotebookProfile.objects.get_or_create(name="kernel-only", image="quay.io/jupyter/base-notebook", published=True)
    job = _running_job(tx_world)
    notebook = launch(tx_world, tx_world.alice, "team-a")
    instance = notebook.instance
    own = Path(instance_dir(instance)) / "own.txt"
    own.write_text("the instance's own file")
    own.chmod(0o644)
    workspace_dir = Path(settings.PORTAL_WORK_DIR) / "team-a"
    targets = {
        "read": {"job-secret": str(Path(job.backend_state["job_dir"], "secret.txt")), "own": str(own)},
        "write": str(workspace_dir / "planted.txt"),
        "api": True,
    }
    wendy = get_user_model().objects.create_user("wendy", "wendy@example.org", PASSWORD)
    do_set_collaborator(instance, wendy, "write", acting_user=tx_world.alice)

    got = _in_kernel(notebook, targets)
    assert got["read:own"] == "the instance's own file", got  # the probe works where it may
    assert got["read:job-secret"] == "FileNotFoundError", got  # not even there, in its sandbox
    assert got["write:workspace"] != "written", got
    assert not (workspace_dir / "planted.txt").exists()
    assert got["me"] == 200, got  # a genuine token...
    assert got["jobs"] == [], got  # ...that acts as a collaborator of the instance: no job of team-a
    assert got["make-owner"] == 403, got  # ...and never administers
    assert not Membership.objects.filter(user=wendy).exists()

    inside = _in_instance(instance, {**targets, "api": False})
    assert (inside["read:own"], inside["read:job-secret"]) == ("the instance's own file", "FileNotFoundError")

    do_save_user(tx_world.alice, password="another-horse-battery-staple", acting_user=tx_world.alice)
    assert _in_kernel(notebook, targets)["me"] == 401  # the token ended with alice's password
