"""The Slurm backend for jobs: one batch job per workload, one Slurm node per replica.

Everything goes through Slurm's command-line tools (``sbatch``, ``squeue``, ``sacct``,
``scancel``, ``scontrol``), each run by :func:`run_command`: no shell, a timeout, and errors
turned into ``BackendError`` / ``PolicyRefusal`` by what Slurm said.

A job is a batch script under ``<work_dir>/<key>/.portal/`` that exports the spec's environment
and runs ``srun --kill-on-bad-exit=1 bash replica.sh``: one task per node, so task ``i`` is
replica ``i`` (``RANK=$SLURM_PROCID``). Each replica's output goes to ``replica-<i>.log``
(``srun --output`` with ``%t``); the batch shell's own output (srun's errors, for example) goes to
``batch.log``. The job is submitted with ``--export=NONE``: the worker's environment never
reaches it. (Slurm then loads the submitting user's login environment, as ``--export=NONE``
implies ``--get-user-env``; PATH and HOME are set explicitly by the script.)

``MASTER_ADDR`` is the first host of the allocation (a Slurm node name, as ``scontrol show
hostnames`` prints it) and ``MASTER_PORT`` is derived from the job id (:func:`master_port`).

A Ray cluster is one batch job too, heterogeneous where it has workers (the head's node, then the
workers' nodes), running the portal's program ``workers/rayslurm.py``: see workers/backends/slurm_ray.py.
Slurm's commands and the parsing of what they print live in workers/backends/slurm_commands.py.

An inference endpoint's replica is a one-node job running its model server on its node's address and
``MASTER_PORT``, behind the replica's API key, which its task reads from a file of its own
(``SERVER_ENV_FILE``), never from the batch script: see ``start_inference``.

A job is named after its workload's key and runs in its own directory, so that ``adopt()`` finds the
job of a start that was never recorded in ``squeue`` and ``sacct``; once a start is recorded (its state
comes back through ``load_state()``) or given up (``clear_state()``), its job id is written to
``.portal/settled``, and a job the portal cancelled itself is ``CANCELLED by`` its uid: neither is
ever adopted.

A reconcile pass polls every running workload of a cluster: within ``polling(states)``, ``poll()``
answers from one ``squeue`` of all their jobs and one ``sacct`` of those it no longer lists as live,
made on entry, instead of a squeue (and a sacct) per job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import shlex
import shutil
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from workers.backends import servers
from workers.backends.base import (
    STATE_VERSION,
    UNKNOWN_EXIT_CODE,
    BackendError,
    Endpoint,
    GpuInfo,
    InferenceSpec,
    InstanceSpec,
    JobSpec,
    Keep,
    NodeInfo,
    NotebookSpec,
    PolicyRefusal,
    RayClusterSpec,
    RunAs,
    Spec,
    Status,
    validate_spec,
)
from workers.backends.files import FileOutputs, check_reachable, dirs_between, open_inside, prepare_dir, write_new_file
from workers.backends.processes import (
    http_get,
    install_identity,
    instance_job,
    kind_and_job,
    notebook_job,
    search_path,
    wait_answering,
)
from workers.backends.pyenv import ensure_env, ensure_ray_env, ensure_sdk_env, ensure_serve_env
from workers.backends.slurm_commands import (
    COMMAND_TIMEOUT_S,
    LIVE_STATES,
    as_user,
    leader_id,
    master_port,
    node_gpus,
    node_info,
    node_partitions,
    parse_exit,
    parse_scontrol_nodes,
    run_command,
    slurm_time,
    user_env,
)
from workers.backends.slurm_commands import node_state as node_state  # re-exported: the node states' one reading
from workers.backends.slurm_ray import (
    RAY_DIR,
    SCRIPT_FILE,
    RayNode,
    check_ray_spec,
    install_program,
    query_ray_nodes,
    ray_files,
    ray_job,
    ray_state,
    read_ray_file,
    read_token,
    sbatch_options,
)

#: How far back ``adopt()`` asks sacct for a job of a start that was never recorded.
ADOPT_WINDOW = "now-30days"
#: How much earlier than the portal's clock said a job was submitted sacct is asked about it from. A
#: job id names another job once Slurm numbers from its first id again (its saved state was lost):
#: sacct answers for the latest job with the id, an older one until the job's own record reaches it.
SUBMIT_SLACK_S = 300
#: In a job's ``.portal/``: the id of its job that the portal recorded or gave up (``adopt()`` skips it).
SETTLED_FILE = "settled"
#: In an inference replica's ``.portal/``: its server's settings and API key, as shell assignments.
SERVER_ENV_FILE = "server.env"
#: What the model servers (both run by uvicorn) log once they listen: ``<it> http://<host>:<port> (...)``.
LISTENING_LINE = "Uvicorn running on"
# (Slurm account, user) associations known to exist, so that sacctmgr is asked once per process.
_KNOWN_ASSOCIATIONS: set[tuple[str, str]] = set()
#: Within ``SlurmBackend.polling``: by the commands asked (squeue's and sacct's paths), what they said
#: of each job id: ``("live", state)`` while squeue lists it live, else ``("ended", State, ExitCode)``
#: as sacct recorded it.
_POLLED: ContextVar[dict[tuple[str, str], dict[str, tuple[str, ...]]] | None] = ContextVar("slurm_polled", default=None)

logger = logging.getLogger(__name__)


class SlurmBackend(FileOutputs):
    """Runs a job as one Slurm batch job, a replica per node, on partition ``partition``.

    ``start_timeout_s`` bounds the wait from submission to RUNNING (a job still pending then is
    cancelled and the start fails, transient). The ``*_path`` settings name the Slurm commands.
    ``spec.image`` is ignored. GPU requests are counts (``--gres=gpu:N``, N = replica 0's
    devices): Slurm picks the indices and sets ``CUDA_VISIBLE_DEVICES``. ``ray_start_timeout_s``
    bounds the wait from a Ray cluster's start on its nodes until every node joined.
    """

    name = "slurm"

    def __init__(
        self,
        *,
        partition: str = "gpu",
        start_timeout_s: float = 30.0,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        sbatch_path: str = "sbatch",
        squeue_path: str = "squeue",
        sacct_path: str = "sacct",
        scancel_path: str = "scancel",
        scontrol_path: str = "scontrol",
        sacctmgr_path: str = "sacctmgr",
        accounts: bool = True,
        python: str = "",
        sacct_retries: int = 12,
        sacct_retry_delay_s: float = 0.25,
        env_root: str = "",
        notebook_start_timeout_s: float = 60.0,
        ray_start_timeout_s: float = 180.0,
        owner: str = "gpuportal",
    ) -> None:
        self.partition = partition
        self.start_timeout_s = start_timeout_s
        self.command_timeout_s = command_timeout_s
        self.sbatch_path = sbatch_path
        self.squeue_path = squeue_path
        self.sacct_path = sacct_path
        self.scancel_path = scancel_path
        self.scontrol_path = scontrol_path
        self.sacctmgr_path = sacctmgr_path
        self.accounts = accounts
        self.sacct_retries = sacct_retries
        self.sacct_retry_delay_s = sacct_retry_delay_s
        self.env_root = env_root
        self.owner = owner
        self.notebook_start_timeout_s = notebook_start_timeout_s
        self.ray_start_timeout_s = ray_start_timeout_s
        self.python = python or sys.executable
        self._state: dict[str, Any] = {}
        self._environment: Path | None = None  # its bin first on the job's PATH

    def _run(self, argv: list[str]) -> str:
        return run_command(argv, self.command_timeout_s)

    # -- state ---------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """Return the job id, key, job directory, log paths, nodes and (once ended) the final status."""
        copied: dict[str, Any] = json.loads(json.dumps(self._state))
        return copied

    def load_state(self, state: dict[str, Any]) -> None:
        """Reattach to a job by its Slurm job id. A state that comes back was recorded: its job is
        marked settled, and ``adopt()`` never takes it over (a later attempt starts afresh)."""
        if state and (state.get("version") != STATE_VERSION or not str(state.get("job_id", "")).isdigit()):
            raise BackendError(f"unreadable slurm backend state (version {state.get('version')!r})", permanent=True)
        self._state = json.loads(json.dumps(state))
        self._settle()

    def clear_state(self) -> None:
        """Forget the job, marked settled (``adopt()`` never takes it over); its directory (logs,
        artifacts) stays on disk."""
        self._settle()
        self._state = {}

    def _settle(self) -> None:
        """Write the job's id to its ``.portal/settled``, once. Where the directory cannot be reached
        (a web process on another host), the job is merely not marked: a start that takes a stale
        claim over would find it only if no later job ran under the key."""
        job_dir, job_id = self._state.get("job_dir"), str(self._state.get("job_id", ""))
        if not job_dir or not job_id or _settled_id(Path(job_dir)) == job_id:
            return
        internal = Path(job_dir) / ".portal"
        with contextlib.suppress(OSError, BackendError):
            if stat.S_ISDIR(os.lstat(internal).st_mode):  # never through a link the workload planted
                write_new_file(internal / SETTLED_FILE, job_id, None)

    # -- start ---------------------------------------------------------------------------------

    def start_job(self, spec: JobSpec) -> Endpoint:
        """Submit the batch job and wait until Slurm runs it (or it already ended).

        ``PolicyRefusal`` for bad env keys, artifact paths, or a request the cluster can never
        satisfy; ``BackendError`` transient when the job did not start within
        ``start_timeout_s`` (it is cancelled first) or a command failed.
        """
        return self._launch(spec, self._sdk_environment())

    def _sdk_environment(self) -> Path | None:
        """The SDK's environment for jobs and instances, built once under ``env_root`` with the
        nodes' Python. Where the nodes cannot reach it, its ``bin`` on PATH is merely skipped."""
        return ensure_sdk_env(Path(self.env_root), self.python, steps=self.steps) if self.env_root else None

    def _launch(
        self, spec: JobSpec, environment: Path | None, kind: str = "job", files: dict[str, str] | None = None
    ) -> Endpoint:
        """Submit ``spec`` as a batch job and wait until it runs; ``files``: more files for its
        ``.portal/`` (name: text), the account's alone (0600), written before it is submitted."""
        if self._state:
            if self._state.get("key") == spec.key and "final" not in self._state and self._live_state() is not None:
                return self._endpoint()
            raise BackendError("this backend already ran a job; clear_state() first", permanent=True)
        validate_spec(spec)
        self._environment = environment
        run_as = spec.run_as if os.geteuid() == 0 else None
        account = self.ensure_account(spec.workspace, run_as)
        job_dir = Path(os.path.abspath(os.path.join(spec.work_dir, spec.key)))
        internal = job_dir / ".portal"
        work_dir = Path(os.path.abspath(spec.work_dir))
        self._prepare_dirs(spec.workspace, work_dir, [job_dir, internal, job_dir / "artifacts"], run_as)
        for stale in internal.glob("*.log"):
            stale.unlink()
        script = internal / "job.sh"
        write_new_file(script, self._script(spec, job_dir), run_as, mode=0o700)
        write_new_file(internal / "replica.sh", _replica_script(spec.command), run_as, mode=0o700)
        for name, text in (files or {}).items():
            write_new_file(internal / name, text, run_as, mode=0o600)
        gpus = len(spec.devices[0]) if spec.devices else 0
        argv = [
            *as_user(run_as),
            self.sbatch_path,
            "--parsable",
            "-J",
            spec.key,
            "-p",
            self.partition,
            "-N",
            str(spec.replicas),
            "--ntasks-per-node=1",
            f"--cpus-per-task={max(1, math.ceil(spec.cpu_cores))}",
            f"--mem={max(1, math.ceil(spec.memory_gb * 1024))}M",
            "-o",
            str(internal / "batch.log"),
            "-e",
            str(internal / "batch.log"),
            f"--chdir={job_dir}",
            "--export=NONE",
            f"--comment={self.owner}",
        ]
        if account:
            argv.append(f"--account={account}")
        if gpus:
            argv.append(f"--gres=gpu:{gpus}")
        if spec.max_runtime_s is not None:
            argv.append(f"--time={max(1, math.ceil(spec.max_runtime_s / 60))}")
        if spec.reservation:  # a GPR's nodes: reserved for the workspace's account (slurm_reservations.py)
            argv.append(f"--reservation={spec.reservation}")
        argv.append(str(script))
        submitted_at = time.time()
        # Submitted as the workspace's account: with none of the worker's environment, which holds
        # the portal's secrets and which that account's other processes could read meanwhile.
        out = run_command(argv, self.command_timeout_s, env=user_env() if run_as else None).strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise BackendError(f"sbatch printed no job id: {out!r}", permanent=False)
        self._state = _job_state(spec, job_id, kind, run_as, account, submitted_at)
        self._wait_running()
        return self._endpoint()

    def adopt(self, spec: Spec) -> Endpoint | None:
        """Take over the newest batch job named ``spec.key`` that ran in the spec's job directory, as
        squeue (ended jobs too, for ``MinJobAge``) and sacct (over ``ADOPT_WINDOW``) list it, unless it
        is settled or the portal cancelled it (see the module's docstring). A job of another node count
        than the spec's replicas is cancelled and ``None`` returned. A pending job is waited for as
        ``start()`` waits, and so is a notebook's server; an ended job polls its exit code from sacct."""
        if self._state:
            raise BackendError("this backend already holds a workload; clear_state() first", permanent=True)
        kind, job = ("ray", ray_job(spec)) if isinstance(spec, RayClusterSpec) else kind_and_job(spec)
        validate_spec(job)
        job_dir = Path(os.path.abspath(os.path.join(job.work_dir, job.key)))
        found = self._jobs_in(job.key, job_dir)
        if not found or max(found, key=int) == _settled_id(job_dir):
            return None
        job_id = max(found, key=int)
        nodelist, node_count, submitted_at = found[job_id]
        run_as = job.run_as if os.geteuid() == 0 else None
        account = self._account_name(job.workspace, run_as)
        if isinstance(spec, RayClusterSpec):
            self._state = ray_state(
                _job_state(job, job_id, "ray", run_as, account, submitted_at), spec.workers.replicas
            )
        else:
            self._state = _job_state(job, job_id, kind, run_as, account, submitted_at)
        if node_count != job.replicas:
            self.stop(0.0)  # not this spec's job: the start that follows runs alone
            self.clear_state()
            return None
        live = self._live_state() is not None
        if not live and self._sacct_final()[0] == f"CANCELLED by {os.geteuid()}":
            self._state = {}  # stopped by the portal (a failed start, the orphan sweep): not to be revived
            return None
        if isinstance(spec, RayClusterSpec):
            return self._ray_ready(wait=live)
        if live:
            self._wait_running()
        elif nodelist and not nodelist.startswith("None"):  # sacct's "None assigned": it never ran
            self._state["nodes"] = self._hostnames(nodelist)
        if isinstance(spec, NotebookSpec):
            return self._notebook_answering(spec.base_url, wait=live)
        if isinstance(spec, InferenceSpec):
            return self._server_answering(spec, wait=live)
        return self._endpoint()

    def _jobs_in(self, key: str, job_dir: Path) -> dict[str, tuple[str, int, float | None]]:
        """The batch jobs named ``key`` that ran in ``job_dir``, by id: their node list, node count
        and submit time, as sacct recorded them or, where it has not yet, as squeue lists them."""
        fields = [
            [self.squeue_path, "-h", "-t", "all", "-n", key, "-o", "%i|%Z|%T|%N|%D|%V"],
            [self.sacct_path, "-a", "-X", "-n", "-P", f"--name={key}", "-S", ADOPT_WINDOW]
            + ["-o", "JobID,WorkDir,State,NodeList,NNodes,Submit"],
        ]
        found: dict[str, tuple[str, int, float | None]] = {}
        for argv in fields:  # sacct's word last: squeue lists no nodes once a job has ended
            listed: dict[str, tuple[str, int, float | None]] = {}
            for line in self._run(argv).splitlines():
                parts = line.strip().split("|")
                job_id = leader_id(parts[0]) if len(parts) == 6 else ""
                if job_id and parts[1] == str(job_dir):
                    _, _, _, nodelist, count, submit = parts
                    # A heterogeneous job (a Ray cluster) is listed once per component: ``<id>+<i>``.
                    nodes, counted, _ = listed.get(job_id, ("", 0, None))
                    nodelist = f"{nodes},{nodelist}" if nodes and not nodelist.startswith("None") else nodelist or nodes
                    listed[job_id] = (nodelist, counted + (int(count) if count.isdigit() else 0), slurm_time(submit))
            found.update(listed)
        return found

    def _prepare_dirs(self, workspace: str, work_dir: Path, dirs: list[Path], run_as: RunAs | None) -> None:
        """The workspace's directories, handed to its account (0700): its jobs' files are its own,
        and no other workspace's account can read them. Compute nodes see them at the same path."""
        workspace_dir = Path(os.path.abspath(os.path.join(self.owner, workspace)))
        top = workspace_dir if self.owner and work_dir.is_relative_to(workspace_dir) else work_dir
        if run_as is not None:
            check_reachable(top, "the work directory")
        prepare_dir(top, run_as)
        for directory in [*dirs_between(top, work_dir), *dirs]:
            prepare_dir(directory, run_as)

    def _account_name(self, workspace: str, run_as: RunAs | None) -> str:
        """The workspace's Slurm account; empty where jobs are not submitted as its Unix account."""
        return workspace[:63] if run_as is not None and self.accounts else ""

    def ensure_account(self, workspace: str, run_as: RunAs | None) -> str:
        """The workspace's Slurm account, with the workspace's Unix account as its user, created
        with ``sacctmgr`` on first use so that Slurm's accounting and fair share see each tenant.
        Empty where jobs are not submitted as the workspace's account (the portal is not root)."""
        account = self._account_name(workspace, run_as)
        if not account or run_as is None:
            return ""
        if (account, run_as.user) in _KNOWN_ASSOCIATIONS:
            return account
        show = [self.sacctmgr_path, "-n", "-P", "show", "assoc", f"account={account}", f"user={run_as.user}"]
        if not self._run([*show, "format=account"]).strip():
            self._sacctmgr_add(
                ["account", account, f"Description=GPU Portal workspace {workspace}", "Organization=gpuportal"]
            )
            self._sacctmgr_add(["user", run_as.user, f"account={account}"])
        _KNOWN_ASSOCIATIONS.add((account, run_as.user))
        return account

    def _sacctmgr_add(self, args: list[str]) -> None:
        try:
            self._run([self.sacctmgr_path, "-i", "add", *args])
        except BackendError as exc:
            if "Nothing new added" not in exc.message and "already exists" not in exc.message:
                raise

    def start_instance(self, spec: InstanceSpec) -> Endpoint:
        """An instance is an allocation: a one-node batch job holding its GPUs until deleted, in the
        spec's reservation where it names one."""
        job = dataclasses.replace(instance_job(spec), reservation=spec.reservation)
        return self._launch(job, self._sdk_environment(), kind="instance")

    def start_notebook(self, spec: NotebookSpec) -> Endpoint:
        """A batch job running a Jupyter server on its node's address; returns once it answers.

        The environment is built where the worker runs, under ``env_root``, which compute nodes
        must see at the same path (a shared filesystem), as they see the job directories."""
        if not self.env_root:
            raise BackendError("the slurm backend has no notebook environment directory", permanent=True)
        running = self._state and self._state.get("key") == spec.key and "final" not in self._state
        if running and self._live_state() is not None:
            return self._notebook_endpoint()
        env = ensure_env(spec.python_packages, Path(self.env_root), self.python, steps=self.steps)
        server = notebook_job(spec, env, ip=_NODE_ADDR)
        if spec.run_as is not None and os.geteuid() == 0:
            # The server runs as the workspace's account: it must reach the environment (and the
            # interpreter behind it), and the copy of the portal's identity module kept there, in
            # a directory no workspace can write.
            check_reachable(env, "the notebook environment")
            check_reachable(os.path.realpath(env / "bin" / "python"), "the notebook environment's Python")
            server.env["PYTHONPATH"] = str(install_identity(env))
        self._launch(server, env, kind="notebook")
        return self._notebook_answering(spec.base_url)

    def _notebook_answering(self, base_url: str, *, wait: bool = True) -> Endpoint:
        """The server's endpoint on its node, once it answers (with ``wait``); cancelled, and
        ``BackendError``, if it does not."""
        self._state["node_addr"] = self._node_addr(self._state["nodes"][0]) if self._state.get("nodes") else ""
        endpoint = self._notebook_endpoint()
        if not wait:
            return endpoint
        try:
            wait_answering(
                f"{endpoint.url}{base_url}api",
                alive=lambda: self._live_state() is not None,
                log_tail=lambda: " | ".join(self.logs(0)[0].decode(errors="replace").strip().splitlines()[-5:]),
                timeout_s=self.notebook_start_timeout_s,
            )
        except BackendError:
            self.stop(0.0)
            raise
        return endpoint

    def start_inference(self, spec: InferenceSpec) -> Endpoint:
        """An inference replica: a one-node batch job of the workspace's account, with the replica's
        CPUs, memory and GPUs (``--gres``), running its model server (workers/backends/servers.py)
        from the server's environment, built under ``env_root`` with the nodes' Python. The server
        listens on its node's address and ``$MASTER_PORT``, as a notebook's does (the proxy runs on
        another machine), where any process of the node can connect: it refuses every request
        without the replica's API key, which reaches it through a file of the job's ``.portal/``
        (0600, the workspace's account's alone) and its environment: never a command line, nor the
        batch script (which Slurm keeps, and shows its administrators). Returns once the
        server answers its health path with the key; cancelled, and ``BackendError`` with its last
        log lines, if it does not (permanent where it exited first: it would again)."""
        running = self._state and self._state.get("key") == spec.key and "final" not in self._state
        if running and self._live_state() is not None:
            return self._notebook_endpoint()
        if not self.env_root:
            raise BackendError("the slurm backend has no environment directory for model servers", permanent=True)
        if not spec.api_key:
            raise BackendError("a model server on Slurm needs an API key: its node's jobs reach it", permanent=True)
        env = ensure_serve_env(spec.server, Path(self.env_root), self.python, steps=self.steps)
        if spec.run_as is not None and os.geteuid() == 0:
            check_reachable(env, "the model server's environment")
            check_reachable(os.path.realpath(env / "bin" / "python"), "the model server environment's Python")
        job, server_env = _inference_job(spec, env)
        self._launch(job, env, kind="inference", files={SERVER_ENV_FILE: server_env})
        return self._server_answering(spec)

    def _server_answering(self, spec: InferenceSpec, *, wait: bool = True) -> Endpoint:
        """The replica's endpoint on its node, once its server answers its health path with the key
        (with ``wait``); cancelled, and ``BackendError`` with the server's last log lines, if not.

        The key is sent only once the server's own log (in the job's ``.portal/``, which no other
        tenant can write) says that it listens on the port: until then, what answers there may be
        another tenant's process that took the port first, and the server then fails to bind."""
        self._state["node_addr"] = self._node_addr(self._state["nodes"][0]) if self._state.get("nodes") else ""
        endpoint = self._notebook_endpoint()
        if not wait:
            return endpoint
        health = f"{endpoint.url}{servers.SERVERS[spec.server].health_path}"
        auth = {"Authorization": f"Bearer {spec.api_key}"}
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        listening, seen, offset = f"{LISTENING_LINE} http://{host}:{endpoint.port} ".encode(), b"", 0
        deadline = time.monotonic() + spec.start_timeout_s
        while True:
            if listening not in seen:
                chunk, offset = self.logs(0, offset)
                seen = seen[-len(listening) :] + chunk
            if listening in seen:
                with contextlib.suppress(OSError):
                    if http_get(health, headers=auth, timeout=2)[0] == 200:
                        return endpoint
            if self._live_state() is None:
                problem, exited = "the server exited before it answered", True
                break
            if time.monotonic() > deadline:
                problem, exited = f"the server did not answer within {spec.start_timeout_s:g}s", False
                break
            time.sleep(0.2)
        self.stop(0.0)
        # A server that exits at start (a model it cannot load, a bad argument) would again.
        raise BackendError(f"{problem}: {self._log_tail(8)}", permanent=exited)

    def _log_tail(self, count: int) -> str:
        """The last ``count`` lines of replica 0's log, on one line."""
        with contextlib.suppress(OSError):
            size = os.stat(self._state["logs"][0]).st_size
            text = self.logs(0, max(0, size - 65536))[0].decode(errors="replace")
            return " | ".join(text.strip().splitlines()[-count:]) or "(no output)"
        return "(no output)"

    def _notebook_endpoint(self) -> Endpoint:
        addr, port = self._state.get("node_addr") or "127.0.0.1", master_port(self._state["job_id"])
        return Endpoint(addr, port, url=f"http://{addr}:{port}")

    def _node_addr(self, node: str) -> str:
        out = self._run([self.scontrol_path, "show", "node", node])
        match = re.search(r"NodeAddr=(\S+)", out)
        return match.group(1) if match else node

    # -- Ray clusters (workers/backends/slurm_ray.py) -------------------------------------------

    def start_ray_cluster(self, spec: RayClusterSpec) -> Endpoint:
        """Submit the cluster's batch job (a heterogeneous job: the head's node, then the workers'
        nodes) and return once every node joined, with ``url`` the head's dashboard (Jobs API
        included, behind the cluster's token). The Ray environment is built first, under
        ``env_root``, if it is not there yet.

        ``PolicyRefusal`` for a spec the user must fix (env keys, sizes no node has);
        ``BackendError`` transient when the job did not start within ``start_timeout_s`` or the
        nodes did not join within ``ray_start_timeout_s`` (the job is cancelled), or it ended first."""
        if self._state:
            if self._state.get("key") == spec.key and "final" not in self._state and self._live_state() is not None:
                return self._ray_ready()
            raise BackendError("this backend already ran a job; clear_state() first", permanent=True)
        job = check_ray_spec(spec)
        if not self.env_root:
            raise BackendError("the slurm backend has no environment directory for Ray", permanent=True)
        env = ensure_ray_env(Path(self.env_root), self.python, steps=self.steps)
        program = install_program(env)
        run_as = spec.run_as if os.geteuid() == 0 else None
        if run_as is not None:
            check_reachable(env, "the Ray environment")
            check_reachable(os.path.realpath(env / "bin" / "python"), "the Ray environment's Python")
        account = self.ensure_account(spec.workspace, run_as)
        job_dir = Path(os.path.abspath(os.path.join(spec.work_dir, spec.key)))
        internal = job_dir / ".portal"
        self._prepare_dirs(spec.workspace, Path(os.path.abspath(spec.work_dir)), [job_dir, internal], run_as)
        prepare_dir(job_dir / "artifacts", run_as)
        for stale in internal.glob("*.log"):
            stale.unlink()
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(internal / RAY_DIR)  # a previous start's (never through a link: rmtree refuses one)
        prepare_dir(internal / RAY_DIR, run_as)
        for name, text in ray_files(spec, job_dir, env, program, start_timeout_s=self.ray_start_timeout_s).items():
            write_new_file(internal / name, text, run_as, mode=0o700 if name == SCRIPT_FILE else 0o600)
        options = sbatch_options(spec, job_dir, partition=self.partition, account=account, owner=self.owner)
        argv = [*as_user(run_as), self.sbatch_path, *options, str(internal / SCRIPT_FILE)]
        submitted_at = time.time()
        out = run_command(argv, self.command_timeout_s, env=user_env() if run_as else None).strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise BackendError(f"sbatch printed no job id: {out!r}", permanent=False)
        self._state = ray_state(_job_state(job, job_id, "ray", run_as, account, submitted_at), spec.workers.replicas)
        return self._ray_ready()

    def _ray_ready(self, *, wait: bool = True) -> Endpoint:
        """The cluster's dashboard once its ``status.json`` says ready (of this job), recorded in the
        state; cancelled, and ``BackendError`` (transient), if it fails, ends or takes too long first.
        Without ``wait`` (a cluster that ended), what the file says now (no ``url`` if never ready)."""
        job_dir, job_id = Path(self._state["job_dir"]), self._state["job_id"]
        pending_until = time.monotonic() + self.start_timeout_s
        ready_until = pending_until + self.ray_start_timeout_s + 30.0  # the program gives up first
        while True:
            status = read_ray_file(job_dir, "status.json") or {}
            mine = str(status.get("job_id", "")) == job_id
            if mine and status.get("ready_at"):
                return self._record_ray_ready(status)
            if not wait:
                return self._ray_endpoint()
            live = self._squeue()
            if live is None or (mine and status.get("phase") == "failed"):
                reason = str(status.get("reason") or "") if mine else ""
                if live is not None:
                    self.stop(0.0)
                raise BackendError(
                    f"the Ray cluster (Slurm job {job_id}) {'failed' if reason else 'ended'} before every node "
                    f"joined{': ' + reason if reason else ''}; {self._batch_tail()}",
                    permanent=False,
                )
            if live[0] in ("PENDING", "CONFIGURING") and time.monotonic() > pending_until:
                self._cancel_and_wait(signal_first=False, grace_s=0.0)
                self._state["final"] = {"exit_code": UNKNOWN_EXIT_CODE, "message": "did not start in time"}
                raise BackendError(
                    f"Slurm job {job_id} did not start within {self.start_timeout_s:g}s (reason: {live[2]}); "
                    "it was cancelled",
                    permanent=False,
                )
            if time.monotonic() > ready_until:
                self.stop(0.0)
                raise BackendError(
                    f"the Ray cluster's nodes did not join in time; {self._batch_tail()}", permanent=False
                )
            time.sleep(0.2)

    def _record_ray_ready(self, status: dict[str, Any]) -> Endpoint:
        """Record where the head's dashboard is and which Slurm node runs each Ray node. The address
        is the head's Slurm node's, as Slurm reports it; the port, the one its program published."""
        ray: dict[str, Any] = self._state["ray"]
        job_dir = Path(self._state["job_dir"])
        head = status.get("head")
        port = head.get("dashboard_port") if isinstance(head, dict) else None
        if not isinstance(port, int) or not 1024 <= port <= 65535:
            raise BackendError(f"the Ray cluster published no dashboard port: {head!r}", permanent=False)
        for name in ray["names"]:
            node = read_ray_file(job_dir, f"node-{name}.json") or {}
            ray["slurm_nodes"][name] = str(node.get("slurm_node", ""))
        self._state["nodes"] = [ray["slurm_nodes"][name] for name in ray["names"]]
        ray["dashboard_port"] = port
        ray["address"] = self._node_addr(ray["slurm_nodes"]["head"]) if ray["slurm_nodes"]["head"] else "127.0.0.1"
        ray["ready_at"] = status.get("ready_at")
        self._state.setdefault("running_at", time.time())
        return self._ray_endpoint()

    def _ray_endpoint(self) -> Endpoint:
        ray = self._state.get("ray") or {}
        if not ray.get("dashboard_port"):
            return Endpoint(host="", port=0)
        address, port = ray["address"], int(ray["dashboard_port"])
        return Endpoint(host=address, port=port, url=f"http://{address}:{port}")

    def _batch_tail(self) -> str:
        lines = self.logs(0)[0].decode(errors="replace").strip().splitlines()[-5:]
        return "its log ends: " + (" | ".join(lines) or "(empty)")

    def ray_nodes(self, token: str = "") -> list[RayNode]:
        """Each node of the running Ray cluster (the head first, then ``worker-0``...), with the Slurm
        node it runs on and its state as the head's dashboard reports it (``ALIVE``, ``DEAD``,
        ``MISSING``). ``token``: the cluster's (default: read from its secrets file, which the portal
        can read where it runs as root or as the workspace's account). ``BackendError`` (transient)
        where the dashboard does not answer (the cluster is not running)."""
        ray = self._state.get("ray") or {}
        endpoint = self._ray_endpoint()
        if not endpoint.url:
            raise BackendError("this backend holds no Ray cluster that became ready", permanent=True)
        token = token or read_token(Path(self._state["job_dir"]))
        return query_ray_nodes(endpoint.url, token, list(ray["names"]), dict(ray["slurm_nodes"]))

    def _script(self, spec: JobSpec, job_dir: Path) -> str:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **spec.env}
        env = {
            **env,
            "PATH": search_path(self._environment, env["PATH"]),
            **spec.portal_env,  # in this script, readable by the workspace's account alone (0700)
            "HOME": str(job_dir),
            "PYTHONUNBUFFERED": "1",
            "PORTAL_JOB_KEY": spec.key,
            "PORTAL_ARTIFACTS_DIR": str(job_dir / "artifacts"),
        }
        exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
        logs = shlex.quote(str(job_dir / ".portal" / "replica-%t.log"))
        replica = shlex.quote(str(job_dir / ".portal" / "replica.sh"))
        return (
            "#!/bin/bash\n"
            f"{exports}\n"
            'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"\n'
            "MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))\n"
            "export MASTER_ADDR MASTER_PORT\n"
            f"srun --export=ALL --kill-on-bad-exit=1 --output={logs} --error={logs} bash {replica}\n"
        )

    def _wait_running(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            live = self._squeue()
            # RUNNING in slurmctld precedes the launch on the node by up to a second or two: wait
            # for the srun step to exist, so that the job really runs (and a stop signal lands).
            if live is None or live[0] not in ("PENDING", "CONFIGURING") and self._step_started():
                if live is not None and live[1]:
                    self._state["nodes"] = self._hostnames(live[1])
                self._state["running_at"] = time.time()
                return
            if time.monotonic() >= deadline:
                reason = live[2]
                try:
                    self._cancel_and_wait(signal_first=False, grace_s=0.0)
                finally:
                    self._state["final"] = {"exit_code": UNKNOWN_EXIT_CODE, "message": "did not start in time"}
                raise BackendError(
                    f"Slurm job {self._state['job_id']} did not start within {self.start_timeout_s:g}s "
                    f"(reason: {reason}); it was cancelled",
                    permanent=False,
                )
            time.sleep(0.1)

    def _step_started(self) -> bool:
        out = self._run([self.squeue_path, "-h", "-s", "-j", self._state["job_id"], "-o", "%i"])
        return f"{self._state['job_id']}.0" in out.split()

    def _hostnames(self, nodelist: str) -> list[str]:
        return self._run([self.scontrol_path, "show", "hostnames", nodelist]).split()

    def _endpoint(self) -> Endpoint:
        nodes = self._state.get("nodes") or []
        return Endpoint(host=nodes[0] if nodes else "", port=master_port(self._state["job_id"]))

    # -- poll / stop ---------------------------------------------------------------------------

    def _squeue(self) -> tuple[str, str, str] | None:
        """(state, nodelist, reason) while squeue lists the job in a live state, else None."""
        try:
            out = self._run([self.squeue_path, "-h", "-j", self._state["job_id"], "-o", "%T|%N|%r"])
        except BackendError as exc:
            if "Invalid job id" in exc.message:
                return None
            raise
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3 and parts[0] in LIVE_STATES:
                return parts[0], parts[1], parts[2]
        return None

    def _live_state(self) -> str | None:
        live = self._squeue()
        return live[0] if live else None

    def poll(self) -> Status:
        """Running while squeue lists the job; then the outcome sacct recorded.

        COMPLETED → 0; FAILED, NODE_FAIL → the job's exit code (the batch script's, which is
        srun's: the first failing replica's); CANCELLED → its code with a message; TIMEOUT →
        ``TIMEOUT_EXIT_CODE``. Transient ``BackendError`` if sacct has no final record yet.
        Within ``polling()``, what its one squeue and sacct said of the job, where they said it.
        """
        if not self._state:
            raise BackendError("nothing was started on this backend", permanent=True)
        final = self._state.get("final")
        if final:
            return Status("exited", final["exit_code"], final["message"])
        polled = (_POLLED.get() or {}).get(self._commands(), {}).get(str(self._state.get("job_id")))
        if polled is not None and polled[0] == "live":
            return Status("running")
        if polled is not None:
            status = parse_exit(polled[1], polled[2], stopped=bool(self._state.get("stopped")))
        elif self._live_state() is not None:
            return Status("running")
        else:
            status = self._sacct_status()
        self._state["final"] = {"exit_code": status.exit_code, "message": status.message, "ended_at": time.time()}
        return status

    @contextlib.contextmanager
    def polling(self, states: Iterable[dict[str, Any]]) -> Iterator[None]:
        """Within it, ``poll()`` of any backend of this Slurm (the same ``squeue`` and ``sacct``) whose
        job is one of ``states``' (``get_state()`` blobs) answers from one ``squeue`` of all those jobs,
        and one ``sacct`` of those squeue no longer lists as live, both made on entry. A job neither
        answered for (sacct has no final record of it yet) is asked as ``poll()`` asks alone, and so is
        every job where squeue or sacct failed (logged). For a pass over many workloads: what it says
        is as old as the pass."""
        polled_states = [state for state in states if state and not state.get("final")]
        job_ids = {str(state.get("job_id", "")) for state in polled_states}
        submitted = [state["submitted_at"] for state in polled_states if state.get("submitted_at")]
        answers = self._query_jobs(
            sorted((j for j in job_ids if j.isdigit()), key=int), min(submitted) if submitted else None
        )
        polled = dict(_POLLED.get() or {})
        polled[self._commands()] = {**polled.get(self._commands(), {}), **answers}
        token = _POLLED.set(polled)
        try:
            yield
        finally:
            _POLLED.reset(token)

    def _commands(self) -> tuple[str, str]:
        return self.squeue_path, self.sacct_path

    def _query_jobs(self, job_ids: list[str], submitted_at: float | None = None) -> dict[str, tuple[str, ...]]:
        """What one squeue, then one sacct of those it does not list live, say of ``job_ids`` (see
        ``_POLLED``), submitted from ``submitted_at`` on; those sacct has no final record of yet are left
        out, and all where a command failed."""
        if not job_ids:
            return {}
        answers: dict[str, tuple[str, ...]] = {}
        try:
            listed = self._run([self.squeue_path, "-h", "-j", ",".join(job_ids), "-o", "%i|%T"])
        except BackendError as exc:
            if "Invalid job id" not in exc.message:  # (one id, and it left the queue: not an error)
                logger.warning("squeue of %d jobs failed; each is asked alone: %s", len(job_ids), exc.message)
                return {}
            listed = ""
        for line in listed.splitlines():
            parts = line.strip().split("|")
            job_id = leader_id(parts[0]) if len(parts) == 2 else ""
            if job_id and parts[1] in LIVE_STATES:  # a heterogeneous job is live while a component is
                answers.setdefault(job_id, ("live", parts[1]))
        ended = {job_id for job_id in job_ids if job_id not in answers}
        if not ended:
            return answers
        argv = [self.sacct_path, "-j", ",".join(sorted(ended, key=int)), *_since(submitted_at)]
        argv += ["-X", "-n", "-P", "-o", "JobID,State,ExitCode"]
        try:
            recorded = self._run(argv)
        except BackendError as exc:
            logger.warning("sacct of %d jobs failed; each is asked alone: %s", len(ended), exc.message)
            return answers
        for line in recorded.splitlines():
            parts = line.strip().split("|")
            job_id = leader_id(parts[0]) if len(parts) == 3 else ""
            if job_id in ended and parts[1] and parts[1].split()[0] not in LIVE_STATES:
                answers.setdefault(job_id, ("ended", parts[1], parts[2]))  # the first, as ``_sacct_final``
        return answers

    def _sacct_status(self) -> Status:
        state, code = self._sacct_final()
        return parse_exit(state, code, stopped=bool(self._state.get("stopped")))

    def _sacct_final(self) -> tuple[str, str]:
        """sacct's final ``State`` and ``ExitCode`` of the job, waited for: they reach it late."""
        argv = [self.sacct_path, "-j", self._state["job_id"], *_since(self._state.get("submitted_at"))]
        argv += ["-X", "-n", "-P", "-o", "State,ExitCode"]
        for attempt in range(self.sacct_retries):
            for line in self._run(argv).splitlines():
                state, _, code = line.strip().partition("|")
                if state and state.split()[0] not in LIVE_STATES:
                    return state, code
            if attempt + 1 < self.sacct_retries:
                time.sleep(self.sacct_retry_delay_s)
        raise BackendError(f"sacct has no final record of job {self._state['job_id']} yet", permanent=False)

    def stop(self, grace_s: float = 10.0) -> None:
        """``scancel --signal=TERM``, then after ``grace_s`` cancel for good; wait until it left squeue."""
        if not self._state or self._state.get("final"):
            return
        if self._live_state() is None:
            return
        self._state["stopped"] = True
        self._cancel_and_wait(signal_first=True, grace_s=grace_s)

    def _cancel_and_wait(self, *, signal_first: bool, grace_s: float) -> None:
        job_id = self._state["job_id"]
        if signal_first:
            # Re-sent while waiting: a signal sent before slurmd launched the tasks is lost.
            deadline = time.monotonic() + grace_s
            while True:
                self._scancel(["--signal=TERM", job_id])
                if self._wait_gone(min(1.0, max(0.0, deadline - time.monotonic()))):
                    return
                if time.monotonic() >= deadline:
                    break
        self._scancel([job_id])
        if self._wait_gone(2.0):
            return
        self._scancel(["--full", "--signal=KILL", job_id])
        if not self._wait_gone(10.0):
            raise BackendError(f"Slurm job {job_id} is still listed by squeue after scancel", permanent=False)

    def _scancel(self, args: list[str]) -> None:
        try:
            self._run([self.scancel_path, *args])
        except BackendError as exc:
            if "Invalid job id" not in exc.message and "already completing or completed" not in exc.message:
                raise

    def _wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self._live_state() is None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    # -- logs, artifacts, progress, inventory --------------------------------------------------

    def _log_files(self) -> tuple[list[str], str | None]:
        """srun's per-task files, in the job's directory, which the workload can write."""
        return list(self._state.get("logs", [])), self._state.get("job_dir")

    def discover(self) -> list[GpuInfo]:
        """Every GPU of the partition's nodes, from ``scontrol show node -o`` (index ``node:i``)."""
        return node_gpus(self._partition_nodes())

    def nodes(self) -> list[NodeInfo]:
        """The partition's nodes, from ``scontrol show node -o``, in the pool named after it."""
        return [node_info(fields, self.partition) for fields in self._partition_nodes()]

    def _partition_nodes(self) -> list[dict[str, str]]:
        """``PolicyRefusal`` naming the partitions there are when the partition has no nodes."""
        every = parse_scontrol_nodes(self._run([self.scontrol_path, "show", "node", "-o"]))
        nodes = [fields for fields in every if self.partition in node_partitions(fields)]
        if not nodes:
            known = ", ".join(sorted({p for fields in every for p in node_partitions(fields)})) or "none"
            raise PolicyRefusal(f"Slurm has no nodes in partition {self.partition} (its partitions: {known}).")
        return nodes

    def sweep_orphans(self, owner: str, keep: Keep | None = None) -> list[str]:
        """Cancel the Slurm jobs submitted for ``owner`` (their comment) that no workload recorded.
        A job is kept when its id is that of a kept state, or its name (the workload's key) is a
        kept key. Returns the ids cancelled."""
        keep = keep or Keep()
        recorded = {str(state.get("job_id")) for state in keep.states}
        orphans = []
        for line in self._run([self.squeue_path, "-h", "-o", "%i|%j|%k"]).splitlines():
            listed, name, comment = (line.strip().split("|", 2) + ["", ""])[:3]
            job_id = leader_id(listed)  # a heterogeneous job's components are cancelled with it
            if comment == owner and job_id and job_id not in recorded and name not in keep.keys:
                orphans.append(job_id)
        orphans = list(dict.fromkeys(orphans))
        if orphans:
            self._run([self.scancel_path, *orphans])
        return orphans


def _since(submitted_at: float | None) -> list[str]:
    """sacct's options for the jobs submitted from ``submitted_at`` on (less ``SUBMIT_SLACK_S``) alone:
    none where the time is not known (a state recorded before it was)."""
    if not submitted_at:
        return []
    return ["-S", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(submitted_at - SUBMIT_SLACK_S))]


def _job_state(
    spec: JobSpec, job_id: str, kind: str, run_as: RunAs | None, account: str, submitted_at: float | None
) -> dict[str, Any]:
    """The state of the batch job ``job_id`` that runs ``spec``, before Slurm has placed it."""
    job_dir = Path(os.path.abspath(os.path.join(spec.work_dir, spec.key)))
    internal = job_dir / ".portal"
    return {
        "version": STATE_VERSION,
        "kind": kind,
        "job_id": job_id,
        "key": spec.key,
        "job_dir": str(job_dir),
        "batch_log": str(internal / "batch.log"),
        "logs": [str(internal / f"replica-{r}.log") for r in range(spec.replicas)],
        "replicas": spec.replicas,
        "artifact_paths": spec.artifact_paths or ["artifacts"],
        "submitted_at": submitted_at,
        "nodes": [],
        "user": run_as.user if run_as else "",
        "account": account,
    }


# The address of the node a batch job's task runs on, as Slurm knows it: a shell word.
_NODE_ADDR = '"$(scontrol show node "$SLURMD_NODENAME" | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')"'


def _inference_job(spec: InferenceSpec, env_dir: Path) -> tuple[JobSpec, str]:
    """The one-replica job that runs an inference replica's server from ``env_dir`` on its node's
    address and ``$MASTER_PORT`` (shell words: the task's shell expands them on the node), and the
    text of its ``SERVER_ENV_FILE``: the server's settings and API key, which its task exports
    just before the server starts. Its working directory is the environment's, which holds
    nothing the workspace wrote."""
    host, port = '"$NODE_ADDR"', '"$MASTER_PORT"'
    argv, env = servers.command(
        spec.server,
        model_path=spec.model_path,
        served_name=spec.served_name,
        cpu_cores=max(1, int(spec.cpu_cores)),
        extra_args=list(spec.extra_args),
        api_key=spec.api_key,
        host=host,
        port=port,
    )
    words = [shlex.quote(str(env_dir / "bin" / argv[0]))]
    words += [word if word in (host, port) else shlex.quote(word) for word in argv[1:]]
    env_file = Path(os.path.abspath(os.path.join(spec.work_dir, spec.key))) / ".portal" / SERVER_ENV_FILE
    command = (
        f"NODE_ADDR={_NODE_ADDR} && set -a && . {shlex.quote(str(env_file))} && set +a && "
        f"cd {shlex.quote(str(env_dir))} && exec {' '.join(words)}"
    )
    job = JobSpec(
        key=spec.key,
        workspace=spec.workspace,
        name=spec.name,
        command=command,
        work_dir=spec.work_dir,
        devices=[spec.devices],
        cpu_cores=spec.cpu_cores,
        memory_gb=spec.memory_gb,
        run_as=spec.run_as,
        disk=spec.disk,
    )
    return job, "".join(f"{name}={shlex.quote(value)}\n" for name, value in env.items())


def _settled_id(job_dir: Path) -> str:
    """The job id in ``job_dir``'s ``.portal/settled`` (never read through a link), or ''."""
    opened = open_inside(job_dir, f".portal/{SETTLED_FILE}")
    if opened is None:
        return ""
    with opened:
        return opened.read(64).decode(errors="replace").strip()


def _replica_script(command: str) -> str:
    """What each srun task runs: the rendezvous variables from Slurm's, then the user's command."""
    return (
        "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS\n"
        f"exec bash -c {shlex.quote(command)}\n"
    )
