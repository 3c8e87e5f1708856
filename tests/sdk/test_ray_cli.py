"""`gpuportal clusters ...` and Ray jobs (`gpuportal submit` of a `kind: ray` spec, then `wait`,
`status`, `logs`, `artifacts`, `cancel`) against a live embedded portal, as a user's shell runs them.

As in test_ray_sdk.py, no Ray cluster starts: workspace demo's GPU is held, so its clusters
queue, and the workload host's state changes are made where a test needs a cluster that ran.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuportal import Client

from tests.sdk.conftest import GPUPORTAL, LivePortal, Run, until
from tests.sdk.test_ray_sdk import NODES, WAITING, as_the_host, demo_gpu_held, host_ends

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def held(live_portal: LivePortal) -> Iterator[Client]:
    with live_portal.client() as client, demo_gpu_held(client):
        yield client


def _queued(client: Client, cluster_id: int) -> None:
    until(lambda: client.ray_clusters.get(cluster_id), lambda c: c.queue_info.position is not None)


def test_clusters_are_created_listed_shown_waited_for_and_deleted(
    cli: Run, held: Client, live_portal: LivePortal
) -> None:
    made = cli("clusters", "create", "cli-ray", "-w", "demo", "--workers", "2", "--worker-gpus", "0.5",
               "--worker-cpus", "2", "--worker-memory", "3", "--head-cpus", "1", "--head-memory", "2G",
               "-e", "A=1", "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    cluster_id = int(made.stdout)
    _queued(held, cluster_id)

    listing = cli("clusters", "ls", "-w", "demo")
    workers = r"2 × \(0.5 × H100, 2 CPU, 3 GB\)"
    row = rf"^{cluster_id}\s+cli-ray\s+demo\s+no GPU, 1 CPU, 2 GB\s+{workers}\s+QUEUED\s+#1 {WAITING}$"
    assert re.search(row, listing.stdout, re.M), listing.stdout
    shown = cli("clusters", "show", str(cluster_id))
    assert f"Waiting because:  {WAITING}" in shown.stdout and "Queue position:   1 in its workspace" in shown.stdout
    data = json.loads(cli("clusters", "show", str(cluster_id), "--json").stdout)
    sizes = (data["state"], data["env"], data["worker_cpu_cores"], data["head_memory_gb"])
    assert sizes == ("QUEUED", {"A": "1"}, 2, 2)
    live = json.loads(cli("clusters", "ls", "--json", "-w", "demo", "--state", "QUEUED", "--state", "RUNNING").stdout)
    assert [c["id"] for c in live] == [cluster_id]

    waited = cli("clusters", "wait", str(cluster_id), "--timeout", "1")
    assert waited.returncode == 124
    assert f"Ray cluster {cluster_id} cli-ray: QUEUED, #1 in demo, #1 in the cluster, {WAITING}" in waited.stderr

    assert as_the_host(live_portal, cluster_id, "ready", nodes=NODES) == "RUNNING"
    ready = cli("clusters", "wait", str(cluster_id))
    assert ready.returncode == 0
    assert re.fullmatch(rf"http://ray-cli-ray-{cluster_id}\.localhost:\d+/\n", ready.stdout)  # its dashboard
    assert "Nodes:       head, worker-0, worker-1" in cli("clusters", "show", str(cluster_id)).stdout

    asked = cli("clusters", "delete", str(cluster_id), input="n\n")
    assert (asked.returncode, asked.stderr.splitlines()[-1]) == (1, "Error: Not stopped.")
    stopped = cli("clusters", "delete", str(cluster_id), "--yes")
    assert stopped.returncode == 0 and stopped.stdout.startswith(f"Ray cluster {cluster_id} cli-ray: STOPPED after ")
    again = cli("clusters", "delete", str(cluster_id), "--yes")
    assert (again.returncode, again.stderr) == (1, "Error: Cluster cli-ray has already ended (stopped).\n")
    missing = cli("clusters", "show", "999999")
    assert (missing.returncode, missing.stderr) == (
        1, "Error: Ray cluster 999999 was not found (or you cannot see it).\n"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--head-cpus", "0"], 2, "head_cpus: Ensure this value is greater than or equal to 1."),
        (["--workers", "4"], 1, "This asks for 4 h100 GPUs; workspace demo can never hold more than 1"),
        (["--profile", "gpu-1"], 2, "worker_gpus: Give the worker's size or its profile, not both."),
        (["--worker-memory", "lots"], 2, "worker_memory: should be GB (8) or a size such as 8G or 512Mi, not 'lots'"),
        (["--workers", "many"], 2, "Invalid value for '--workers': 'many' is not a valid integer."),
        (["--max-runtime", "soon"], 2, "max_runtime: should be seconds or a duration such as 90s, 30m, 2h"),
        (["-e", "NOVALUE"], 2, "env: 'NOVALUE': write NAME=VALUE"),
        (["--gpu-type", "a100"], 1, "workspace demo"),
    ],
)  # fmt: skip
def test_a_bad_cluster_request_exits_with_a_message(
    cli: Run, held: Client, args: list[str], code: int, message: str
) -> None:
    # Each would otherwise wait behind demo's held GPU (it asks for one per worker): nothing would start.
    refused = cli("clusters", "create", "cli-bad", "-w", "demo", "--worker-gpus", "1", *args)
    assert (refused.returncode, refused.stdout) == (code, "")
    assert message in refused.stderr.splitlines()[-1], refused.stderr
    assert "Traceback" not in refused.stderr
    assert held.ray_clusters.list("demo", name="cli-bad") == []


RAY_SPEC = """\
kind: ray
name: cli-rayjob
workspace: demo
script: tune.sh
workers: 1
worker_gpus: 1
worker_memory: 2Gi
head_memory: 2
env: {EPOCHS: 3}
max_runtime: 10m
preemptible: false
artifacts: [out]
"""


def test_a_ray_spec_is_submitted_followed_and_its_log_and_artifacts_collected(
    cli: Run, cli_env: dict[str, str], held: Client, live_portal: LivePortal, tmp_path: Path
) -> None:
    (tmp_path / "tune.sh").write_text("python tune.py --epochs $EPOCHS\n")
    (tmp_path / "ray.yaml").write_text(RAY_SPEC)
    submitted = cli("submit", "-q", "ray.yaml", "-e", "EXTRA=1")
    assert submitted.returncode == 0, submitted.stderr
    ray_id = int(submitted.stdout)
    status = json.loads(cli("status", str(ray_id), "--json").stdout)  # a Ray job's id works as a job's
    assert status["entrypoint"].strip() == "python tune.py --epochs $EPOCHS"  # the script, as the entrypoint
    assert status["env"] == {"EPOCHS": "3", "EXTRA": "1"}
    assert (status["max_runtime_s"], status["artifact_paths"], status["preemptible"]) == (600, ["out"], False)
    assert (status["workers"], status["worker_memory_gb"], status["gpu_type"]) == (1, 2, "h100")
    _queued(held, ray_id)

    waited = cli("wait", str(ray_id), "--timeout", "1")
    assert waited.returncode == 124
    assert f"Ray cluster {ray_id} cli-rayjob: QUEUED, #1 in demo" in waited.stderr

    follower = subprocess.Popen(
        [GPUPORTAL, "wait", str(ray_id), "--logs"], env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    log = "[head] started\nraypod: every node joined\nepoch 1 of 3\n"
    host_ends(live_portal, ray_id, "FAILED", exit_code=7, reason="its entrypoint exited with 7", log=log,
              files={"out/model.txt": "weights\n"})  # fmt: skip
    out, err = follower.communicate(timeout=90)
    assert follower.returncode == 7  # the entrypoint's exit code, as for a job
    assert out == log
    assert f"Ray cluster {ray_id} cli-rayjob: FAILED with exit code 7" in err.splitlines()[-1]

    assert "Exit code:   7" in cli("status", str(ray_id)).stdout
    assert cli("logs", str(ray_id)).stdout == log
    assert cli("artifacts", "ls", str(ray_id)).stdout.splitlines()[1].startswith("out/model.txt  8  ")
    fetched = cli("artifacts", "get", str(ray_id), "-o", "results")
    assert (fetched.returncode, fetched.stdout) == (0, "results/out/model.txt\n")
    assert (tmp_path / "results" / "out" / "model.txt").read_text() == "weights\n"
    ended = cli("cancel", str(ray_id))
    assert (ended.returncode, ended.stderr) == (1, "Error: Cluster cli-rayjob has already ended (failed).\n")
    one_log = cli("logs", str(ray_id), "--replica", "1")
    assert (one_log.returncode, one_log.stderr) == (
        2, f"Error: Ray cluster {ray_id} has one log: leave out --replica.\n"
    )  # fmt: skip

    # Cancelled while it waits: `--wait` exits 130, as for a job.
    follower = subprocess.Popen(
        [GPUPORTAL, "submit", "-q", "ray.yaml", "--wait"], env=cli_env, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert follower.stdout is not None
    second = int(follower.stdout.readline())
    cancelled = cli("cancel", str(second))
    assert (cancelled.returncode, cancelled.stdout) == (0, f"Ray cluster {second} cli-rayjob: STOPPED\n")
    assert follower.wait(timeout=60) == 130

    third = int(cli("submit", "-q", "ray.yaml").stdout)
    host_ends(live_portal, third, "SUCCEEDED", exit_code=0, log="done\n")
    succeeded = cli("wait", str(third))
    assert succeeded.returncode == 0
    assert f"Ray cluster {third} cli-rayjob: SUCCEEDED after " in succeeded.stderr


@pytest.mark.parametrize(
    ("spec", "args", "code", "message"),
    [
        ("kind: spark\nname: x\ncommand: x\n", [], 2, "ray.yaml: kind: should be one of job, ray, not text ('spark')"),
        ("kind: ray\nname: x\nentrypoint: x\nworkers: two\n", [], 2,
         "ray.yaml: workers: should be a whole number, not text ('two')"),
        ("kind: ray\nname: x\nentrypoint: x\nreplicas: 2\n", [], 2, "ray.yaml: replicas: not a Ray spec field"),
        ("kind: ray\nname: x\n", [], 2, "ray.yaml: entrypoint: a Ray job needs an entrypoint (or a script)"),
        ("kind: ray\nname: x\nscript: missing.sh\n", [], 2, "ray.yaml: script: no such file: "),
        ("kind: ray\nname: x\nentrypoint: x\n", ["--gpus", "1"], 2, "gpus: --gpus is a job's; a Ray spec sets"),
        ("kind: ray\nname: x\nentrypoint: x\nworkspace: demo\nworker_gpus: 1\nhead_cpus: 0\n", [], 2,
         "head_cpus: Ensure this value is greater than or equal to 1."),
        ("kind: ray\nname: x\nentrypoint: x\nworkspace: demo\nworker_gpus: 1\nworkers: 4\n", [], 1,
         "This asks for 4 h100 GPUs; workspace demo can never hold more than 1"),
    ],
)  # fmt: skip
def test_a_bad_ray_spec_is_refused_with_a_message_naming_the_field(
    cli: Run, held: Client, tmp_path: Path, spec: str, args: list[str], code: int, message: str
) -> None:
    (tmp_path / "ray.yaml").write_text(spec)
    refused = cli("submit", "ray.yaml", *args)
    assert (refused.returncode, refused.stdout) == (code, "")
    assert refused.stderr.startswith(f"Error: {message}"), refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_help_says_what_the_commands_do_with_ray_jobs(cli: Run) -> None:
    assert "Ray job" in cli("wait", "--help").stdout
    assert "kind: ray" in cli("submit", "--help").stdout
    create = cli("clusters", "create", "--help").stdout
    options = [
        "--workers", "--worker-gpus", "--worker-cpus", "--worker-memory", "--head-cpus", "--head-memory",
        "--head-gpus", "--profile, --worker-profile", "--gpu-type", "--entrypoint", "--env", "--wait",
    ]  # fmt: skip
    for option in options:
        assert option in create
