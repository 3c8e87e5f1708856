"""What the backends that run processes (local, Slurm) run for an instance and a notebook.

An instance is a holder (``sleep infinity``) with the instance's GPUs; a notebook a Jupyter server
from the profile's environment, at the root of the notebook's own host name behind the proxy,
letting in whom the portal allows (see workers/notebook). Both are then started as one-replica jobs,
with their ``portal_env``.

Every process a backend starts has a Python environment's ``bin`` first on its PATH (the
notebook's, or the SDK's own for jobs and instances: workers/backends/pyenv.py), so that
``python``, ``pip`` and the ``gpuportal`` CLI are that environment's."""

from __future__ import annotations

import os
import shlex
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from workers.backends.base import BackendError, InstanceSpec, JobSpec, NotebookSpec, Spec
from workers.backends.pyenv import landing_path

# Where portal_identity.py lives: put on the server's PYTHONPATH.
IDENTITY_MODULES = Path(__file__).resolve().parent.parent / "notebook"


def server_command(env_dir: Path, spec: NotebookSpec, *, ip: str, port: str) -> str:
    """The shell command that runs the server. ``ip`` and ``port`` are shell words, so that a
    batch script can expand them on the node it lands on (``$MASTER_PORT``)."""
    args = [
        shlex.quote(f"{env_dir}/bin/python"),
        "-m",
        "jupyter_server",
        f"--ip={ip}",
        f"--port={port}",
        # The portal routes to this port: taken by something else, fail rather than move.
        "--ServerApp.port_retries=0",
        "--no-browser",
        shlex.quote(f"--ServerApp.base_url={spec.base_url}"),
        shlex.quote(f"--ServerApp.root_dir={Path(spec.work_dir).resolve()}"),
        # Its root opens JupyterLab, not the bare "A Jupyter Server is running" page.
        shlex.quote(f"--ServerApp.default_url={landing_path(env_dir)}"),
        # No "get notified about Jupyter news?" prompt: the server fetches nothing from outside.
        "--LabApp.news_url=None",
        # Bound to the node behind the portal's proxy, which keeps the browser's Host header.
        "--ServerApp.allow_remote_access=True",
        # Every request is the portal's to allow (workers/notebook): the server's token, or the
        # session its sign-in handoff sets; the portal's URL for this notebook is no secret.
        "--ServerApp.identity_provider_class=portal_identity.PortalIdentityProvider",
        shlex.quote(f"--PortalIdentityProvider.portal_url={spec.auth_url}"),
    ]
    if os.geteuid() == 0:  # containers and CI often run as root; Jupyter refuses that by default
        args.append("--allow-root")
    # Kernels talk to the server over Unix sockets in a private directory of their own (0700,
    # named at random), not over loopback ports: no other process on the node can reach them, and
    # no port another server picks can turn out to be a kernel's.
    runtime = 'export JUPYTER_RUNTIME_DIR="$(mktemp -d /tmp/jupyter-XXXXXXXX)" && '
    return runtime + "exec " + " ".join([*args, "--KernelManager.transport=ipc"])


def instance_job(spec: InstanceSpec) -> JobSpec:
    """The job that holds an instance's GPUs (and its cgroup or allocation) until it is stopped."""
    return JobSpec(
        key=spec.key,
        workspace=spec.workspace,
        name=spec.name,
        command="exec sleep infinity",
        work_dir=spec.work_dir,
        devices=[spec.devices],
        cpu_cores=spec.cpu_cores,
        memory_gb=spec.memory_gb,
        run_as=spec.run_as,
        portal_env=dict(spec.portal_env),
    )


def notebook_job(spec: NotebookSpec, env_dir: Path, *, ip: str) -> JobSpec:
    """The job that runs a notebook's server on ``$MASTER_PORT``, with its instance's GPUs."""
    return JobSpec(
        key=spec.key,
        workspace=spec.workspace,
        name=spec.name,
        command=server_command(env_dir, spec, ip=ip, port="$MASTER_PORT"),
        work_dir=spec.work_dir,
        env={"JUPYTER_TOKEN": spec.token, "PYTHONPATH": str(IDENTITY_MODULES)},
        devices=[spec.devices],
        cpu_cores=spec.cpu_cores,
        memory_gb=spec.memory_gb,
        run_as=spec.run_as,
        portal_env=dict(spec.portal_env),
    )


def kind_and_job(spec: Spec) -> tuple[str, JobSpec]:
    """What a spec runs as, as far as finding it again goes (``adopt()``): its kind (``job``,
    ``instance``, ``notebook``) and the job's key, work directory, replicas and devices. A notebook's
    command is left out: it names the notebook's environment, which finding the server needs not."""
    if isinstance(spec, InstanceSpec):
        return "instance", instance_job(spec)
    if isinstance(spec, NotebookSpec):
        server = JobSpec(spec.key, spec.workspace, spec.name, "", spec.work_dir, devices=[spec.devices])
        return "notebook", server
    return "job", spec


def search_path(environment: Path | None, path: str) -> str:
    """``path`` (a PATH value) with the environment's ``bin`` first, where there is one."""
    return f"{environment}/bin:{path}" if environment is not None else path


def wait_answering(url: str, *, alive: Callable[[], bool], log_tail: Callable[[], str], timeout_s: float) -> None:
    """Return once ``url`` (the server's unauthenticated ``api`` endpoint) answers 200.

    ``BackendError`` (transient) if the server exits first, with its last log lines, or does not
    answer within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise BackendError(f"the notebook server exited: {log_tail()}", permanent=False)
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise BackendError(f"the notebook server did not answer within {timeout_s:g}s", permanent=False)
