"""A Ray cluster on the local backend, lowered to one sandboxed job: workers/raypod.py.

The whole cluster (its head and every worker node) is one replica of the local backend's job
machinery, so the wrapper, the sandbox, the cgroup, the log cap, stop, adopt and the orphan sweep
apply to it unchanged. Its command is the pod (workers/raypod.py) on the Python of the environment
that holds ``ray`` (bound read-only into the sandbox), which starts and supervises the nodes. The
sandbox gets the union of the nodes' GPUs (each node sees only its own, through
``CUDA_VISIBLE_DEVICES``), the sum of their CPUs and memory as its limits, and a network of its own
with only loopback: Ray's ports, which run whatever code reaches them, are out of every other
process's reach. The one way in is the pod's Unix socket (``SOCKET_NAME``, in the directory the
local backend makes for a server's socket), forwarded to the dashboard and its Jobs API, which want
the cluster's token.

Layout of the cluster's directory (``<work_dir>/<key>``, as a job's): ``artifacts/`` (its
``PORTAL_ARTIFACTS_DIR``), ``.ray/status.json`` (the pod's status file, see ``read_status()``)
and, while it runs, ``.ray/<node>/`` (each node's Ray temporary and session directory, removed when
the cluster ends).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

from workers.backends.base import BackendError, JobSpec, NodeGroup, PolicyRefusal, RayClusterSpec
from workers.backends.files import open_inside

#: The pod, run inside the sandbox, and the module it imports from its own directory: both bound
#: read-only there (``POD_FILES``).
RAYPOD = Path(__file__).resolve().parent.parent / "raypod.py"
POD_FILES = (RAYPOD, RAYPOD.with_name("raynode.py"))
#: The pod's socket, forwarded to the dashboard, in the local backend's socket directory of the cluster.
SOCKET_NAME = "dashboard.sock"
#: The pod's directory in the cluster's: its status file, and the nodes' temporary directories.
STATE_DIR = ".ray"
STATUS_FILE = "status.json"
#: Fixed ports, on the loopback of the cluster's own network (no other cluster or process shares it).
GCS_PORT = 6379
DASHBOARD_PORT = 8265
#: Each node's dashboard agent listens on this port plus its slot (the head's is 0): Ray's default
#: (52365) is one for all, and the nodes share one loopback.
AGENT_PORT_BASE = 20000
#: How often a worker node that died is started again before the cluster fails.
MAX_RESTARTS = 3
#: The most nodes one machine runs in one cluster.
MAX_NODES = 64
#: A node's object store: this share of its memory, at least Ray's minimum (75 MiB) and a little.
OBJECT_STORE_SHARE = 0.3
MIN_OBJECT_STORE_BYTES = 80 << 20
GIB = 1 << 30
#: The most of a status file the portal reads.
MAX_STATUS_BYTES = 1 << 20
#: The variables the cluster's token reaches its nodes through; no spec may set them.
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
_TOKEN_RE = re.compile(r"^[A-Za-z0-9._~+/=-]{16,512}$")


def node_names(spec: RayClusterSpec) -> list[str]:
    """``head``, then ``worker-0`` ... ``worker-<n-1>``: each node's name, and its custom resource."""
    return ["head", *(f"worker-{i}" for i in range(spec.workers.replicas))]


def check_spec(spec: RayClusterSpec) -> None:
    """``BackendError(permanent=True)`` for a cluster no machine can run this way (not one head, too
    many nodes, device lists that do not match the replicas, a token unfit for a header);
    ``PolicyRefusal`` for env the user may not set (the token's variables)."""
    if spec.head.replicas != 1:
        raise BackendError(f"a Ray cluster has one head, not {spec.head.replicas}", permanent=True)
    if not 0 <= spec.workers.replicas < MAX_NODES:
        raise BackendError(f"a Ray cluster on one machine has at most {MAX_NODES - 1} workers", permanent=True)
    for group in spec.groups:
        if group.devices and len(group.devices) != group.replicas:
            raise BackendError(
                f"{len(group.devices)} device lists for {group.replicas} {group.role} nodes", permanent=True
            )
    if not _TOKEN_RE.match(spec.auth_token):
        raise BackendError("the Ray cluster's token must be 16 to 512 URL-safe characters", permanent=True)
    for key in spec.env:
        if key in AUTH_ENV:
            raise PolicyRefusal(f"{key} is set by the portal and cannot be overridden")


def node_specs(spec: RayClusterSpec) -> list[dict[str, Any]]:
    """What the pod starts, node by node: name, role, index (within its role), slot (its place in
    the cluster: its agent's port), its GPUs (count and indices), CPUs, memory, object store."""
    nodes: list[dict[str, Any]] = []
    for group, names in ((spec.head, ["head"]), (spec.workers, node_names(spec)[1:])):
        for index, name in enumerate(names):
            devices = list(group.devices[index]) if group.devices else []
            place = {"name": name, "role": group.role, "index": index, "slot": len(nodes)}
            nodes.append({**place, **_sizes(group, devices)})
    return nodes


def _sizes(group: NodeGroup, devices: list[str]) -> dict[str, Any]:
    """A node's Ray resources: ``--num-cpus`` (its cores, rounded, at least 1), ``--num-gpus`` (its
    devices: a shared GPU counts whole in Ray), ``--memory`` and ``--object-store-memory``, which
    together make its memory."""
    memory = int(group.memory_gb * GIB)
    store = max(MIN_OBJECT_STORE_BYTES, int(memory * OBJECT_STORE_SHARE))
    return {
        "devices": devices,
        "num_gpus": len(devices),
        "num_cpus": max(1, round(group.cpu_cores)),
        "memory_bytes": max(memory - store, 1 << 20),
        "object_store_bytes": store,
    }


def pod_config(
    spec: RayClusterSpec, job_dir: Path, sock: Path, environment: Path, *, grace_s: float, start_timeout_s: float
) -> dict[str, Any]:
    """The pod's configuration (its one argument, as JSON): no secret is in it (the token reaches
    the pod through its environment)."""
    return {
        "state_dir": str(job_dir / STATE_DIR),
        "socket": str(sock),
        "ray": str(environment / "bin" / "ray"),
        "gcs_port": GCS_PORT,
        "dashboard_port": DASHBOARD_PORT,
        "agent_port_base": AGENT_PORT_BASE,
        "max_restarts": MAX_RESTARTS,
        "grace_s": grace_s,
        "start_timeout_s": start_timeout_s,
        "entrypoint": spec.entrypoint,
        "nodes": node_specs(spec),
    }


def ray_job(
    spec: RayClusterSpec, environment: Path, sock: Path, *, grace_s: float = 3.0, start_timeout_s: float = 300.0
) -> JobSpec:
    """The one-replica job that runs the cluster: the pod, with the union of the nodes' GPUs, the sum
    of their CPUs and memory, and the cluster's token in its environment (``RAY_AUTH_MODE=token``,
    ``RAY_AUTH_TOKEN``), after the spec's own variables."""
    check_spec(spec)
    job_dir = Path(os.path.abspath(os.path.join(spec.work_dir, spec.key)))
    config = pod_config(spec, job_dir, sock, environment, grace_s=grace_s, start_timeout_s=start_timeout_s)
    python = environment / "bin" / "python"
    command = f"exec {shlex.quote(str(python))} -I {shlex.quote(str(RAYPOD))} {shlex.quote(json.dumps(config))}"
    devices = sorted({d for group in spec.groups for node in group.devices for d in node}, key=int)
    env = {**spec.env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": spec.auth_token, "RAY_USAGE_STATS_ENABLED": "0"}
    return JobSpec(
        key=spec.key,
        workspace=spec.workspace,
        name=spec.name,
        command=command,
        work_dir=spec.work_dir,
        env=env,
        replicas=1,
        devices=[devices] if devices else [],
        cpu_cores=sum(group.cpu_cores * group.replicas for group in spec.groups),
        memory_gb=sum(group.memory_gb * group.replicas for group in spec.groups),
        max_runtime_s=spec.max_runtime_s,
        artifact_paths=spec.artifact_paths,
        run_as=spec.run_as,
        portal_env=dict(spec.portal_env),
        writable_dir=spec.writable_dir,
        disk=spec.disk,
    )


def find_job(spec: RayClusterSpec) -> JobSpec:
    """What finding a start of the cluster again (``adopt()``) compares: its key, directory and GPUs."""
    devices = sorted({d for group in spec.groups for node in group.devices for d in node}, key=int)
    return JobSpec(spec.key, spec.workspace, spec.name, "", spec.work_dir, devices=[devices] if devices else [])


def check_environment(environment: Path) -> None:
    """``BackendError(permanent=True)`` unless ``environment`` is a Python environment with ``ray``."""
    if not (environment / "bin" / "ray").is_file() or not (environment / "bin" / "python").exists():
        raise BackendError(
            f"the Ray environment {environment} has no bin/ray: install ray[default] there (requirements.txt "
            "pins it), or give the local backend (its ray_env setting) an environment that has it",
            permanent=True,
        )


def read_status(workspace_dir: Path, job_dir: Path) -> dict[str, Any]:
    """The pod's status file, ``{}`` where there is none (yet) or it is not one. It is the workload's
    word (the pod runs as the workload): read without following its links, inside its workspace's
    directory, at most ``MAX_STATUS_BYTES``; nothing the portal enforces rests on it."""
    relative = os.path.relpath(job_dir / STATE_DIR / STATUS_FILE, workspace_dir)
    opened = open_inside(workspace_dir, relative)
    if opened is None:
        return {}
    with opened:
        raw = opened.read(MAX_STATUS_BYTES + 1)
    try:
        status = json.loads(raw) if len(raw) <= MAX_STATUS_BYTES else None
    except ValueError:
        return {}
    if not isinstance(status, dict) or not isinstance(status.get("nodes"), list):
        return {}
    return status


def remove_temp_dirs(workspace_dir: Path, job_dir: Path) -> None:
    """Remove everything in the pod's directory but its status file (the nodes' temporary
    directories, ``.ray/<node>``) once the cluster ended, walking from the workspace's directory
    down without following a link (the workload could have put one anywhere below it)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(workspace_dir, flags)
    except OSError:
        return
    try:
        for part in [*job_dir.relative_to(workspace_dir).parts, STATE_DIR]:
            inner = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = inner
        for name in os.listdir(fd):
            if name == STATUS_FILE:
                continue
            try:
                shutil.rmtree(name, dir_fd=fd)
            except NotADirectoryError:
                os.unlink(name, dir_fd=fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fd)  # a link: removed, never followed
    except OSError:
        return
    finally:
        os.close(fd)


def ready_timeout(spec: RayClusterSpec, base_s: float) -> float:
    """How long a start may take: ``base_s``, and a little more for each worker beyond two (they
    start at once, sharing the machine's CPUs)."""
    return base_s + 10.0 * max(0, spec.workers.replicas - 2)
