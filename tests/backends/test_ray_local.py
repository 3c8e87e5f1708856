"""Ray clusters on the local backend, for real: ``ray start`` nodes in a bubblewrap sandbox with a
network of its own, the dashboard reached through the pod's Unix socket only. No mocks, no database.

Most cases share one cluster (a head and two workers, ~1 GB, ~15-25 s to start on two cores),
started once for the module and stopped by its last test; an entrypoint cluster (a head alone)
runs first, on its own. There is no GPU here: the nodes are given declared device indices, and a
task pinned to a node reads what ``CUDA_VISIBLE_DEVICES`` Ray gives it.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from workers.backends import BackendError, JobSpec, PolicyRefusal
from workers.backends.base import Endpoint, Keep, NodeGroup, RayClusterSpec, RunAs
from workers.backends.local import LocalBackend
from workers.backends.raycluster import DASHBOARD_PORT, GCS_PORT, STATE_DIR, STATUS_FILE

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)

START_TIMEOUT_S = 180.0
#: The workspaces' accounts where the portal runs as root (numeric: no passwd entry is needed).
CLUSTER_ACCOUNT = RunAs("gpw-ray-a", 200_611, 200_611)
PROBE_ACCOUNT = RunAs("gpw-ray-b", 200_612, 200_612)


def wait_for(check: Callable[[], Any], timeout_s: float = 60.0, step_s: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(step_s)
    return result


def account(run_as: RunAs) -> RunAs | None:
    return run_as if os.geteuid() == 0 else None


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 30.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def call(endpoint: Endpoint, method: str, path: str, *, token: str | None, body: Any = None) -> tuple[int, Any]:
    """An HTTP request to the cluster's dashboard through its Unix socket, as the portal's proxy
    makes it: the token (if any) as ``Authorization: Bearer``."""
    sock = urllib.parse.unquote(urllib.parse.urlsplit(endpoint.url).netloc)
    connection = UnixHTTPConnection(sock)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = connection.getresponse()
        raw = response.read()
    finally:
        connection.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode(errors="replace")


def run_ray_job(endpoint: Endpoint, token: str, code: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Submit ``python -c code`` through the Jobs API and wait for it to end; its info and logs."""
    submission = f"test-{secrets.token_hex(4)}"
    status, answer = call(
        endpoint, "POST", "/api/jobs/", token=token,
        body={"entrypoint": f"python -c {shlex.quote(code)}", "submission_id": submission},
    )  # fmt: skip
    assert status == 200, answer

    def ended() -> dict[str, Any] | None:
        info = call(endpoint, "GET", f"/api/jobs/{submission}", token=token)[1]
        return info if info["status"] in ("SUCCEEDED", "FAILED", "STOPPED") else None

    info: dict[str, Any] = wait_for(ended, timeout_s, step_s=0.5)
    info["logs"] = call(endpoint, "GET", f"/api/jobs/{submission}/logs", token=token)[1]["logs"]
    return info


def ns_inode(pid: int, kind: str) -> int:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino


def live_ns_inode(pid: int, kind: str) -> int | None:
    """`ns_inode`, or None for a process that ended meanwhile."""
    try:
        return ns_inode(pid, kind)
    except FileNotFoundError:
        return None


def processes() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def cluster_pids(backend: LocalBackend) -> list[int]:
    """Every process of the cluster's sandbox (its PID namespace), as the machine numbers them."""
    wrapper = backend.get_state()["replicas"][0]["pid"]
    ours = ns_inode(os.getpid(), "pid")
    namespaces = set()
    for pid in processes():
        try:
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2]) != wrapper:
                continue
            if ns_inode(pid, "pid") != ours:
                namespaces.add(ns_inode(pid, "pid"))
        except (OSError, ValueError, IndexError):
            continue
    assert len(namespaces) == 1, namespaces
    (namespace,) = namespaces
    found = []
    for pid in processes():
        try:
            if ns_inode(pid, "pid") == namespace:
                found.append(pid)
        except OSError:
            continue
    return found


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot); ``None`` when it is gone, or dead and
    waiting only to be reaped (a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def still_running(pids: dict[int, int | None]) -> list[int]:
    """Those of ``pids`` (pid -> start time) that still run: the same processes, not reused pids."""
    return [pid for pid, ticks in pids.items() if ticks is not None and start_ticks(pid) == ticks]


def host_pid(backend: LocalBackend, inner_pid: int) -> int:
    """The machine's pid of the cluster's process ``inner_pid`` (a pid of the status file)."""
    for pid in cluster_pids(backend):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        if int(nspid[-1]) == inner_pid:
            return pid
    raise AssertionError(f"no process {inner_pid} in the cluster")


def listening(net_tcp_files: list[str]) -> dict[int, set[int]]:
    """Listening TCP ports in ``/proc/.../net/tcp{,6}`` files: port -> socket inodes."""
    ports: dict[int, set[int]] = {}
    for path in net_tcp_files:
        with open(path) as table:
            for line in list(table)[1:]:
                fields = line.split()
                if fields[3] == "0A":
                    ports.setdefault(int(fields[1].rsplit(":", 1)[1], 16), set()).add(int(fields[9]))
    return ports


def socket_owners() -> dict[int, set[int]]:
    """Every open socket's inode -> the pids holding it."""
    owners: dict[int, set[int]] = {}
    for pid in processes():
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    owners.setdefault(int(target[8:-1]), set()).add(pid)
        except OSError:
            continue
    return owners


def host_addresses() -> list[str]:
    """Every address of this machine's interfaces (link-local ones with their interface)."""
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    addresses = []
    for line in out.splitlines():
        fields = line.split()
        address = fields[3].split("/")[0]
        addresses.append(f"{address}%{fields[1]}" if address.startswith("fe80:") else address)
    return addresses


@dataclass
class Cluster:
    backend: LocalBackend
    spec: RayClusterSpec
    endpoint: Endpoint
    ready_s: float
    run_dir: Path
    owner: Path

    @property
    def job_dir(self) -> Path:
        return Path(self.spec.work_dir, self.spec.key)

    def status(self) -> dict[str, Any]:
        return self.backend.ray_status()

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {node["name"]: node for node in self.backend.ray_nodes()}


def make_spec(root: Path, workspace: str, **fields: Any) -> RayClusterSpec:
    defaults: dict[str, Any] = {
        "key": f"ray-{secrets.token_hex(4)}",
        "workspace": workspace,
        "name": "cluster",
        "work_dir": str(root / "work" / workspace),
        "auth_token": secrets.token_urlsafe(24),
        "head": NodeGroup("head", 1, cpu_cores=1, memory_gb=1),
        "run_as": account(CLUSTER_ACCOUNT),
    }
    return RayClusterSpec(**{**defaults, **fields})


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    """A short directory (Unix socket paths under it must fit 107 bytes), traversable by the
    workspaces' accounts."""
    path = Path(tempfile.mkdtemp(prefix="gpr-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def new_backend(root: Path) -> LocalBackend:
    return LocalBackend(
        run_dir=str(root / "run"), owner=str(root / "work"), teardown_grace_s=5.0, ray_start_timeout_s=START_TIMEOUT_S
    )


@pytest.fixture(scope="module")
def cluster(root: Path) -> Iterator[Cluster]:
    """A head and two workers with declared GPUs (worker-0: GPU 3; worker-1: GPUs 5 and 6)."""
    spec = make_spec(
        root, "team-a",
        workers=NodeGroup("worker", 2, gpu_type="h100", gpus=1, cpu_cores=1, memory_gb=1, devices=[["3"], ["5", "6"]]),
    )  # fmt: skip
    backend = new_backend(root)
    started = time.monotonic()
    endpoint = backend.start(spec)
    ready_s = time.monotonic() - started
    print(f"head + 2 workers ready in {ready_s:.1f}s")
    yield Cluster(backend, spec, endpoint, ready_s, root / "run", root / "work")
    if backend.get_state():
        backend.stop(grace_s=0)


# -- without a cluster ---------------------------------------------------------------------------


def test_a_cluster_is_refused_where_workloads_are_not_sandboxed(root: Path) -> None:
    backend = LocalBackend(sandbox="off", run_dir=str(root / "run"), owner=str(root / "work"))
    with pytest.raises(BackendError, match="run only sandboxed") as caught:
        backend.start(make_spec(root, "team-a"))
    assert caught.value.permanent
    assert not backend.get_state()


def test_the_tokens_variables_and_a_second_head_are_refused(root: Path) -> None:
    backend = new_backend(root)
    with pytest.raises(PolicyRefusal, match="RAY_AUTH_MODE"):
        backend.start(make_spec(root, "team-a", env={"RAY_AUTH_MODE": "disabled"}))
    with pytest.raises(BackendError, match="one head"):
        backend.start(make_spec(root, "team-a", head=NodeGroup("head", 2)))
    with pytest.raises(BackendError, match="device lists"):
        backend.start(make_spec(root, "team-a", workers=NodeGroup("worker", 2, devices=[["0"]])))
    assert not backend.get_state()


# -- an entrypoint cluster, alone ----------------------------------------------------------------


def test_an_entrypoint_runs_as_the_clusters_ray_job_and_its_exit_code_ends_the_cluster(root: Path) -> None:
    entrypoint = (
        "python -c 'import ray; ray.init(); print(\"nodes:\", len(ray.nodes()), flush=True)'"
        " && echo the entrypoint fails now && exit 7"
    )
    spec = make_spec(root, "team-a", entrypoint=entrypoint)
    backend = new_backend(root)
    try:
        backend.start(spec)
        status = wait_for(lambda: None if (s := backend.poll()).running else s, START_TIMEOUT_S, step_s=0.5)
    finally:
        backend.stop(grace_s=0)

    assert status.exit_code == 7, status
    log = backend.logs(0)[0].decode()
    assert "nodes: 1" in log and "the entrypoint fails now" in log  # the driver's log, on the pod's output
    ray_status = backend.ray_status()
    assert ray_status["entrypoint"] == {"submission_id": "portal-entrypoint", "status": "FAILED", "exit_code": 7}
    assert ray_status["phase"] == "exited" and ray_status["exit_code"] == 7
    assert sorted(os.listdir(Path(spec.work_dir, spec.key, STATE_DIR))) == [STATUS_FILE]


def test_a_head_that_dies_fails_the_cluster_which_ends_and_leaves_nothing_running(root: Path) -> None:
    spec = make_spec(root, "team-a")
    backend = new_backend(root)
    try:
        backend.start(spec)
        pids = {pid: start_ticks(pid) for pid in cluster_pids(backend)}
        os.kill(host_pid(backend, backend.ray_nodes()[0]["pid"]), signal.SIGKILL)
        status = wait_for(lambda: None if (s := backend.poll()).running else s, 60.0, step_s=0.2)
    finally:
        backend.stop(grace_s=0)

    assert status.exit_code == 1
    assert status.message == "the Ray cluster failed: the head node exited with code 137"
    assert backend.ray_status()["phase"] == "failed"
    assert not still_running(pids)
    assert sorted(os.listdir(Path(spec.work_dir, spec.key, STATE_DIR))) == [STATUS_FILE]


# -- one cluster for the rest --------------------------------------------------------------------


def test_a_head_and_two_workers_become_ready(cluster: Cluster) -> None:
    status = cluster.status()
    assert status["phase"] == "ready" and status["ready_at"]
    nodes = cluster.nodes()
    assert sorted(nodes) == ["head", "worker-0", "worker-1"]
    assert all(node["alive"] and node["joined"] and node["restarts"] == 0 for node in nodes.values())
    assert [nodes[name]["num_gpus"] for name in sorted(nodes)] == [0, 1, 2]
    assert cluster.backend.poll().running
    assert cluster.endpoint.url.startswith("http+unix://") and cluster.endpoint.port == 0

    code, answer = call(cluster.endpoint, "GET", "/api/v0/nodes?detail=false", token=cluster.spec.auth_token)
    assert code == 200, answer
    alive = [n for n in answer["data"]["result"]["result"] if n["state"] == "ALIVE"]
    assert sorted(n["node_id"] for n in alive) == sorted(node["node_id"] for node in nodes.values())


def test_the_dashboard_through_the_socket_wants_the_clusters_token(cluster: Cluster) -> None:
    assert call(cluster.endpoint, "GET", "/api/jobs/", token=None)[0] == 401
    assert call(cluster.endpoint, "GET", "/api/jobs/", token="not-" + cluster.spec.auth_token)[0] == 403
    assert call(cluster.endpoint, "GET", "/api/jobs/", token=cluster.spec.auth_token)[0] == 200


PINNED = r"""
import json, os, ray
ray.init()

@ray.remote
def report(name):
    info = {
        "name": name,
        "node_id": ray.get_runtime_context().get_node_id(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
        "pid_namespace": os.readlink("/proc/self/ns/pid"),
        "uid": os.getuid(),
    }
    with open(os.path.join(os.environ["PORTAL_ARTIFACTS_DIR"], name + ".json"), "w") as out:
        json.dump(info, out)
    return info

wanted = {"head": 0, "worker-0": 1, "worker-1": 2}
tasks = [report.options(resources={name: 1}, num_gpus=gpus).remote(name) for name, gpus in wanted.items()]
print("REPORTS=" + json.dumps(ray.get(tasks)))
"""


def test_a_job_pinned_to_each_node_runs_there_sees_only_its_gpus_and_leaves_artifacts(cluster: Cluster) -> None:
    info = run_ray_job(cluster.endpoint, cluster.spec.auth_token, PINNED)
    assert info["status"] == "SUCCEEDED", info["logs"]
    nodes = cluster.nodes()

    artifacts = {a.path: a for a in cluster.backend.artifacts().files}
    for name, devices in (("head", ""), ("worker-0", "3"), ("worker-1", "5,6")):
        assert f"artifacts/{name}.json" in artifacts
        report = json.loads((cluster.job_dir / "artifacts" / f"{name}.json").read_text())
        assert report["node_id"] == nodes[name]["node_id"]  # it ran on the node it was pinned to
        assert sorted(report["cuda_visible_devices"].split(",")) == devices.split(",")  # and its GPUs only
        # In the cluster's sandbox, with its own PID namespace, as its workspace's account.
        assert report["pid_namespace"] != os.readlink("/proc/self/ns/pid")
        assert report["uid"] == (CLUSTER_ACCOUNT.uid if os.geteuid() == 0 else os.getuid())


PROBE = r"""
import json, socket, sys
targets = json.loads(sys.argv[1])
connected = []
for host, port in targets:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect(socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4])
            connected.append([host, port])
        except OSError:
            pass
print("CONNECTED=" + json.dumps(connected))
"""


def test_no_process_outside_the_cluster_reaches_any_of_its_ports(cluster: Cluster) -> None:
    pids = cluster_pids(cluster.backend)
    raypod = host_pid(cluster.backend, cluster.nodes()["head"]["pid"])
    # Every port any process of the cluster listens on, read in the cluster's own network.
    ports = listening([f"/proc/{raypod}/net/tcp", f"/proc/{raypod}/net/tcp6"])
    assert {GCS_PORT, DASHBOARD_PORT} <= set(ports) and len(ports) > 10, ports
    # No process of the cluster is in the machine's network.
    assert ns_inode(os.getpid(), "net") not in {inode for pid in pids if (inode := live_ns_inode(pid, "net"))}

    # A port some other process of the machine listens on (Redis on 6379, say) may answer; none
    # that a process of the cluster holds in the machine's network.
    host_ports, owners = listening(["/proc/self/net/tcp", "/proc/self/net/tcp6"]), socket_owners()
    held = {port: {pid for inode in inodes for pid in owners.get(inode, ())} for port, inodes in host_ports.items()}
    others = {port for port, holders in held.items() if not holders & set(pids)}
    with socket.socket() as control:  # the probe must reach what does listen on the machine
        control.bind(("127.0.0.1", 0))
        control.listen()
        control_port = control.getsockname()[1]
        targets = [[host, port] for host in host_addresses() for port in sorted(ports)]
        targets.append(["127.0.0.1", control_port])
        probe_spec = JobSpec(
            key=f"probe-{secrets.token_hex(4)}", workspace="team-b", name="probe",
            command=f"python3 -c {shlex.quote(PROBE)} {shlex.quote(json.dumps(targets))}",
            work_dir=str(cluster.owner / "team-b"), run_as=account(PROBE_ACCOUNT),
        )  # fmt: skip
        probe = new_backend(cluster.run_dir.parent)
        probe.start(probe_spec)
        try:
            status = wait_for(lambda: None if (s := probe.poll()).running else s, 120.0)
        finally:
            probe.stop(grace_s=0)
    log = probe.logs(0)[0].decode()
    assert status.exit_code == 0, log
    connected = json.loads(log.split("CONNECTED=", 1)[1].splitlines()[0])
    assert ["127.0.0.1", control_port] in connected
    reached = {(host, port) for host, port in connected if port != control_port and port not in others}
    assert not reached, f"a process outside the cluster reached its ports: {sorted(reached)}"


def test_a_new_backend_takes_over_an_unrecorded_start_and_a_sweep_keeps_a_recorded_one(cluster: Cluster) -> None:
    adopter = new_backend(cluster.run_dir.parent)
    assert adopter.adopt(cluster.spec) == cluster.endpoint
    assert adopter.poll().running and adopter.ray_nodes() == cluster.backend.ray_nodes()
    swept = adopter.sweep_orphans(str(cluster.owner), Keep(states=(cluster.backend.get_state(),)))
    assert cluster.spec.key not in swept
    assert cluster.backend.poll().running


def test_a_killed_worker_makes_the_cluster_degraded_then_it_is_started_again(cluster: Cluster) -> None:
    before = cluster.nodes()["worker-0"]
    os.kill(host_pid(cluster.backend, before["pid"]), signal.SIGKILL)  # its `ray start`: the node dies with it

    wait_for(lambda: cluster.status()["phase"] == "degraded", 30.0, step_s=0.05)
    assert cluster.backend.poll().running  # degraded is still running
    wait_for(lambda: cluster.status()["phase"] == "ready", START_TIMEOUT_S, step_s=0.2)
    after = cluster.nodes()["worker-0"]
    assert after["restarts"] == 1 and after["alive"] and after["joined"]
    assert after["node_id"] != before["node_id"] and after["pid"] != before["pid"]
    assert cluster.backend.poll().running


def test_stop_leaves_no_process_and_no_temporary_directory(cluster: Cluster) -> None:
    pids = {pid: start_ticks(pid) for pid in cluster_pids(cluster.backend)}
    sock = urllib.parse.unquote(urllib.parse.urlsplit(cluster.endpoint.url).netloc)
    assert len(pids) > 10 and os.path.exists(sock)
    assert any(p.is_dir() for p in (cluster.job_dir / STATE_DIR).iterdir())

    cluster.backend.stop(grace_s=10)

    status = cluster.backend.poll()
    assert not status.running and status.exit_code == 143, status
    marks = [cluster.spec.key.encode(), str(cluster.job_dir).encode(), sock.encode()]
    left = still_running(pids)
    for pid in processes():
        try:
            seen = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if any(mark in seen for mark in marks):
            left.append(pid)
    assert not left, f"processes of the cluster left running: {left}"
    assert sorted(os.listdir(cluster.job_dir / STATE_DIR)) == [STATUS_FILE]
    assert not os.path.exists(sock)
    assert cluster.backend.ray_status()["phase"] == "exited"
