"""Ray clusters on the Slurm backend: what the portal writes and submits for one, and what it reads back.

A Ray cluster is one batch job, so that Slurm allocates its nodes as one gang. Where it has workers
it is a heterogeneous job (``sbatch <head's options> : <workers' options>``): component 0 is the
head's node and component 1 the workers' nodes, each component with its own GPUs, CPUs and memory
per node, so that a CPU-only head can lead GPU workers without holding a GPU. A cluster without
workers is a plain one-node job. The batch script exports the cluster's environment and hands over
to the portal's program ``workers/rayslurm.py`` (copied into the Ray environment, which the portal
alone writes, with the module it imports, ``workers/raynode.py``), which starts the head and the
workers as job steps, writes ``status.json`` once every node joined, and runs the entrypoint as the
cluster's Ray job (see its docstring).

Files, all under the cluster's job directory ``<work_dir>/<key>/`` (its ``.portal/`` is 0700, the
workspace account's): ``.portal/ray.sh`` (the batch script: no secret in it, since Slurm keeps a
copy of it that ``scontrol write batch_script`` prints), ``.portal/ray.json`` (the cluster's
shape, for the program), ``.portal/ray-secrets.json`` (0600: ``RAY_AUTH_TOKEN`` and the portal's
variables, read by the program into the environment of the steps), the logs ``.portal/batch.log``
(the cluster's own: its start, the entrypoint's driver output, its end), ``.portal/head.log`` and
``.portal/worker-<i>.log``, and ``.portal/ray/``: ``head.json`` (the head's address and ports),
``status.json``, ``node-<name>.json`` (the Slurm node each Ray node runs on) and each node's Ray
temporary directory (``head/``, ``worker-0/``...: its session and logs), which stays with the job's
directory after the cluster ended, as a job's logs do.

The Ray environment is a virtualenv of ``ray[default]`` (the version the portal pins) and the
portal's SDK, built once under the backend's ``env_root`` with the nodes' Python, as notebook
environments are (workers/backends/pyenv.py): the nodes see it at the same path.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.backends.base import (
    BackendError,
    JobSpec,
    NodeGroup,
    PolicyRefusal,
    RayClusterSpec,
    validate_spec,
)
from workers.backends.files import open_inside
from workers.backends.processes import http_get, search_path

#: The program the batch job runs (workers/rayslurm.py), the module it imports from its own directory
#: (workers/raynode.py), and where both are copied in the Ray environment.
PROGRAM = Path(__file__).resolve().parent.parent / "rayslurm.py"
PROGRAM_FILES = (PROGRAM, PROGRAM.with_name("raynode.py"))
PROGRAM_DIR = ("share", "gpuportal", "ray")
CONFIG_VERSION = 1
#: Under the job's ``.portal/``: the Ray directory (the program's files, each node's temp dir) and the inputs.
RAY_DIR = "ray"
CONFIG_FILE = "ray.json"
SECRETS_FILE = "ray-secrets.json"
SCRIPT_FILE = "ray.sh"
#: Of a node's memory, the share its object store gets (Ray's own default share of a machine's).
OBJECT_STORE_SHARE = 0.3
MIN_OBJECT_STORE_BYTES = 80 << 20  # Ray refuses less than 75 MiB
#: How long the program gives the nodes to join, and each node to stop on SIGTERM before SIGKILL.
NODE_GRACE_S = 10.0
_STATUS_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class RayNode:
    """One node of a Ray cluster, as ``SlurmBackend.ray_nodes()`` reports it: its ``name`` (its custom
    resource: ``head``, ``worker-0``...), the Slurm node it runs on, its ``state`` as Ray's dashboard
    reports it (``ALIVE``, ``DEAD``; ``MISSING``: it never joined or Ray forgot it), its Ray node id
    and address, and its resources (``CPU``, ``GPU``, ``memory``, ``object_store_memory``, its own)."""

    name: str
    slurm_node: str = ""
    state: str = "MISSING"
    node_id: str = ""
    address: str = ""
    resources: dict[str, float] = field(default_factory=dict)


def install_program(env_dir: Path) -> Path:
    """Copy workers/rayslurm.py and the module beside it (``PROGRAM_FILES``) into the Ray environment
    (where the portal alone writes, so that no workspace can change what its cluster's batch job
    runs); return the program's copy's path."""
    target = env_dir.joinpath(*PROGRAM_DIR)
    target.mkdir(parents=True, exist_ok=True)
    for source in PROGRAM_FILES:
        dest, text = target / source.name, source.read_bytes()
        if not dest.is_file() or dest.read_bytes() != text:
            partial = target / f".{source.name}.{os.getpid()}"
            partial.write_bytes(text)
            partial.chmod(0o644)
            os.replace(partial, dest)
    for directory in (target.parent.parent, target.parent, target):
        directory.chmod(0o755)  # readable by every workspace's account, whatever the umask
    return target / PROGRAM.name


def ray_job(spec: RayClusterSpec) -> JobSpec:
    """The batch job of a Ray cluster as far as finding it and checking it go: its key, directory,
    node count (``replicas``: the head and the workers), environment and artifact paths."""
    return JobSpec(
        key=spec.key,
        workspace=spec.workspace,
        name=spec.name,
        command=spec.entrypoint,
        work_dir=spec.work_dir,
        env=dict(spec.env),
        replicas=1 + spec.workers.replicas,
        cpu_cores=spec.head.cpu_cores,
        memory_gb=spec.head.memory_gb,
        max_runtime_s=spec.max_runtime_s,
        artifact_paths=list(spec.artifact_paths),
        run_as=spec.run_as,
        portal_env=dict(spec.portal_env),
        writable_dir=spec.writable_dir,
        disk=spec.disk,
    )


def check_ray_spec(spec: RayClusterSpec) -> JobSpec:
    """``validate_spec()`` of the cluster's job, and what a Ray cluster needs besides: one head, no
    negative worker count, sizes Ray can start a node with, a token, and no variable that would turn
    the cluster's authentication off. Returns the job (``ray_job()``)."""
    job = ray_job(spec)
    validate_spec(job)
    if spec.head.replicas != 1:
        raise BackendError(f"a Ray cluster has one head, not {spec.head.replicas}", permanent=True)
    if spec.workers.replicas < 0:
        raise BackendError(f"a Ray cluster cannot have {spec.workers.replicas} workers", permanent=True)
    if not spec.auth_token:
        raise BackendError("a Ray cluster needs its token (auth_token)", permanent=True)
    for group in spec.groups:
        if group.gpus < 0 or group.cpu_cores <= 0 or group.memory_gb <= 0:
            raise PolicyRefusal(f"the Ray cluster's {group.role} needs CPUs and memory, and no negative GPU count")
    for key in spec.env:
        if key.startswith("RAY_AUTH") or key == "RAY_ADDRESS":
            raise PolicyRefusal(f"{key} is set by the portal for a Ray cluster and cannot be overridden")
    return job


def node_shape(group: NodeGroup) -> dict[str, int]:
    """What Slurm gives each node of ``group`` and what its ``ray start`` declares: whole GPUs and
    CPUs (a fraction is rounded up: Slurm allocates whole ones), and its memory in bytes, of which
    ``OBJECT_STORE_SHARE`` goes to the object store and the rest to tasks and actors."""
    memory = int(group.memory_gb * (1 << 30))
    store = max(MIN_OBJECT_STORE_BYTES, int(memory * OBJECT_STORE_SHARE))
    return {
        "num_gpus": math.ceil(group.gpus),
        "num_cpus": max(1, math.ceil(group.cpu_cores)),
        "memory_mb": max(1, math.ceil(group.memory_gb * 1024)),
        "memory_bytes": max(memory - store, 1 << 20),
        "object_store_bytes": store,
    }


def ray_config(spec: RayClusterSpec, job_dir: Path, *, start_timeout_s: float) -> dict[str, Any]:
    """The program's configuration (``.portal/ray.json``): no secret in it."""
    internal = job_dir / ".portal"
    return {
        "version": CONFIG_VERSION,
        "job_dir": str(job_dir),
        "portal_dir": str(internal),
        "ray_dir": str(internal / RAY_DIR),
        "secrets": str(internal / SECRETS_FILE),
        "head": node_shape(spec.head),
        "workers": {"replicas": spec.workers.replicas, **node_shape(spec.workers)},
        "entrypoint": spec.entrypoint,
        "submission_id": f"portal-{spec.key}"[:120],
        "start_timeout_s": start_timeout_s,
        "grace_s": NODE_GRACE_S,
    }


def ray_secrets(spec: RayClusterSpec) -> dict[str, str]:
    """What reaches the cluster's processes through their environment only: its token and the
    portal's variables (``GPUPORTAL_TOKEN`` among them), set after the spec's own ``env``."""
    return {**spec.portal_env, "RAY_AUTH_TOKEN": spec.auth_token}


def batch_script(spec: RayClusterSpec, job_dir: Path, env_dir: Path, program: Path) -> str:
    """The batch script: the cluster's environment (the spec's ``env``; no secret), then the program."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **spec.env}
    env = {
        **env,
        "PATH": search_path(env_dir, env["PATH"]),
        "HOME": str(job_dir),
        "PYTHONUNBUFFERED": "1",
        "PORTAL_JOB_KEY": spec.key,
        "PORTAL_ARTIFACTS_DIR": str(job_dir / "artifacts"),
        "RAY_AUTH_MODE": "token",
    }
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    config = job_dir / ".portal" / CONFIG_FILE
    python = env_dir / "bin" / "python"
    return f"#!/bin/bash\n{exports}\nexec {shlex.quote(str(python))} -I {shlex.quote(str(program))} batch {config}\n"


def sbatch_options(spec: RayClusterSpec, job_dir: Path, *, partition: str, account: str, owner: str) -> list[str]:
    """sbatch's options for the cluster: the job's own, then one component per node group (the head;
    then ``:`` and the workers, where there are any)."""
    log = str(job_dir / ".portal" / "batch.log")
    options = ["--parsable", "-J", spec.key, "-o", log, "-e", log, f"--chdir={job_dir}", "--export=NONE"]
    options.append(f"--comment={owner}")
    groups = [spec.head] if spec.workers.replicas == 0 else [spec.head, spec.workers]
    for index, group in enumerate(groups):
        shape = node_shape(group)
        if index:
            options.append(":")
        options += ["-p", partition, "-N", str(group.replicas), "--ntasks-per-node=1"]
        options += [f"--cpus-per-task={shape['num_cpus']}", f"--mem={shape['memory_mb']}M"]
        if shape["num_gpus"]:
            options.append(f"--gres=gpu:{shape['num_gpus']}")
        if account:
            options.append(f"--account={account}")
        if spec.max_runtime_s is not None:
            options.append(f"--time={max(1, math.ceil(spec.max_runtime_s / 60))}")
    return options


def ray_files(spec: RayClusterSpec, job_dir: Path, env_dir: Path, program: Path, **config: Any) -> dict[str, str]:
    """The files the portal writes before submitting, by name under ``.portal/``: the batch script,
    the configuration and the secrets."""
    return {
        SCRIPT_FILE: batch_script(spec, job_dir, env_dir, program),
        CONFIG_FILE: json.dumps(ray_config(spec, job_dir, **config), indent=1),
        SECRETS_FILE: json.dumps(ray_secrets(spec)),
    }


def read_ray_file(job_dir: Path, name: str) -> dict[str, Any] | None:
    """A JSON file of the cluster's Ray directory (``status.json``, ``node-head.json``), read
    without following links out of the job's directory; ``None`` if missing or unreadable."""
    opened = open_inside(job_dir, f".portal/{RAY_DIR}/{name}")
    if opened is None:
        return None
    with opened:
        try:
            data = json.loads(opened.read(_STATUS_MAX_BYTES))
        except ValueError:
            return None
    return data if isinstance(data, dict) else None


def read_token(job_dir: Path) -> str:
    """The cluster's token, from its secrets file ('' if it cannot be read)."""
    opened = open_inside(job_dir, f".portal/{SECRETS_FILE}")
    if opened is None:
        return ""
    with opened:
        try:
            secrets = json.loads(opened.read(_STATUS_MAX_BYTES))
        except ValueError:
            return ""
    return str(secrets.get("RAY_AUTH_TOKEN", "")) if isinstance(secrets, dict) else ""


def node_names(workers: int) -> list[str]:
    return ["head", *(f"worker-{i}" for i in range(workers))]


def parse_ray_nodes(answer: Any, names: list[str], slurm_nodes: dict[str, str]) -> list[RayNode]:
    """The cluster's nodes ``names`` from the dashboard's State API answer (``/api/v0/nodes``):
    each node's newest registration (an ``ALIVE`` one first), ``MISSING`` where it has none."""
    data = answer.get("data", {}) if isinstance(answer, dict) else {}
    result = data.get("result", {}) if isinstance(data, dict) else {}
    records = result.get("result", []) if isinstance(result, dict) else []
    found: dict[str, dict[str, Any]] = {}
    for record in records:
        if not isinstance(record, dict):
            continue
        name = str(record.get("node_name", ""))
        if name in names and (name not in found or record.get("state") == "ALIVE"):
            found[name] = record
    nodes = []
    for name in names:
        record = found.get(name, {})
        resources = record.get("resources_total") or {}
        nodes.append(
            RayNode(
                name=name,
                slurm_node=slurm_nodes.get(name, ""),
                state=str(record.get("state", "MISSING")),
                node_id=str(record.get("node_id", "")),
                address=str(record.get("node_ip", "")),
                resources={str(k): float(v) for k, v in resources.items() if isinstance(v, int | float)},
            )
        )
    return nodes


def query_ray_nodes(url: str, token: str, names: list[str], slurm_nodes: dict[str, str]) -> list[RayNode]:
    """Ask the dashboard at ``url`` for the cluster's nodes (``parse_ray_nodes()``). ``BackendError``
    (transient) where it does not answer, or answers anything but 200."""
    try:
        status, body = http_get(
            f"{url}/api/v0/nodes?limit=10000&detail=false", headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        answer = json.loads(body) if status == 200 else None
    except (OSError, ValueError) as exc:
        raise BackendError(f"the Ray cluster's dashboard did not answer: {exc}", permanent=False) from exc
    if answer is None:
        raise BackendError(f"the Ray cluster's dashboard answered {status}", permanent=False)
    return parse_ray_nodes(answer, names, slurm_nodes)


def ray_state(job_state: dict[str, Any], workers: int) -> dict[str, Any]:
    """The backend state of a Ray cluster's batch job: its job's (``job_state``), with its logs
    (replica 0: the cluster's own, 1: the head's, 2 on: each worker's) and what ``ray_nodes()``
    needs, filled in once it is ready (``ready_at``, the dashboard's address and port, the Slurm
    node of each Ray node). No secret: the token stays in the cluster's secrets file."""
    internal = Path(job_state["job_dir"]) / ".portal"
    names = node_names(workers)
    state = dict(job_state)
    state["logs"] = [str(internal / "batch.log"), *(str(internal / f"{name}.log") for name in names)]
    state["ray"] = {"names": names, "slurm_nodes": dict.fromkeys(names, ""), "dashboard_port": 0, "address": ""}
    return state
