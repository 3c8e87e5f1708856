"""Ray clusters and Ray jobs through the SDK's CodeFlare-style classes (gpuportal.ray), against a
live embedded portal over real HTTP.

No Ray cluster starts here (tests/backends/test_ray_local.py and the end-to-end test start real
ones). Every cluster asks for GPUs of workspace `demo`, whose one GPU a running job holds, so it
stays QUEUED; where a test needs a cluster that runs or ended, it makes the state changes the
workload host makes (the portal's own `record_*` actions, run in the portal's settings), as
apps/rayclusters/hosting.py does when a backend reports the cluster's nodes and its end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from gpuportal import (
    Client,
    Cluster,
    ClusterConfiguration,
    ClusterStatus,
    Conflict,
    GPUPortalError,
    LimitExceeded,
    RayJob,
    RayNode,
    SpecError,
    ValidationError,
    WaitTimeout,
)
from gpuportal.ray import get_cluster, job_submission_client, list_all_clusters

from tests.sdk.conftest import LivePortal, until, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WAITING = "waiting for quota: 1 of 1 h100 in use in workspace demo, this needs 1"
NODES = [
    {"name": "head", "role": "head", "alive": True},
    {"name": "worker-0", "role": "worker", "alive": True},
    {"name": "worker-1", "role": "worker", "alive": True},
]

# Run in the portal's own settings (its data directory, its SQLite database): the changes the
# workload host makes, through the same actions. argv[1] is the JSON of the arguments.
_HOST_CODE = r"""
import json, sys
import django
django.setup()
from pathlib import Path
from django.conf import settings
from django.db import transaction
from apps.inventory.models import Cluster
from apps.rayclusters import actions
from apps.rayclusters.models import RayCluster
from workers.backends.base import STATE_VERSION

args = json.loads(sys.argv[1])
with transaction.atomic():
    row = RayCluster.objects.select_for_update().select_related("workspace").get(pk=args["id"])
    if args["step"] == "ready":  # every node joined: what record_start does
        actions.record_cluster_ready(row, target=args.get("target", "http://127.0.0.1:9/"), nodes=args["nodes"])
    elif args["step"] == "nodes":  # what the watch records of the nodes while it runs
        actions.record_cluster_nodes(row, args["nodes"])
    elif args["step"] == "end":  # the backend ended: its state kept (its log and files stay readable)
        job_dir = Path(settings.PORTAL_WORK_DIR) / row.workspace.name / f"raycluster-{row.pk}"
        run_dir = Path(settings.PORTAL_RUN_DIR) / f"raycluster-{row.pk}-ended"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "replica-0.log").write_text(args["log"])
        for path, text in args["files"].items():
            (job_dir / path).parent.mkdir(parents=True, exist_ok=True)
            (job_dir / path).write_text(text)
        row.cluster = Cluster.objects.get(kind="local")
        row.backend_state = {
            "version": STATE_VERSION, "kind": "ray", "key": f"raycluster-{row.pk}", "job_dir": str(job_dir),
            "workspace_dir": str(job_dir.parent), "run_dir": str(run_dir), "sandbox": "bwrap",
            "artifact_paths": row.artifact_paths or ["artifacts"],
            "replicas": [{"rank": 0, "pid": 0, "pgid": 0, "start_ticks": 0, "devices": [],
                          "log": str(run_dir / "replica-0.log"), "exit_file": str(run_dir / "replica-0.exit")}],
        }
        row.backend_stopped = True
        actions.record_cluster_end(row, args["state"], exit_code=args["exit_code"], reason=args["reason"])
if args["step"] == "end":  # what the host does once a workload ended, outside any transaction
    from apps.workloads import host
    host.KINDS["raycluster"].ended(row)
print(RayCluster.objects.get(pk=args["id"]).state)
"""


def as_the_host(live: LivePortal, cluster_id: int, step: str, **args: Any) -> str:
    """Make, in the live portal, the state change the workload host makes at `step` ("ready",
    "nodes" or "end"); returns the cluster's state after it."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env.update(PORTAL_DATA_DIR=str(live.data_dir), DJANGO_SETTINGS_MODULE="portal.settings")
    payload = json.dumps({"id": cluster_id, "step": step, **args})
    done = subprocess.run(
        [sys.executable, "-c", _HOST_CODE, payload], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def host_ends(
    live: LivePortal,
    cluster_id: int,
    state: str,
    *,
    exit_code: int | None = None,
    reason: str = "",
    log: str = "",
    files: dict[str, str] | None = None,
) -> str:
    """The cluster's nodes joined, and then it ended as `state`, leaving `log` and `files` behind."""
    assert as_the_host(live, cluster_id, "ready", nodes=NODES[:2]) == "RUNNING"
    return as_the_host(
        live, cluster_id, "end", state=state, exit_code=exit_code, reason=reason, log=log, files=files or {}
    )


@contextlib.contextmanager
def demo_gpu_held(client: Client) -> Iterator[int]:
    """Workspace demo's only GPU held by a running job, so that its Ray clusters wait in the queue.
    On the way out, its live clusters are stopped first (nothing may take the GPU and start Ray),
    then the job."""
    hog = client.jobs.submit(name="ray-hog", workspace="demo", command="sleep 900", gpus=1, max_runtime="20m")
    try:
        wait_for(client, hog.id, lambda job: job.state == "RUNNING")
        yield hog.id
    finally:
        for cluster in client.ray_clusters.list("demo", state=["QUEUED", "ADMITTED", "RUNNING", "DEGRADED"]):
            with contextlib.suppress(Conflict):
                client.ray_clusters.delete(cluster.id)
        for job in client.jobs.list("demo", state=["QUEUED", "ADMITTED", "RUNNING"]):
            client.jobs.cancel(job.id)


@pytest.fixture(scope="module")
def held(live_portal: LivePortal) -> Iterator[Client]:
    """A client of the demo user, while demo's GPU is held."""
    with live_portal.client() as client, demo_gpu_held(client):
        yield client


def queued(client: Client, cluster_id: int) -> None:
    """Until the scheduler has given the cluster its place in the queue."""
    until(lambda: client.ray_clusters.get(cluster_id), lambda c: c.queue_info.position is not None)


def test_a_cluster_waits_in_the_queue_with_its_place_and_reason_and_is_stopped(
    held: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ClusterConfiguration(
        name="sdk-queued", namespace="demo", num_workers=2, worker_gpus="0.5", worker_cpu_requests=1,
        worker_cpu_limits="1500m", worker_memory_requests="1Gi", worker_memory_limits="2G", head_cpus=1,
        head_memory=2, preemptible=False,
    )  # fmt: skip
    cluster = Cluster(config, held)
    assert cluster.status() == (ClusterStatus.UNKNOWN, False)
    info = cluster.up()
    # Sizes as the portal gives them: the larger of request and limit, CPUs and GB rounded up; the
    # workspace's only GPU type.
    assert (info.state, info.workers, info.worker_cpu_cores, info.worker_memory_gb) == ("QUEUED", 2, 2, 2)
    assert (info.gpu_type, info.worker_gpus, info.head_cpu_cores, info.head_memory_gb) == ("h100", Decimal("0.5"), 1, 2)
    assert f"Ray cluster sdk-queued ({info.id}) requested in workspace demo." in capsys.readouterr().out
    queued(held, info.id)

    assert cluster.status() == (ClusterStatus.QUEUED, False)
    line = f"Ray cluster {info.id} sdk-queued: QUEUED, #1 in demo, #1 in the cluster, {WAITING}, estimated start "
    assert capsys.readouterr().out.startswith(line)
    with pytest.raises(WaitTimeout, match=f"Ray cluster {info.id} is still QUEUED after waiting 1 s") as late:
        cluster.wait_ready(timeout=1)
    assert isinstance(late.value, TimeoutError)
    assert capsys.readouterr().out.startswith(line)  # where it waits, printed while waiting

    details = cluster.details(print_to_console=False)
    assert details.queue is not None and details.queue.estimated_start_at is not None  # the hog declared 20m
    assert (details.dashboard_url, details.nodes, details.num_workers) == (None, [], 2)
    assert repr(details) == f"<RayCluster {info.id} sdk-queued QUEUED position 1: {WAITING}>"
    assert "QUEUED" in details._repr_html_() and WAITING in details._repr_html_()
    assert [c.id for c in list_all_clusters("demo", print_to_console=False, client=held)] == [info.id]
    with pytest.raises(GPUPortalError, match="its dashboard is there only while it runs"):
        cluster.cluster_dashboard_uri()
    with pytest.raises(Conflict, match="Workspace demo already has a live cluster named sdk-queued"):
        Cluster(config, held).up()

    assert cluster.down().state == "STOPPED"  # it never started: it ends at once
    assert cluster.status(print_to_console=False) == (ClusterStatus.STOPPED, False)
    with pytest.raises(Conflict, match="Cluster sdk-queued has already ended"):
        cluster.down()


def test_a_running_cluster_shows_its_nodes_and_dashboard_and_a_lost_node(held: Client, live_portal: LivePortal) -> None:
    cluster = Cluster(
        ClusterConfiguration(name="sdk-running", workspace="demo", num_workers=2, worker_gpus=0.5, preemptible=False),
        held,
    )
    info = cluster.up()
    assert as_the_host(live_portal, info.id, "ready", nodes=NODES) == "RUNNING"

    assert cluster.status() == (ClusterStatus.READY, True)
    assert cluster.wait_ready(timeout=5).state == "RUNNING"
    details = cluster.details(print_to_console=False)
    assert details.nodes == [RayNode("head", "head", True), RayNode("worker-0", "worker", True),
                             RayNode("worker-1", "worker", True)]  # fmt: skip
    assert details.dashboard_url is not None
    assert re.fullmatch(rf"http://ray-sdk-running-{info.id}\.localhost:\d+/", details.dashboard_url)
    assert cluster.cluster_dashboard_uri() == details.dashboard == details.dashboard_url
    assert details.attempts == 1 and details.running_for is not None

    lost = [*NODES[:2], {**NODES[2], "alive": False}]
    assert as_the_host(live_portal, info.id, "nodes", nodes=lost) == "DEGRADED"
    assert cluster.status(print_to_console=False) == (ClusterStatus.DEGRADED, False)
    assert ("Nodes", "head, worker-0, worker-1 (down)") in cluster.details(print_to_console=False).details()
    with pytest.raises(WaitTimeout, match="is still DEGRADED"):
        cluster.wait_ready(timeout=1)
    assert as_the_host(live_portal, info.id, "nodes", nodes=NODES) == "RUNNING"

    again = get_cluster("sdk-running", "demo", client=held)
    assert (again.id, again.config.num_workers, again.status(print_to_console=False)) == (
        info.id, 2, (ClusterStatus.READY, True)
    )  # fmt: skip
    assert again.down().state == "STOPPED"
    with pytest.raises(GPUPortalError, match="No live Ray cluster sdk-running in workspace demo"):
        get_cluster("sdk-running", "demo", client=held)


class _DashboardStandIn(BaseHTTPRequestHandler):
    """Answers as a Ray dashboard's Jobs API does (its version; no jobs), and keeps what it was sent."""

    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        answer: Any = {"version": "4", "ray_version": "2.60.0", "ray_commit": "test"}
        if self.path != "/api/version":
            answer = []
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def dashboard() -> Iterator[str]:
    """A stand-in for a Ray cluster's dashboard (no Ray starts in these tests): its address."""
    _DashboardStandIn.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DashboardStandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_job_client_is_rays_own_through_the_portal_signed_in_with_the_portal_token(
    held: Client, live_portal: LivePortal, dashboard: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`job_client` is Ray's JobSubmissionClient for the cluster's dashboard URL: it goes through the
    portal's proxy with the portal token, and the dashboard gets the cluster's own Ray token instead."""
    cluster = Cluster(ClusterConfiguration(name="sdk-jobs", workspace="demo", worker_gpus=1, preemptible=False), held)
    info = cluster.up()
    with pytest.raises(GPUPortalError, match="sdk-jobs is QUEUED: its dashboard is there only while it runs"):
        _ = cluster.job_client
    as_the_host(live_portal, info.id, "ready", nodes=NODES[:2], target=dashboard)

    client = cluster.job_client
    assert type(client).__name__ == "JobSubmissionClient"
    assert cluster.job_client is client
    assert cluster.list_jobs() == []
    paths = [path for path, _ in _DashboardStandIn.seen]
    assert paths[0] == "/api/version" and paths[-1] == "/api/jobs/"
    tokens = {token for _, token in _DashboardStandIn.seen}
    assert len(tokens) == 1 and re.fullmatch(r"Bearer [0-9a-f]{40}", tokens.pop() or "")  # the cluster's, not ours

    seen = len(_DashboardStandIn.seen)
    with pytest.raises(GPUPortalError, match="The portal refused the sign-in to the Ray dashboard"):
        job_submission_client(cluster.cluster_dashboard_uri(), "gpp_not_a_token")
    assert len(_DashboardStandIn.seen) == seen  # the portal's proxy refused it: nothing reached the dashboard
    monkeypatch.setitem(sys.modules, "ray.job_submission", None)  # as where Ray is not installed
    with pytest.raises(GPUPortalError, match=r"pip install 'ray\[default\]'"):
        _ = Cluster(cluster.config, held).job_client
    cluster.down()


def test_a_ray_job_is_fire_and_forget_with_the_exit_codes_of_gpuportal_wait(
    held: Client, live_portal: LivePortal, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = ClusterConfiguration(workspace="demo", num_workers=1, worker_gpus=1, envs={"A": "1"}, preemptible=False)
    job = RayJob(
        "sdk-rayjob", "python train.py", cluster_config=config, runtime_env={"env_vars": {"B": "2"}},
        artifact_paths=["out"], active_deadline_seconds=600, client=held,
    )  # fmt: skip
    info = job.submit()
    assert (info.name, info.entrypoint, info.env, info.artifact_paths) == ("sdk-rayjob", "python train.py",
                                                                            {"A": "1", "B": "2"}, ["out"])  # fmt: skip
    assert (info.max_runtime_s, info.workers, info.gpu_type) == (600, 1, "h100")
    queued(held, info.id)
    assert job.wait(timeout=1) == 124  # the timeout's code; the job goes on
    assert f"Ray cluster {info.id} sdk-rayjob: QUEUED, #1 in demo" in capsys.readouterr().err
    assert job.status(print_to_console=False) == (ClusterStatus.QUEUED, False)

    log = "[head] started\nraypod: every node joined\nstep 1 loss 0.5\nTraceback: out of patience\n"
    metrics = json.dumps({"loss": 0.5})
    host_ends(live_portal, info.id, "FAILED", exit_code=3, reason="its entrypoint exited with 3", log=log,
              files={"out/metrics.json": metrics})  # fmt: skip
    assert job.wait() == 3  # its entrypoint's own exit code
    shown = capsys.readouterr()
    assert shown.out == log  # the log, as it grew
    assert f"Ray cluster {info.id} sdk-rayjob: FAILED with exit code 3" in shown.err.splitlines()[-1]
    assert job.exit_code == 3 and job.status(print_to_console=False) == (ClusterStatus.FAILED, True)
    assert job.logs() == log
    saved = job.download_artifacts(tmp_path / "results")
    assert saved == [tmp_path / "results" / "out" / "metrics.json"]
    assert saved[0].read_text() == metrics
    with pytest.raises(Conflict, match="has already ended"):
        job.stop()

    succeeds = RayJob("sdk-rayjob", "python train.py", cluster_config=config, client=held)
    host_ends(live_portal, succeeds.submit().id, "SUCCEEDED", exit_code=0, log="done\n")
    assert succeeds.wait(stream_logs=False) == 0
    stopped = RayJob("sdk-rayjob", "python train.py", cluster_config=config, client=held)
    stopped.submit()
    assert stopped.stop().state == "STOPPED"
    assert stopped.wait() == 130  # stopped before it ended, as `gpuportal wait` says of a cancelled job


def test_bad_requests_are_refused_before_anything_runs(held: Client, tmp_path: Path) -> None:
    def up(**sizes: Any) -> None:
        Cluster(ClusterConfiguration(name="sdk-bad", workspace="demo", preemptible=False, **sizes), held).up()

    with pytest.raises(ValidationError) as no_cpu:  # the portal's refusal, in the configuration's words
        up(head_cpus=0, worker_gpus=1)
    assert no_cpu.value.fields == {"head_cpus": ["Ensure this value is greater than or equal to 1."]}
    with pytest.raises(LimitExceeded, match="workspace demo can never hold more than 1"):
        up(num_workers=4, worker_gpus=1)  # more workers than the quota can ever hold
    with pytest.raises(ValidationError) as both:
        up(worker_profile="gpu-1", worker_cpus=2)
    assert both.value.fields == {"worker_cpus": ["Give the worker's size or its profile, not both."]}
    assert held.ray_clusters.list("demo", name="sdk-bad") == []

    refused_here = [
        (lambda: ClusterConfiguration(name="x", worker_memory="lots"), "worker_memory", "should be GB"),
        (lambda: ClusterConfiguration(name="x", head_cpu_limits=[2]), "head_cpus", "a number of CPU cores"),
        (lambda: ClusterConfiguration(name="x", worker_extended_resource_requests={"google.com/tpu": 1}),
         "worker_extended_resource_requests", "'google.com/tpu' is none of them"),
        (lambda: ClusterConfiguration(name="X"), "name", "is not a name"),
        (lambda: ClusterConfiguration(workspace="demo", namespace="other"), "namespace", "differ"),
        (lambda: RayJob("j", "true", cluster_name="running"), "cluster_name", "brings its own cluster"),
        (lambda: RayJob("j", "true", runtime_env={"pip": ["torch"]}), "runtime_env", "only env_vars apply"),
        (lambda: RayJob("j", " "), "entrypoint", "needs an entrypoint"),
    ]  # fmt: skip
    for make, field, message in refused_here:
        with pytest.raises(SpecError, match=message) as refused:
            make()
        assert refused.value.field == field

    (tmp_path / "ray.yaml").write_text("kind: ray\nname: x\nentrypoint: python x.py\n")
    with pytest.raises(SpecError, match="kind: a Ray spec: submit it with `gpuportal submit`"):
        held.jobs.submit(tmp_path / "ray.yaml")
