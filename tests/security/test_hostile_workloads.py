"""Workloads of one workspace attack the portal and another workspace, for real, on this machine.

Each attack is a small Python program run as a job (or from an instance's or notebook's sandbox)
of team-a: it tries to read the portal's database, secret key, logs, settings and the wrappers'
log of a team-b job; to write into team-b's directory; to read any process's environment (a
stand-in for the portal's proxy holds its admin token there, team-b's job a secret of its own);
and to signal those processes. It prints what it managed. Sandboxed, it manages nothing; the
control case runs the same program with ``PORTAL_SANDBOX=off`` and must see every leak, so the
tests fail if the sandbox stops doing its work.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.workloads import host
from apps.workspaces.unix import account_uid
from tests.converge import settle
from tests.personas import World
from workers.backends import logcap

ATTACK = r"""
import glob, json, os, sys
t = json.loads(sys.argv[1])
leaks = []
for name, path in t["read"].items():
    try:
        with open(path, "rb") as f:
            f.read(1)
        leaks.append("read:" + name)
    except OSError:
        pass
for name, path in t["write"].items():
    try:
        with open(path, "a") as f:
            f.write("owned by team-a\n")
        leaks.append("write:" + name)
    except OSError:
        pass
for environ in glob.glob("/proc/[0-9]*/environ"):
    try:
        with open(environ, "rb") as f:
            data = f.read()
    except OSError:
        continue
    for name, secret in t["secrets"].items():
        if secret.encode() in data:
            leaks.append("environ:" + name)
for name, pid in t["signal"].items():
    try:
        os.kill(pid, 0)
        leaks.append("signal:" + name)
    except OSError:
        pass
print("LEAKS=" + json.dumps(sorted(set(leaks))))
"""

EVERY_LEAK = {
    "environ:proxy-token",
    "environ:team-b-secret",
    "read:database",
    "read:logs",
    "read:secret-key",
    "read:settings",
    "read:team-b-file",
    "read:team-b-log",
    "signal:portal",
    "signal:team-b-job",
    "write:team-b-dir",
}


@dataclass
class Scene:
    world: World
    targets: dict[str, Any]
    capture: Any

    def submit(self, workspace: Any, user: Any, command: str, **kwargs: Any) -> Job:
        with self.capture(execute=True):
            job = check_submit_job(
                workspace, name="job", command=command, acting_user=user, gpu_type="h100",
                gpus_per_replica=Decimal("1"), **kwargs,
            )  # fmt: skip
        job.refresh_from_db()
        assert job.state == Job.State.RUNNING, (job.state, job.failure_reason)
        return job

    def attack_command(self) -> str:
        return f"python3 -c {shlex.quote(ATTACK)} {shlex.quote(json.dumps(self.targets))}"


def leaks_in(text: str) -> set[str]:
    for line in text.splitlines():
        if line.startswith("LEAKS="):
            return set(json.loads(line.removeprefix("LEAKS=")))
    raise AssertionError(f"the attack printed no result: {text!r}")


def wait_for_file(path: Path, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.fixture
def scene(world: World, settings: Any, tmp_path: Path, django_capture_on_commit_callbacks: Any) -> Iterator[Scene]:
    """The embedded layout (database, secret key, logs, run and work directories in one data
    directory), a portal process holding the proxy's token, and a running team-b job."""
    data = tmp_path / "data"
    (data / "logs").mkdir(parents=True)
    (data / "portal.sqlite3").write_text("every API token of the portal")
    (data / "secret_key").write_text("the portal's SECRET_KEY")
    (data / "logs" / "worker.log").write_text("the worker's log")
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"
    settings.PORTAL_WORK_DIR = data / "work"
    settings.PORTAL_RUN_DIR = data / "run"
    proxy_token = "proxy-token-" + os.urandom(8).hex()
    team_b_secret = "team-b-secret-" + os.urandom(8).hex()
    portal = subprocess.Popen(["sleep", "300"], env={"PATH": "/usr/bin:/bin", "CONFIGPROXY_AUTH_TOKEN": proxy_token})
    scene = Scene(world, {}, django_capture_on_commit_callbacks)
    victim = scene.submit(
        world.team_b, world.charlie, "echo team-b data > data.txt; exec sleep 300", env={"TEAM_B_SECRET": team_b_secret}
    )
    run = victim.backend_state
    wait_for_file(Path(run["job_dir"], "data.txt"))
    scene.targets = {
        "read": {
            "database": str(data / "portal.sqlite3"),
            "secret-key": str(data / "secret_key"),
            "logs": str(data / "logs" / "worker.log"),
            "settings": str(Path(django_settings.BASE_DIR, "portal", "settings.py")),
            "team-b-file": str(Path(run["job_dir"], "data.txt")),
            "team-b-log": run["replicas"][0]["log"],
        },
        "write": {"team-b-dir": str(Path(run["workspace_dir"], "owned.txt"))},
        "secrets": {"proxy-token": proxy_token, "team-b-secret": team_b_secret},
        "signal": {"portal": portal.pid, "team-b-job": run["replicas"][0]["pid"]},
    }
    try:
        yield scene
    finally:
        portal.kill()
        portal.wait()
        from workers.backends.registry import backend_for

        backend = backend_for(victim.cluster)
        backend.load_state(run)
        backend.stop(grace_s=0)


@pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux's")
def test_a_sandboxed_job_reaches_nothing_of_the_portal_or_another_workspace(scene: Scene) -> None:
    attacker = scene.submit(scene.world.team_a, scene.world.alice, scene.attack_command())

    job = settle(attacker)

    log = host.logs("job", job)[0].decode()
    assert job.state == Job.State.SUCCEEDED, log
    assert leaks_in(log) == set()
    assert not Path(scene.targets["write"]["team-b-dir"]).exists()


def test_without_the_sandbox_the_same_job_reaches_all_of_it(scene: Scene, settings: Any) -> None:
    """The control: proves the attack finds what a sandbox must hide."""
    settings.PORTAL_SANDBOX = "off"
    attacker = scene.submit(scene.world.team_a, scene.world.alice, scene.attack_command())

    job = settle(attacker)

    assert leaks_in(host.logs("job", job)[0].decode()) >= EVERY_LEAK


@pytest.mark.skipif(os.geteuid() != 0, reason="workspace accounts are made only when the portal runs as root")
def test_each_workspace_runs_as_its_own_account_in_a_directory_only_it_can_open(scene: Scene) -> None:
    job = settle(scene.submit(scene.world.team_a, scene.world.alice, 'id -u; id -G; stat -c "%a %u" ..'))

    uid, groups, workspace_dir = host.logs("job", job)[0].decode().split("\n")[:3]
    team_a = scene.world.team_a
    team_a.refresh_from_db()
    assert int(uid) == team_a.unix_uid == account_uid(team_a)
    assert groups.split() == [uid]  # no supplementary group of the portal's
    assert workspace_dir == f"700 {uid}"
    victim_uids = {Path(f"/proc/{pid}").stat().st_uid for pid in sandboxed(scene.targets["signal"]["team-b-job"])}
    assert victim_uids == {account_uid(scene.world.team_b)} != {int(uid)}


def sandboxed(wrapper_pid: int, timeout_s: float = 15.0) -> list[int]:
    """The processes of a workload's group that run its command: not the wrapper, not bubblewrap,
    not the log's writer, which runs outside the sandbox (waiting for them: a start returns once
    the wrapper runs, maybe before bubblewrap's child)."""
    deadline = time.monotonic() + timeout_s
    while not (found := _sandboxed_now(wrapper_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert found, f"no sandboxed process in the group of {wrapper_pid}"
    return found


def _sandboxed_now(wrapper_pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == wrapper_pid:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            exe = os.readlink(f"/proc/{entry}/exe")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        in_group = int(stat[stat.rindex(")") + 2 :].split()[2]) == wrapper_pid
        log_writer = str(Path(logcap.__file__).resolve()).encode() in cmdline
        if in_group and not log_writer and not exe.endswith(("/bwrap", "/setpriv")):
            found.append(int(entry))
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="entering another sandbox's namespaces needs root")
def test_a_process_on_a_sandboxed_instance_reaches_nothing_either(scene: Scene) -> None:
    """A process started inside a team-a instance's sandbox (its namespaces, its account), as a
    shell on the instance would be, runs the same attack."""
    client = scene.world.client(scene.world.alice)
    with scene.capture(execute=True):
        body = {"workspace": "team-a", "name": "box", "profile": "gpu-1"}
        response = client.post("/api/v1/instances/", body, format="json")
    assert response.status_code == 201, response.content
    from apps.compute.models import Instance

    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == Instance.State.RUNNING, instance.failure_reason
    holder = sandboxed(instance.backend_state["replicas"][0]["pid"])[0]
    uid = Path(f"/proc/{holder}").stat().st_uid
    try:
        entered = subprocess.run(
            ["nsenter", "-t", str(holder), "-m", "-p", "-i", "-u", "-S", str(uid), "-G", str(uid), "--",
             "python3", "-c", ATTACK, json.dumps(scene.targets)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        host.stop_on_this_machine()
    assert uid == account_uid(scene.world.team_a)
    assert leaks_in(entered.stdout) == set(), entered.stderr
