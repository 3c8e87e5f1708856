"""Ray clusters on the real Slurm, for real: one heterogeneous batch job, ``ray start`` on each of its
nodes, run as a workspace's own Unix account where the tests run as root. No mocks, no database.

Most cases share one cluster (a CPU-only head and two one-GPU workers on three of the simulated
nodes, ~1 GB, ~15-25 s to start on two cores), started once for the module and stopped by its
stop test; the entrypoint case runs after it, on a cluster of its own (a head and one two-GPU
worker), so that no more than one cluster runs at a time. Slurm's simulated nodes are this one
machine: what a node runs is a process here, which the tests find in ``/proc``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SHARED_ENV_DIR
from workers.backends.base import BackendError, Endpoint, Keep, NodeGroup, RayClusterSpec, RunAs, Status
from workers.backends.pyenv import RAY_VERSION, ensure_ray_env
from workers.backends.slurm import SlurmBackend
from workers.backends.slurm_commands import leader_id

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)

NODE_PYTHON = "/usr/bin/python3"  # the nodes' Python: the accounts cannot reach pytest's
#: The workspace account the clusters run as where the tests run as root (next to the ones the
#: local backend's Ray tests use), made with groupadd/useradd as apps/workspaces/unix.py makes them.
ACCOUNT = ("gpw-rayslurm", 200_613)
WORKSPACE = "team-ray"


def wait_for(check: Callable[[], Any], timeout_s: float = 60.0, step_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(step_s)
    return result


def run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout


def call(endpoint: Endpoint, method: str, path: str, *, token: str | None, body: Any = None) -> tuple[int, Any]:
    """An HTTP request to the cluster's dashboard, as the portal's proxy makes it (the token, if
    any, as ``Authorization: Bearer``)."""
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(endpoint.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def run_ray_job(endpoint: Endpoint, token: str, command: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Submit ``command`` through the Jobs API and wait for it to end: its info and its logs."""
    submission = f"test-{secrets.token_hex(4)}"
    body = {"entrypoint": command, "submission_id": submission}
    status, answer = call(endpoint, "POST", "/api/jobs/", token=token, body=body)
    assert status == 200, answer

    def ended() -> dict[str, Any] | None:
        info = call(endpoint, "GET", f"/api/jobs/{submission}", token=token)[1]
        return info if info["status"] in ("SUCCEEDED", "FAILED", "STOPPED") else None

    info: dict[str, Any] = wait_for(ended, timeout_s, step_s=0.5)
    info["logs"] = call(endpoint, "GET", f"/api/jobs/{submission}/logs", token=token)[1]["logs"]
    return info


def processes_of(job_dir: Path) -> dict[int, str]:
    """Every process of a cluster, found in ``/proc`` as Slurm's simulated nodes are this machine:
    its working directory or its command line in the cluster's directory, or a command line naming
    a Ray temporary directory whose link leads there. pid -> command line."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        links = re.findall(r"(/tmp/ray-[A-Za-z0-9_]{8})/t\b", cmdline)
        into = any(os.path.realpath(f"{link}/t").startswith(f"{job_dir}/") for link in links)
        if cwd == str(job_dir) or cwd.startswith(f"{job_dir}/") or str(job_dir) in cmdline or into:
            found[int(entry)] = cmdline
    return found


def links_into(job_dir: Path) -> list[str]:
    """The nodes' short links to their Ray directories (``/tmp/ray-XXXXXXXX/t``) that lead into ``job_dir``."""
    return [d for d in map(str, Path("/tmp").glob("ray-*")) if os.path.realpath(f"{d}/t").startswith(f"{job_dir}/")]


@pytest.fixture(scope="module")
def account() -> RunAs | None:
    """The workspace's own account where the tests run as root (the portal switches to it then)."""
    if os.geteuid() != 0:
        return None
    name, uid = ACCOUNT
    with contextlib.suppress(KeyError):
        entry = pwd.getpwnam(name)
        return RunAs(name, entry.pw_uid, entry.pw_gid)
    for argv in (["groupadd", "--gid", str(uid), name],
                 ["useradd", "--uid", str(uid), "--gid", str(uid), "--no-create-home", "--home-dir", "/nonexistent",
                  "--shell", "/usr/sbin/nologin", name]):  # fmt: skip
        subprocess.run(argv, capture_output=True, check=False, timeout=30)
    entry = pwd.getpwnam(name)
    return RunAs(name, entry.pw_uid, entry.pw_gid)


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    """A work directory the workspace's account can reach, as a cluster's shared filesystem is."""
    work = Path(tempfile.mkdtemp(prefix="gpuportal-rayslurm-")) / "work"
    work.parent.chmod(0o711)
    work.mkdir(mode=0o711)
    yield work
    SlurmBackend().sweep_orphans(str(work))
    shutil.rmtree(work.parent, ignore_errors=True)


def backend_for(work: Path) -> SlurmBackend:
    return SlurmBackend(env_root=str(SHARED_ENV_DIR), python=NODE_PYTHON, owner=str(work), start_timeout_s=60)


def ray_spec(work: Path, key: str, account: RunAs | None, **kwargs: Any) -> RayClusterSpec:
    return RayClusterSpec(
        key=key,
        workspace=WORKSPACE,
        name=key,
        work_dir=str(work / WORKSPACE),
        auth_token=secrets.token_urlsafe(24),
        run_as=account,
        portal_env={"GPUPORTAL_URL": "http://portal.invalid", "GPUPORTAL_TOKEN": secrets.token_urlsafe(24)},
        **kwargs,
    )


@dataclass
class Cluster:
    backend: SlurmBackend
    spec: RayClusterSpec
    endpoint: Endpoint
    ready_s: float

    @property
    def job_dir(self) -> Path:
        return Path(self.spec.work_dir, self.spec.key)

    @property
    def job_id(self) -> str:
        return str(self.backend.get_state()["job_id"])


@pytest.fixture(scope="module")
def cluster(work: Path, account: RunAs | None) -> Iterator[Cluster]:
    """A CPU-only head and two one-GPU workers, each node 1 CPU and 1 GB; the time from the request
    to every node joined is printed (the Ray environment is built before, once)."""
    ensure_ray_env(SHARED_ENV_DIR, NODE_PYTHON)
    backend = backend_for(work)
    spec = ray_spec(
        work,
        "ray-main",
        account,
        head=NodeGroup("head", gpus=0, cpu_cores=1, memory_gb=1),
        workers=NodeGroup("worker", replicas=2, gpus=1, cpu_cores=1, memory_gb=1),
        env={"MY_SETTING": "a b'c"},
    )
    began = time.monotonic()
    endpoint = backend.start_ray_cluster(spec)
    ready_s = time.monotonic() - began
    print(f"\nRay on Slurm, a head and 2 workers: request -> every node joined in {ready_s:.1f}s")
    yield Cluster(backend, spec, endpoint, ready_s)
    with contextlib.suppress(BackendError):
        backend.stop(grace_s=15)


def test_the_ray_environment_holds_the_portals_ray() -> None:
    import ray

    env = ensure_ray_env(SHARED_ENV_DIR, NODE_PYTHON)
    assert ray.__version__ == RAY_VERSION  # the portal's own
    version = run(str(env / "bin" / "python"), "-c", "import ray, gpuportal; print(ray.__version__)")
    assert version.strip() == RAY_VERSION


def test_a_head_and_two_workers_come_up_on_three_slurm_nodes(cluster: Cluster, account: RunAs | None) -> None:
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", cluster.endpoint.url), cluster.endpoint
    nodes = cluster.backend.ray_nodes()
    assert [(n.name, n.state) for n in nodes] == [("head", "ALIVE"), ("worker-0", "ALIVE"), ("worker-1", "ALIVE")]
    assert len({n.slurm_node for n in nodes}) == 3 and all(n.slurm_node.startswith("node") for n in nodes)
    assert [n.resources.get("GPU", 0.0) for n in nodes] == [0.0, 1.0, 1.0]
    assert [n.resources.get(n.name) for n in nodes] == [1.0, 1.0, 1.0]  # a custom resource naming each node
    assert all(n.resources["CPU"] == 1.0 for n in nodes)
    assert all(n.resources["memory"] + n.resources["object_store_memory"] <= 1 << 30 for n in nodes)
    assert cluster.backend.poll() == Status("running")

    # One heterogeneous job: the head's component and the workers', as the workspace's account.
    user = account.user if account else pwd.getpwuid(os.geteuid()).pw_name
    components = run("squeue", "-h", "-j", cluster.job_id, "-o", "%i|%T|%D|%b|%u|%a").split()
    assert [c.split("|")[:4] for c in components] == [
        [f"{cluster.job_id}+0", "RUNNING", "1", "N/A"],
        [f"{cluster.job_id}+1", "RUNNING", "2", "gres:gpu:1"],
    ], components
    assert {c.split("|")[4] for c in components} == {user}
    if account:
        assert {c.split("|")[5] for c in components} == {WORKSPACE}
        owners = {Path(f"/proc/{pid}").stat().st_uid for pid in processes_of(cluster.job_dir)}
        assert owners == {account.uid}  # every Ray process runs as the workspace's account

    # Each node's Ray temporary directory (its session, its logs) is under the cluster's directory.
    for name in ("head", "worker-0", "worker-1"):
        assert (cluster.job_dir / ".portal" / "ray" / name / "session_latest" / "logs" / "raylet.out").is_file()
    assert len(links_into(cluster.job_dir)) == 3


def test_a_job_pinned_to_each_worker_runs_there_and_leaves_artifacts(cluster: Cluster) -> None:
    code = """
import os, ray
ray.init()

@ray.remote(num_gpus=1, num_cpus=0.5)
def report(name):
    env, gpus = os.environ, ",".join(ray.get_gpu_ids())
    text = f"{name} {env['SLURMD_NODENAME']} {gpus} {env['CUDA_VISIBLE_DEVICES']} {env['MY_SETTING']}"
    with open(os.path.join(os.environ["PORTAL_ARTIFACTS_DIR"], f"{name}.txt"), "w") as out:
        out.write(text + "\\n")
    return text

print(ray.get([report.options(resources={name: 1}).remote(name) for name in ("worker-0", "worker-1")]))
"""
    info = run_ray_job(cluster.endpoint, cluster.spec.auth_token, f"python -c {shlex.quote(code)}")
    assert info["status"] == "SUCCEEDED", info

    where = {n.name: n.slurm_node for n in cluster.backend.ray_nodes()}
    found = cluster.backend.artifacts().files
    assert [f.path for f in found] == ["artifacts/worker-0.txt", "artifacts/worker-1.txt"]
    for name in ("worker-0", "worker-1"):
        text = (cluster.job_dir / "artifacts" / f"{name}.txt").read_text()
        # On its node, with the one GPU Slurm gave that node, and the cluster's environment.
        assert re.fullmatch(rf"{name} {where[name]} (\d) \1 a b'c\n", text), text


def test_the_dashboard_wants_the_clusters_token_which_no_slurm_record_shows(cluster: Cluster) -> None:
    nodes = "/api/v0/nodes?limit=10"
    assert call(cluster.endpoint, "GET", nodes, token=None)[0] == 401
    assert call(cluster.endpoint, "GET", nodes, token="not-the-token")[0] == 403
    assert call(cluster.endpoint, "GET", "/api/jobs/", token=None)[0] == 401
    assert call(cluster.endpoint, "GET", nodes, token=cluster.spec.auth_token)[0] == 200

    secret_values = [cluster.spec.auth_token, cluster.spec.portal_env["GPUPORTAL_TOKEN"]]
    shown = run("scontrol", "show", "job", "-dd", cluster.job_id)
    shown += run("scontrol", "write", "batch_script", cluster.job_id, "-")  # the script's text, as Slurm keeps it
    assert "ray.sh" in shown and "rayslurm.py" in shown
    assert not any(secret in shown for secret in secret_values)
    assert not any(any(s in cmd for s in secret_values) for cmd in processes_of(cluster.job_dir).values())
    assert not any(secret in json.dumps(cluster.backend.get_state()) for secret in secret_values)
    secrets_file = cluster.job_dir / ".portal" / "ray-secrets.json"
    assert secrets_file.stat().st_mode & 0o777 == 0o600
    assert (cluster.job_dir / ".portal").stat().st_mode & 0o777 == 0o700


def test_an_unrecorded_start_is_adopted_and_a_sweep_keeps_the_recorded_one(cluster: Cluster, work: Path) -> None:
    adopted = backend_for(work).adopt(cluster.spec)
    assert adopted == cluster.endpoint
    state = cluster.backend.get_state()
    assert SlurmBackend().sweep_orphans(str(work), Keep(states=(state,))) == []
    assert SlurmBackend().sweep_orphans(str(work), Keep(keys=frozenset({cluster.spec.key}))) == []
    assert (leader_id("17+1"), leader_id("17"), leader_id("17.batch")) == ("17", "17", "")


def test_stop_ends_the_job_and_leaves_no_ray_process_on_any_node(cluster: Cluster) -> None:
    running = processes_of(cluster.job_dir)
    assert len(running) >= 9, running  # per node: its program, ray start, raylet, and more
    assert any("gcs_server" in cmd for cmd in running.values())

    cluster.backend.stop(grace_s=15)

    assert run("squeue", "-h", "-j", cluster.job_id) == ""
    assert processes_of(cluster.job_dir) == {}
    assert links_into(cluster.job_dir) == []
    assert cluster.backend.poll() == Status("exited", 143, "stopped on request")
    batch = cluster.backend.logs(0)[0].decode()
    assert "cluster stopping: stopped on request" in batch, batch
    for replica, name in enumerate(("head", "worker-0", "worker-1"), start=1):
        assert f"{name} exited with code" in cluster.backend.logs(replica)[0].decode()


def test_an_entrypoint_runs_as_the_clusters_job_and_its_exit_code_ends_the_cluster(
    work: Path, account: RunAs | None
) -> None:
    driver = """
import ray
ray.init()
resources = ray.cluster_resources()
print("nodes", sorted(k for k in resources if k.startswith(("head", "worker"))), "gpus", resources.get("GPU"))
print("PROGRESS 0.5")
raise SystemExit(3)
"""
    backend = backend_for(work)
    spec = ray_spec(
        work,
        "ray-entry",
        account,
        head=NodeGroup("head", gpus=0, cpu_cores=1, memory_gb=1),
        workers=NodeGroup("worker", replicas=1, gpus=2, cpu_cores=2, memory_gb=2),
        entrypoint=f"python -c {shlex.quote(driver)}",
    )

    def ended() -> Status | None:
        status = backend.poll()
        return None if status.running else status

    try:
        backend.start_ray_cluster(spec)
        status = wait_for(ended, timeout_s=120, step_s=0.5)
    finally:
        with contextlib.suppress(BackendError):
            backend.stop(grace_s=15)

    assert status == Status("exited", 3, "failed with exit code 3")
    log = backend.logs(0)[0].decode()
    assert "nodes ['head', 'worker-0'] gpus 2.0" in log, log
    assert "the entrypoint ended: FAILED, exit code 3" in log
    progress = backend.progress()
    assert progress is not None and progress.fraction == 0.5
    job_dir = Path(spec.work_dir, spec.key)
    assert processes_of(job_dir) == {}
    assert links_into(job_dir) == []
