"""The local backend for jobs: each replica a real process group on this machine.

A replica runs as ``bash -c <command>`` inside a bubblewrap sandbox (workers/backends/sandbox.py:
only its workspace's directory writable, its own PID namespace, only its own GPUs, as its
workspace's Unix account when the portal runs as root), under a small bash wrapper outside the
sandbox that leads its own session (so one ``killpg`` reaches every descendant that stays in the
group) and writes the command's exit status to a file: a worker restarted after the job ended
can still read it, although it is no longer the processes' parent. Liveness is read from
``/proc``, with each pid's start time kept in the state so that a reused pid is never mistaken
for ours.

The wrapper's files (each replica's log and exit status) live in the portal's own run directory,
which no sandbox can see: a workload can neither forge its status nor swap its log for a link
that the portal, reading it, would follow. So does each start's state (``start.json``) until the
portal has recorded it: a worker that dies before saving ``get_state()`` leaves it there for
``adopt()``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workers.backends import cgroups, diskquota, logcap, raycluster
from workers.backends.base import (
    STATE_VERSION,
    TIMEOUT_EXIT_CODE,
    UNKNOWN_EXIT_CODE,
    BackendError,
    Endpoint,
    GpuInfo,
    InferenceSpec,
    InstanceSpec,
    JobSpec,
    Keep,
    NotebookSpec,
    RayClusterSpec,
    Spec,
    Status,
    validate_spec,
)
from workers.backends.files import FileOutputs, check_reachable, dirs_between, prepare_dir, read_log
from workers.backends.processes import (
    IDENTITY_MODULES,
    INFERENCE_SOCKET_NAME,
    http_get,
    inference_job,
    instance_job,
    kind_and_job,
    notebook_job,
    prepare_socket_dir,
    search_path,
    server_socket,
    socket_url,
    wait_answering,
)
from workers.backends.pyenv import ensure_env, ensure_sdk_env, ensure_serve_env
from workers.backends.sandbox import Sandbox, check_available, filter_fd
from workers.backends.steps import ANSWERING, STARTING, begin

# What a workload takes from the portal's own environment: its locale and time zone. Never PATH,
# which names the portal's own directories (its user's home, its virtualenv).
_INHERITED_ENV = ("LANG", "LC_ALL", "TZ")
# The PATH of the wrappers, and of workloads after their environment's ``bin``.
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Each replica's output goes through this writer, which keeps its log under a size cap.
_LOG_WRITER = Path(logcap.__file__).resolve()
DEFAULT_LOG_MAX_BYTES = 100 << 20

SANDBOX_MODES = ("bwrap", "off")
RESOURCE_LIMIT_MODES = ("cgroup", "off")
# In a start's run directory: its state, from before its first replica is spawned until the portal
# has recorded it (or given it up, or swept its processes): what adopt() takes over.
_START_RECORD = "start.json"

# $1 exit-status file, $2 the cgroup.procs files to join, ":"-separated (one per cgroup hierarchy;
# "" for none: a wrapper that cannot join them all runs nothing), $3 the descriptor of a pipe that
# says "go" once the start's record names this wrapper, then the argv to run (the sandbox, or
# ``bash -c <command>`` where sandboxing is off). A worker that dies between spawning a wrapper and
# recording it closes the pipe unsaid: the wrapper runs nothing, so the next start, which cannot
# adopt what the record does not name, never runs the command a second time beside it. Catching
# TERM (rather than ignoring it) keeps the command's default disposition, and lets the wrapper
# record the status once the command has ended; SIGKILL of the group leaves no file, which poll()
# handles.
_WRAPPER = r"""
IFS=: read -ra cgroups <<< "$2"
for procs in "${cgroups[@]}"; do
  echo $$ > "$procs" || { echo "portal: could not join the cgroup $procs: not started" >&2; echo 125 > "$1"; exit 125; }
done
read -r -u "$3" go || true
[ "$go" = go ] || { echo "portal: the start was not recorded: not started" >&2; exit 125; }
eval "exec $3<&-"
trap ':' TERM INT HUP
exit_file=$1
shift 3
# The output goes through the log's writer (workers/backends/logcap.py, the portal's Python), which
# keeps the log under its cap; it ignores the stop signals, to drain the pipe to the last line.
# Its settings, and the portal's work directory, are the wrapper's alone: not the command's.
log_writer=("$PORTAL_PYTHON" -I "$PORTAL_LOG_WRITER" "$PORTAL_LOG" "$PORTAL_LOG_MAX_BYTES")
unset PORTAL_OWNER PORTAL_PYTHON PORTAL_LOG_WRITER PORTAL_LOG PORTAL_LOG_MAX_BYTES
"$@" 2>&1 | (trap '' TERM INT HUP; exec "${log_writer[@]}")
rc=${PIPESTATUS[0]}
echo "$rc" > "$exit_file.tmp" && mv -f "$exit_file.tmp" "$exit_file"
exit "$rc"
"""


# What a start says as it starts a kind's processes (workers/backends/steps.py).
_STARTING = {
    "job": "starting the job's process",
    "gang": "starting the job's {n} processes",
    "instance": "starting the instance's process group",
    "notebook": "starting the Jupyter server",
    "ray": "starting the Ray cluster's pod",
    "inference": "starting the model server",
}


class LocalBackend(FileOutputs):
    """Runs a job's replicas as process groups on this machine; ``spec.image`` is ignored here.

    Settings: ``inventory`` declares the GPUs where there is no NVIDIA driver (else ``discover()``
    asks ``nvidia-smi``); ``teardown_grace_s`` is the SIGTERM-to-SIGKILL grace used when
    ``poll()`` tears a gang down or enforces ``max_runtime_s``. Failed replicas and the runtime
    limit are acted on at ``poll()``: the caller's reconcile loop is the watchdog.

    Jobs get a clean environment (the system's PATH, LANG, HOME = the job directory, the spec's
    env, its ``portal_env`` and the rendezvous variables), never the worker's own, which holds the
    portal's secrets and names its directories. The variables reach a sandbox through a file
    descriptor, never a command line. With ``env_root``, PATH starts with a Python environment's
    ``bin`` (workers/backends/pyenv.py): a notebook's own, or, for jobs and instances, the SDK's,
    so ``python`` and ``gpuportal`` work at once.

    ``sandbox`` is ``"bwrap"`` (every workload in a bubblewrap sandbox; a start fails, saying
    why, where bubblewrap cannot run) or ``"off"`` (the explicit opt-out of a single-user
    workstation: workloads run as the portal's user, unconfined). ``run_dir`` is the portal's
    private directory for the wrappers' logs and exit files; ``owner`` (the portal's work
    directory) is also the root of the workspaces' directories, one of which a sandbox may write.
    ``device_root`` is where the GPUs' device nodes are (``/dev``): a sandbox gets its own GPUs'.
    ``log_max_bytes`` caps each replica's log (workers/backends/logcap.py): past it, the oldest
    part is dropped and a line says how much.

    ``resource_limits`` is ``"cgroup"`` (every workload held to its CPU cores, memory and
    ``pids_max`` processes by a cgroup under ``cgroup_root``, v2 or v1: workers/backends/cgroups.py;
    a start fails, saying why, where they cannot be applied) or ``"off"`` (the explicit opt-out of a
    single-user workstation). An instance's notebooks share its limits: they run in its group.

    Ray clusters (``start_ray_cluster()``, workers/backends/raycluster.py) run on ``ray_env``, the
    Python environment holding ``ray`` (default: the portal's own, where requirements.txt pins it),
    and need the sandbox: their nodes' ports live in the sandbox's own network. A start waits up to
    ``ray_start_timeout_s`` for every node to join. ``ray_status()`` and ``ray_nodes()`` read how
    the cluster and its nodes are doing.
    """

    name = "local"

    def __init__(
        self,
        *,
        inventory: list[GpuInfo] | None = None,
        cgroup_root: str = "/sys/fs/cgroup",
        teardown_grace_s: float = 5.0,
        env_root: str = "",
        notebook_start_timeout_s: float = 60.0,
        owner: str = "",
        sandbox: str = "bwrap",
        run_dir: str = "",
        device_root: str = "/dev",
        log_max_bytes: int = DEFAULT_LOG_MAX_BYTES,
        resource_limits: str = "cgroup",
        pids_max: int = cgroups.DEFAULT_PIDS_MAX,
        ray_env: str = "",
        ray_start_timeout_s: float = 180.0,
    ) -> None:
        if sandbox not in SANDBOX_MODES:
            modes = ", ".join(SANDBOX_MODES)
            raise BackendError(f"unknown sandbox mode {sandbox!r}: use one of {modes}", permanent=True)
        if resource_limits not in RESOURCE_LIMIT_MODES:
            modes = ", ".join(RESOURCE_LIMIT_MODES)
            raise BackendError(f"unknown resource limits {resource_limits!r}: use one of {modes}", permanent=True)
        self.resource_limits = resource_limits
        self.pids_max = pids_max
        self._instance_cgroup: dict[str, Any] = {}
        self.sandbox = sandbox
        self.device_root = device_root
        self.run_dir = run_dir or os.path.join(tempfile.gettempdir(), f"gpuportal-run-{os.geteuid()}")
        self._read_only: list[str] = []
        self._environment: Path | None = None
        self.inventory = inventory
        self.cgroup_root = cgroup_root
        self.teardown_grace_s = teardown_grace_s
        self.env_root = env_root
        self.notebook_start_timeout_s = notebook_start_timeout_s
        self.owner = owner
        self.log_max_bytes = log_max_bytes
        self.ray_env = ray_env or sys.prefix
        self.ray_start_timeout_s = ray_start_timeout_s
        self._state: dict[str, Any] = {}
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    # -- state ---------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """Return pids, pgids, start times, log and status files, the port and cgroup outcome."""
        return _copy_json(self._state)

    def load_state(self, state: dict[str, Any]) -> None:
        """Reattach to a job started by another backend object, maybe in a process that died.

        A state that comes back was recorded: its start's record goes, and ``adopt()`` never takes
        that start over (a later attempt under the same key starts afresh)."""
        if state and state.get("version") != STATE_VERSION:
            raise BackendError(f"unknown local backend state version {state.get('version')!r}", permanent=True)
        self._state = _copy_json(state)
        self._procs = {}
        self._forget_record()

    def clear_state(self) -> None:
        """Forget the job, and its start's record (``adopt()`` never takes it over); its directory
        (logs, artifacts) stays on disk."""
        self._forget_record()
        self._state = {}
        self._procs = {}

    def _forget_record(self) -> None:
        if self._state.get("run_dir"):
            _drop_record(Path(self._state["run_dir"]), started_at=self._state.get("started_at"))

    def _write_record(self) -> None:
        path = Path(self._state["run_dir"]) / _START_RECORD
        partial = path.with_name(f"{_START_RECORD}.tmp")
        partial.write_text(json.dumps(self._state))
        os.replace(partial, path)

    # -- start ---------------------------------------------------------------------------------

    def start_job(self, spec: JobSpec) -> Endpoint:
        """Start every replica; return the gang's rendezvous address (127.0.0.1, MASTER_PORT).

        ``PolicyRefusal`` for bad env keys or artifact paths; ``BackendError(permanent=True)`` for
        a malformed spec or a job that already ran on this state; ``BackendError`` transient when
        a process could not be created (replicas already started are killed first).
        """
        return self._launch(spec, self._sdk_environment())

    def _sdk_environment(self) -> Path | None:
        """The SDK's environment for jobs and instances (built once), where environments are kept."""
        return ensure_sdk_env(Path(self.env_root), steps=self.steps) if self.env_root else None

    def _launch(
        self, spec: JobSpec, environment: Path | None, *, read_only: tuple[str, ...] = (), kind: str = "job"
    ) -> Endpoint:
        """Start the replicas of ``spec`` with ``environment``'s ``bin`` first on their PATH; it and
        ``read_only`` are bound read-only into the sandbox: no workload writes into them. The state
        is recorded in the run directory before the first replica and after each (``adopt()``)."""
        if self._state:
            if self._state.get("key") == spec.key and self._alive_ranks():
                return self._endpoint()
            raise BackendError("this backend already ran a job; clear_state() first", permanent=True)
        validate_spec(spec)
        starting = _STARTING["gang" if kind == "job" and spec.replicas > 1 else kind]
        begin(self.steps, STARTING, starting.format(n=spec.replicas))
        if self.sandbox == "bwrap":
            check_available()
        if spec.disk is not None:  # the workspace's directory is a filesystem of its quota's size
            diskquota.ensure_mounted(spec.disk)
        self._environment = environment
        self._read_only = [*([str(environment)] if environment is not None else []), *read_only]
        workspace_dir = self._workspace_dir(spec)
        prepare_dir(workspace_dir, spec.run_as, mode=0o700)
        job_dir = Path(os.path.abspath(os.path.join(spec.work_dir, spec.key)))
        for directory in dirs_between(workspace_dir, job_dir):
            prepare_dir(directory, spec.run_as)
        prepare_dir(job_dir / "artifacts", spec.run_as)
        internal = self._run_dir_of(job_dir)
        for stale in internal.glob("replica-*.exit"):
            stale.unlink()
        port = _free_port()
        cgroup_procs, cgroup_state = self._prepare_cgroups(spec, kind, internal.name)
        self._state = {
            "version": STATE_VERSION,
            "kind": kind,
            "key": spec.key,
            "job_dir": str(job_dir),
            "workspace_dir": str(workspace_dir),
            "run_dir": str(internal),
            "sandbox": self.sandbox,
            "port": port,
            "started_at": time.time(),
            "max_runtime_s": spec.max_runtime_s,
            "artifact_paths": spec.artifact_paths or ["artifacts"],
            "cgroup": cgroup_state,
            "replicas": [],
        }
        try:
            self._write_record()
            for rank in range(spec.replicas):
                go = self._spawn(spec, rank, port, cgroup_procs[rank] if cgroup_procs else "")
                try:
                    self._write_record()
                    os.write(go, b"go\n")  # recorded: adopt() takes it over from now on
                finally:
                    os.close(go)
        except OSError as exc:
            self._terminate(grace_s=0.0, reason=f"start failed: {exc}")
            raise BackendError(f"could not start replica: {exc}", permanent=False) from exc
        return self._endpoint()

    def start_instance(self, spec: InstanceSpec) -> Endpoint:
        """An instance is its directory and a process group holding its GPU slice (and its cgroup,
        where the kernel allows one): the directory outlives it, its notebooks run beside it."""
        return self._launch(instance_job(spec), self._sdk_environment(), kind="instance")

    def start_notebook(self, spec: NotebookSpec) -> Endpoint:
        """A Jupyter server of the profile's environment, under ``spec.base_url``, with the
        instance's GPUs and files; returns once it answers HTTP. It listens on a Unix socket in a
        directory of its own outside the workspace (``server_socket()``), which only its account
        and the portal's (the proxy's) can enter, and no TCP port: no other process can answer in
        its place, even once it has exited. The endpoint's URL is the proxy's target for it."""
        if self._state and self._state.get("key") == spec.key and self._alive_ranks():
            return self._notebook_endpoint()
        if not self.env_root:
            raise BackendError("the local backend has no notebook environment directory", permanent=True)
        env = ensure_env(spec.python_packages, Path(self.env_root), steps=self.steps)
        sock = server_socket(self.run_dir, Path(os.path.abspath(os.path.join(spec.work_dir, spec.key))))
        server = notebook_job(spec, env, sock=str(sock))
        self._instance_cgroup = dict(spec.instance_state.get("cgroup") or {})  # its group is in there
        prepare_socket_dir(sock, spec.run_as)
        self._launch(server, env, read_only=(str(IDENTITY_MODULES),), kind="notebook")
        begin(self.steps, ANSWERING, "waiting for Jupyter to answer")
        return self._notebook_answering(spec.base_url)

    def start_ray_cluster(self, spec: RayClusterSpec) -> Endpoint:
        """A Ray cluster: its head and workers run by one pod (workers/raypod.py) as a one-replica
        job, in a sandbox with the nodes' GPUs, CPUs and memory and a network of its own (see
        workers/backends/raycluster.py). Returns once every node joined and the dashboard answers,
        with the URL of the pod's Unix socket (``http+unix://``), the one way into the cluster: its
        dashboard and Jobs API, which want ``Authorization: Bearer <spec.auth_token>``.
        ``BackendError(permanent=True)`` where the sandbox is off or there is no Ray environment;
        transient where the cluster did not come up in time (it is stopped first)."""
        if self._state and self._state.get("key") == spec.key and self._alive_ranks():
            return self._endpoint()
        if self.sandbox == "off":
            raise BackendError(
                "Ray clusters run only sandboxed: their nodes' ports live in the sandbox's own network, out "
                "of other workloads' reach (PORTAL_SANDBOX=off runs none)",
                permanent=True,
            )
        environment = Path(os.path.abspath(self.ray_env))
        raycluster.check_environment(environment)
        if spec.run_as is not None and os.geteuid() == 0:
            check_reachable(environment, "the Ray environment")
            for path in raycluster.POD_FILES:
                check_reachable(path, "the Ray pod")
        job_dir = Path(os.path.abspath(os.path.join(spec.work_dir, spec.key)))
        sock = server_socket(self.run_dir, job_dir).with_name(raycluster.SOCKET_NAME)
        timeout_s = raycluster.ready_timeout(spec, self.ray_start_timeout_s)
        job = raycluster.ray_job(spec, environment, sock, start_timeout_s=timeout_s)
        prepare_socket_dir(sock, spec.run_as)
        self._launch(job, environment, read_only=tuple(str(path) for path in raycluster.POD_FILES), kind="ray")
        begin(self.steps, ANSWERING, "waiting for every node to join and the dashboard to answer")
        return self._ray_joined(spec)

    def start_inference(self, spec: InferenceSpec) -> Endpoint:
        """An inference replica: its server (workers/backends/servers.py) from the server's own
        environment (built once, like a notebook's), in the sandbox with the replica's GPUs, CPUs
        and memory, listening on a Unix socket of its own as a notebook's server does (no TCP
        port: nothing else can answer in its place). Returns once the server answers its health
        check (the model loaded); stopped, and ``BackendError`` with its last log lines, if it
        exits first or does not answer within ``spec.start_timeout_s``."""
        if self._state and self._state.get("key") == spec.key and self._alive_ranks():
            return self._notebook_endpoint()
        if not self.env_root:
            raise BackendError("the local backend has no environment directory for inference servers", permanent=True)
        environment = ensure_serve_env(spec.server, Path(self.env_root), steps=self.steps)
        job_dir = Path(os.path.abspath(os.path.join(spec.work_dir, spec.key)))
        sock = server_socket(self.run_dir, job_dir).with_name(INFERENCE_SOCKET_NAME)
        prepare_socket_dir(sock, spec.run_as)
        self._launch(inference_job(spec, str(sock)), environment, kind="inference")
        begin(self.steps, ANSWERING, f"waiting for the model server to load {spec.served_name} and answer")
        return self._server_answering(spec)

    def _server_answering(self, spec: InferenceSpec) -> Endpoint:
        """The replica's endpoint once its server answers its health check; stopped, and
        ``BackendError`` with the server's last log lines, if it does not."""
        from workers.backends import servers

        endpoint = self._notebook_endpoint()
        health = f"{endpoint.url}{servers.SERVERS[spec.server].health_path}"
        auth = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
        deadline = time.monotonic() + spec.start_timeout_s
        problem, exited = "", False
        while not problem:
            if not self._alive_ranks():
                problem = f"the server exited before it answered: {_tail(self._state['replicas'][0]['log'], 8)}"
                exited = True
                break
            try:
                if http_get(health, headers=auth, timeout=2)[0] == 200:
                    return endpoint
            except OSError:
                pass
            if time.monotonic() > deadline:
                tail = _tail(self._state["replicas"][0]["log"], 8)
                problem = f"the server did not answer within {spec.start_timeout_s:g}s: {tail}"
            time.sleep(0.1)
        self._terminate(grace_s=self.teardown_grace_s, reason="the server did not start")
        self._finish()
        # A server that exits at start (a model it cannot load, a bad argument) would again.
        raise BackendError(problem, permanent=exited)

    def _ray_joined(self, spec: RayClusterSpec) -> Endpoint:
        """The cluster's endpoint once its pod says every node joined and the dashboard answers
        through the socket with the token (or the cluster, having been ready, already ended: an
        entrypoint this quick); stopped, and ``BackendError``, if not."""
        endpoint = self._endpoint()
        timeout_s = raycluster.ready_timeout(spec, self.ray_start_timeout_s)
        deadline = time.monotonic() + timeout_s
        version = f"{endpoint.url}/api/version"
        while True:
            ready, alive = bool(self.ray_status().get("ready_at")), bool(self._alive_ranks())
            if ready and (not alive or _answers(version, {"Authorization": f"Bearer {spec.auth_token}"})):
                return endpoint
            problem = "" if alive else f"the Ray cluster exited before every node joined: {self._log_tail()}"
            if not problem and time.monotonic() > deadline:
                problem = f"not every node of the Ray cluster joined within {timeout_s:g}s: {self._log_tail()}"
            if problem:
                self._terminate(grace_s=self.teardown_grace_s, reason="the Ray cluster did not start")
                self._finish()
                raise BackendError(problem, permanent=False)
            time.sleep(0.25)

    def ray_status(self) -> dict[str, Any]:
        """The Ray cluster's status, as its pod last wrote it (``{}`` before it did, or for another
        kind of workload): ``phase`` (``starting``, ``ready``, ``degraded`` while a worker is being
        started again, ``failed``, ``stopping``, ``exited``), ``reason``, ``ready_at``, ``exit_code``,
        ``entrypoint`` (its Ray job's ``submission_id``, ``status``, ``exit_code``) and ``nodes``
        (see ``ray_nodes()``). The workload's own word, for showing: ``poll()`` rests on processes."""
        if self._state.get("kind") != "ray":
            return {}
        return raycluster.read_status(Path(self._state["workspace_dir"]), Path(self._state["job_dir"]))

    def ray_nodes(self) -> list[dict[str, Any]]:
        """Each node of the Ray cluster: ``name`` (``head``, ``worker-<i>``: also its custom
        resource, to pin work to it), ``role``, ``index``, ``pid`` (in the sandbox), ``alive``,
        ``joined``, ``node_id``, ``restarts``, ``exit_code`` (of its last run), ``devices``,
        ``num_gpus``, ``num_cpus``, ``memory_bytes``. ``[]`` before the pod wrote its status."""
        nodes = self.ray_status().get("nodes", [])
        return [node for node in nodes if isinstance(node, dict)]

    def _log_tail(self) -> str:
        return _tail(self._state["replicas"][0]["log"]) if self._state.get("replicas") else ""

    def _server_socket(self) -> Path:
        """The socket of the notebook server (``start_notebook()``) or the Ray cluster's dashboard
        (``start_ray_cluster()``) this backend holds."""
        sock = server_socket(Path(self._state["run_dir"]).parent, Path(self._state["job_dir"]))
        if self._state.get("kind") == "inference":
            return sock.with_name(INFERENCE_SOCKET_NAME)
        return sock.with_name(raycluster.SOCKET_NAME) if self._state.get("kind") == "ray" else sock

    def _notebook_endpoint(self) -> Endpoint:
        sock = self._server_socket()
        return Endpoint(str(sock), 0, url=socket_url(sock))  # a Unix socket: its path, no port

    def _notebook_answering(self, base_url: str) -> Endpoint:
        """The server's endpoint once it answers; stopped, and ``BackendError``, if it does not."""
        endpoint = self._notebook_endpoint()
        try:
            wait_answering(
                f"{endpoint.url}{base_url}api",
                alive=lambda: bool(self._alive_ranks()),
                log_tail=lambda: _tail(self._state["replicas"][0]["log"]),
                timeout_s=self.notebook_start_timeout_s,
            )
        except BackendError:
            self._terminate(grace_s=self.teardown_grace_s, reason="the notebook server did not start")
            self._finish()
            raise
        return endpoint

    def adopt(self, spec: Spec) -> Endpoint | None:
        """Take over the last start under ``spec.key`` if the portal never recorded it: the state
        that start left in its run directory (see ``_launch()``), running or ended (its replicas'
        exit codes are in their status files). Only a start of every replica of the spec, on the
        spec's devices, is taken over; another is stopped and ``None`` returned. A notebook server
        that runs is waited for, as ``start()`` does."""
        if self._state:
            raise BackendError("this backend already holds a workload; clear_state() first", permanent=True)
        kind, job = ("ray", raycluster.find_job(spec)) if isinstance(spec, RayClusterSpec) else kind_and_job(spec)
        validate_spec(job)
        job_dir = Path(os.path.abspath(os.path.join(job.work_dir, job.key)))
        record = _read_record(self._run_dir_path(job_dir))
        expected = {"version": STATE_VERSION, "kind": kind, "key": job.key, "job_dir": str(job_dir)}
        if record is None or any(record.get(name) != value for name, value in expected.items()):
            return None
        self._state = record
        devices = [job.devices[rank] if job.devices else [] for rank in range(job.replicas)]
        if [replica["devices"] for replica in record["replicas"]] != devices:
            self.stop(self.teardown_grace_s)  # a gang started in part, or for another placement
            self.clear_state()
            return None
        if isinstance(spec, NotebookSpec):
            if self._alive_ranks():
                return self._notebook_answering(spec.base_url)
            return self._notebook_endpoint()
        if isinstance(spec, RayClusterSpec) and self._alive_ranks():
            return self._ray_joined(spec)
        if isinstance(spec, InferenceSpec) and self._alive_ranks():
            return self._server_answering(spec)
        return self._endpoint()

    def _workspace_dir(self, spec: JobSpec) -> Path:
        """The directory a workload may write: the spec's ``writable_dir`` (an instance's or a
        notebook's: its instance's), else its workspace's under the portal's work directory, else
        (a backend driven without one) the spec's own work directory."""
        if spec.writable_dir:
            return Path(os.path.abspath(spec.writable_dir))
        work_dir = Path(os.path.abspath(spec.work_dir))
        if self.owner:
            workspace_dir = Path(os.path.abspath(self.owner)) / spec.workspace
            if work_dir == workspace_dir or work_dir.is_relative_to(workspace_dir):
                return workspace_dir
        return work_dir

    def _run_dir_of(self, job_dir: Path) -> Path:
        """The portal's private directory for one job's logs and exit files (outside any sandbox)."""
        root = Path(self.run_dir)
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o700)
        path = self._run_dir_path(job_dir)
        path.mkdir(mode=0o700, exist_ok=True)
        return path

    def _run_dir_path(self, job_dir: Path) -> Path:
        digest = hashlib.sha256(str(job_dir).encode()).hexdigest()[:16]
        return Path(self.run_dir) / f"{job_dir.name}-{digest}"

    def _command_argv(
        self, spec: JobSpec, command: str, devices: list[str], args_fd: int | None, seccomp_fd: int | None
    ) -> list[str]:
        if self.sandbox == "off":
            return ["bash", "-c", command]
        return self._sandbox(spec, devices).argv(command, args_fd, seccomp_fd)

    def _sandbox(self, spec: JobSpec, devices: list[str]) -> Sandbox:
        # A notebook's server, or a Ray cluster's pod, also writes its socket's directory.
        sockets = [str(self._server_socket().parent)] if self._state["kind"] in ("notebook", "ray", "inference") else []
        return Sandbox(
            writable=[self._state["workspace_dir"], *sockets],
            read_only=list(self._read_only),
            devices=devices,
            run_as=spec.run_as,
            cwd=self._state["job_dir"],
            dev_root=self.device_root,
            private_network=self._state["kind"] == "ray",
        )

    def _spawn(self, spec: JobSpec, rank: int, port: int, cgroup_procs: str) -> int:
        """Spawn replica ``rank``'s wrapper, which waits to be told to go; return the pipe's end to
        tell it on (see ``_WRAPPER``), for the caller to close."""
        run_dir = Path(self._state["run_dir"])
        log_path, exit_path = run_dir / f"replica-{rank}.log", run_dir / f"replica-{rank}.exit"
        devices = spec.devices[rank] if spec.devices else []
        env = self._workload_env(spec, rank, port, devices)
        fds: list[int] = []
        wait_fd, go = os.pipe()
        try:
            if self.sandbox != "off":
                # The wrapper runs with the portal's rights: it gets none of the workload's variables
                # (BASH_ENV, LD_PRELOAD...), which go to the sandbox through a file descriptor, as
                # does the seccomp filter the sandbox runs under.
                fds.append(_memfd(self._sandbox(spec, devices).env_args(env)))
                fds.append(filter_fd())
            args_fd, seccomp_fd = fds if fds else (None, None)
            command = self._command_argv(spec, spec.command, devices, args_fd, seccomp_fd)
            argv = ["bash", "-c", _WRAPPER, "portal-job", str(exit_path), cgroup_procs, str(wait_fd), *command]
            proc = self._popen(argv, self._wrapper_env(spec, log_path, env), log_path, [*fds, wait_fd])
        except BaseException:
            os.close(go)
            raise
        finally:
            for fd in (*fds, wait_fd):
                os.close(fd)
        self._procs[rank] = proc
        stat = _read_stat(proc.pid)
        self._state["replicas"].append(
            {
                "rank": rank,
                "pid": proc.pid,
                "pgid": proc.pid,  # a session leader leads its own process group
                "start_ticks": stat.start_ticks if stat else 0,
                "devices": devices,
                "log": str(log_path),
                "exit_file": str(exit_path),
            }
        )
        return go

    def _workload_env(self, spec: JobSpec, rank: int, port: int, devices: list[str]) -> dict[str, str]:
        """A replica's variables: the portal's locale, the spec's, the system's PATH (or the spec's)
        after its environment's ``bin``, the SDK's settings and the rendezvous. Nothing else of the
        portal's: not its PATH (its account's home, its virtualenv), not its work directory."""
        job_dir = Path(self._state["job_dir"])
        env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
        env.update(spec.env)
        env["PATH"] = search_path(self._environment, spec.env.get("PATH", _SYSTEM_PATH))
        env.update(spec.portal_env)
        env.update(
            HOME=str(job_dir),
            PYTHONUNBUFFERED="1",
            PORTAL_JOB_KEY=spec.key,
            PORTAL_ARTIFACTS_DIR=str(job_dir / "artifacts"),
            CUDA_VISIBLE_DEVICES=",".join(devices),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(spec.replicas),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        return env

    def _wrapper_env(self, spec: JobSpec, log_path: Path, env: dict[str, str]) -> dict[str, str]:
        """The wrapper's variables: its workload's key and owner, which ``sweep_orphans()`` reads
        in /proc, and its log writer's settings; the wrapper unsets them but the key before it runs
        the command. Where sandboxing is off, the command has the wrapper's environment: ``env``."""
        own = {
            "PORTAL_JOB_KEY": spec.key,
            "PORTAL_OWNER": self.owner,
            "PORTAL_PYTHON": sys.executable or "python3",
            "PORTAL_LOG_WRITER": str(_LOG_WRITER),
            "PORTAL_LOG": str(log_path),
            "PORTAL_LOG_MAX_BYTES": str(self.log_max_bytes),
        }
        return {**env, **own} if self.sandbox == "off" else {"PATH": _SYSTEM_PATH, **own}

    def _popen(self, argv: list[str], env: dict[str, str], log_path: Path, fds: list[int]) -> subprocess.Popen[bytes]:
        """Start a wrapper, its output appended to ``log_path`` (made anew), as its log writer's is."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        log = os.open(log_path, flags, 0o600)
        try:
            return subprocess.Popen(
                argv,
                # A sandbox starts in the job's directory (--chdir); its wrapper, with the
                # portal's rights, stays out of a directory user code can change.
                cwd=self._state["job_dir"] if self.sandbox == "off" else self._state["run_dir"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=tuple(fds),
            )
        finally:
            os.close(log)

    def _endpoint(self) -> Endpoint:
        if self._state.get("kind") in ("ray", "inference"):
            return self._notebook_endpoint()  # its dashboard's socket
        return Endpoint(host="127.0.0.1", port=int(self._state["port"]))

    # -- poll / stop ---------------------------------------------------------------------------

    def poll(self) -> Status:
        """Running while any replica runs; tears the gang down when one fails or time runs out.

        The exit code is the first non-zero one by the time it was recorded (the replica that
        failed, not the ones killed because of it), else 0; ``TIMEOUT_EXIT_CODE`` after the
        runtime limit. Stragglers left in a group after its replica ended are killed.
        """
        if not self._state:
            raise BackendError("nothing was started on this backend", permanent=True)
        final = self._state.get("final")
        if final:
            return Status("exited", final["exit_code"], final["message"])
        alive = self._alive_ranks()
        if alive:
            limit = self._state.get("max_runtime_s")
            if limit is not None and time.time() - self._state["started_at"] > limit:
                self._terminate(self.teardown_grace_s, f"killed after exceeding max runtime of {limit:g}s")
                self._state["killed"]["exit_code"] = TIMEOUT_EXIT_CODE
                return self._finish()
            failed = self._failed_replica(alive)
            if failed is None:
                return Status("running")
            rank, code = failed
            self._terminate(self.teardown_grace_s, f"replica {rank} exited with code {code}; the gang was torn down")
            self._state["killed"]["exit_code"] = code
        return self._finish()

    def _failed_replica(self, alive: list[int]) -> tuple[int, int] | None:
        """The first replica that ended with a non-zero code (or without recording one), if any."""
        recorded = self._recorded_exits()
        failed = [(rank, code) for rank, code, _ in recorded if code != 0]
        if failed:
            return failed[0]
        done = {rank for rank, _, _ in recorded} | set(alive)
        vanished = [r["rank"] for r in self._state["replicas"] if r["rank"] not in done]
        if vanished:
            code = self._unrecorded_code(vanished[0])
            return (vanished[0], code) if code != 0 else None
        return None

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every replica's process group, SIGKILL after ``grace_s``; verified in /proc."""
        if not self._state or self._state.get("final"):
            return
        if self._alive_ranks() or any(self._group_members(r) for r in self._state["replicas"]):
            self._terminate(grace_s, "stopped on request")
        self._finish()

    def _finish(self) -> Status:
        """Record the final status once every replica has ended; kill what is left in the groups."""
        for replica in self._state["replicas"]:
            self._signal_group(replica, signal.SIGKILL)
        self._wait_groups_empty(deadline=time.monotonic() + 5.0)
        killed = self._state.get("killed") or {}
        code = killed.get("exit_code")
        if code is None:
            codes = [c for _, c, _ in self._recorded_exits()] + self._unrecorded_exit_codes()
            code = next((c for c in codes if c != 0), 0)
        message = killed.get("reason") or self._ray_failure(code)
        message = message or ("exited" if code == 0 else f"exited with code {code}")
        message = self._out_of_memory(code, killed) or message
        if self._state.get("kind") == "ray":  # its processes have ended: their temporary directories go
            raycluster.remove_temp_dirs(Path(self._state["workspace_dir"]), Path(self._state["job_dir"]))
        self._state["final"] = {"exit_code": code, "message": message, "ended_at": time.time()}
        self._remove_cgroups()
        return Status("exited", code, message)

    def _ray_failure(self, code: int) -> str:
        """Why a Ray cluster failed, as its pod said ("" for another workload, or one that did not fail)."""
        status = self.ray_status() if code else {}
        if status.get("phase") != "failed" or not status.get("reason"):
            return ""
        return f"the Ray cluster failed: {str(status['reason'])[:300]}"

    def _terminate(self, grace_s: float, reason: str) -> None:
        """SIGTERM all groups, wait up to ``grace_s``, SIGKILL survivors; raise if any remain."""
        self._state.setdefault("killed", {"reason": reason, "signal": int(signal.SIGTERM)})
        for replica in self._state["replicas"]:
            self._signal_workload(replica, signal.SIGTERM)
        if self._wait_groups_empty(deadline=time.monotonic() + grace_s):
            return
        self._state["killed"]["signal"] = int(signal.SIGKILL)
        for replica in self._state["replicas"]:
            self._signal_group(replica, signal.SIGKILL)
        if not self._wait_groups_empty(deadline=time.monotonic() + 5.0):
            raise BackendError("processes of the job survived SIGKILL", permanent=False)

    def _wait_groups_empty(self, deadline: float) -> bool:
        while True:
            self._reap()
            if not any(self._group_members(r) for r in self._state["replicas"]):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def _signal_group(self, replica: dict[str, Any], sig: signal.Signals) -> None:
        # Only signal a group that still has members of ours: while any lives, the pgid cannot be
        # handed to a new process, so the signal cannot reach a stranger.
        if self._group_members(replica):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(replica["pgid"], sig)

    def _signal_workload(self, replica: dict[str, Any], sig: signal.Signals) -> None:
        """Signal the workload's own processes. In a sandbox that is every member of the group
        but the wrapper and bubblewrap's processes: bubblewrap dies of SIGTERM and takes the whole
        sandbox with it at once (``--die-with-parent``), which would leave the workload no grace."""
        if self._state.get("sandbox", "off") == "off":
            self._signal_group(replica, sig)
            return
        for pid in self._group_members(replica):
            if pid == replica["pid"] or _is_bwrap(pid):
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _group_members(self, replica: dict[str, Any]) -> list[int]:
        return [
            stat.pid
            for stat in _iter_stats()
            if stat.pgid == replica["pgid"] and stat.alive and stat.start_ticks >= replica["start_ticks"]
        ]

    def _reap(self) -> None:
        for proc in self._procs.values():
            proc.poll()

    def _alive_ranks(self) -> list[int]:
        self._reap()
        alive = []
        for replica in self._state.get("replicas", []):
            stat = _read_stat(replica["pid"])
            if stat and stat.alive and stat.start_ticks == replica["start_ticks"]:
                alive.append(replica["rank"])
        return alive

    def _recorded_exits(self) -> list[tuple[int, int, int]]:
        """(rank, exit code, mtime_ns) of each replica whose wrapper recorded a status, oldest first."""
        exits = []
        for replica in self._state["replicas"]:
            try:
                path = Path(replica["exit_file"])
                code = int(path.read_text().strip())
                exits.append((replica["rank"], code, path.stat().st_mtime_ns))
            except (OSError, ValueError):
                continue
        return sorted(exits, key=lambda e: (e[2], e[0]))

    def _unrecorded_exit_codes(self) -> list[int]:
        """Codes of replicas that left no status file: killed by a signal, ours or someone else's."""
        recorded = {rank for rank, _, _ in self._recorded_exits()}
        return [self._unrecorded_code(r["rank"]) for r in self._state["replicas"] if r["rank"] not in recorded]

    def _unrecorded_code(self, rank: int) -> int:
        proc = self._procs.get(rank)
        if proc is not None and proc.returncode is not None:
            return 128 - proc.returncode if proc.returncode < 0 else proc.returncode
        killed = self._state.get("killed")
        return 128 + int(killed["signal"]) if killed else UNKNOWN_EXIT_CODE

    # -- logs, artifacts, progress, inventory --------------------------------------------------

    def _log_files(self) -> tuple[list[str], str | None]:
        """The wrappers' logs, in the portal's own run directory."""
        return [replica["log"] for replica in self._state.get("replicas", [])], None

    def discover(self) -> list[GpuInfo]:
        """The declared inventory if any, else what ``nvidia-smi`` reports, else no GPU."""
        if self.inventory is not None:
            return list(self.inventory)
        if shutil.which("nvidia-smi") is None:
            return []
        query = "--query-gpu=index,name,memory.total,uuid"
        try:
            out = subprocess.run(
                ["nvidia-smi", query, "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise BackendError(f"nvidia-smi failed: {exc}", permanent=False) from exc
        return parse_nvidia_smi(out)

    def sweep_orphans(self, owner: str, keep: Keep | None = None) -> list[str]:
        """Kill the process groups started for ``owner`` (the portal's work directory) that no
        workload recorded. A group is kept when its leader is a replica of a kept state, or its
        workload's key is a kept key. The record of a start whose group is killed goes with it:
        ``adopt()`` never takes it over. Returns the keys of the groups killed."""
        keep = keep or Keep()
        pids = {int(replica["pid"]) for state in keep.states for replica in state.get("replicas", [])}
        stopped = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in pids:
                continue
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
                if len(cmdline) < 5 or cmdline[3] != b"portal-job":
                    continue
                raw = Path("/proc", entry, "environ").read_bytes().split(b"\0")
                environ = dict(item.split(b"=", 1) for item in raw if b"=" in item)
            except OSError:
                continue
            key = environ.get(b"PORTAL_JOB_KEY", b"").decode(errors="replace")
            if not owner or environ.get(b"PORTAL_OWNER", b"").decode(errors="replace") != owner or key in keep.keys:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(entry), signal.SIGKILL)  # the wrapper leads its own group
                stopped.append(key)
                # Its first argument is its replica's exit file, in the start's run directory (only
                # one under ours is read: a workload may forge a command line, not a file in there).
                run_dir = Path(os.fsdecode(cmdline[4])).parent
                if run_dir.parent == Path(self.run_dir):
                    _drop_orphan(run_dir, int(entry))
        return stopped

    # -- cgroups -------------------------------------------------------------------------------

    def _prepare_cgroups(self, spec: JobSpec, kind: str, name: str) -> tuple[list[str], dict[str, Any]]:
        """Make the workload's cgroups, named ``name`` (workers/backends/cgroups.py: a job's replicas
        each a leaf with its limits; an instance a group with its limits and its holder's leaf; a
        notebook a leaf in its instance's group). Returns, for each replica, the ``cgroup.procs``
        files its wrapper joins (":"-separated), and the state to keep. With limits on and no way
        to apply them: ``BackendError(permanent=True)`` saying why and how; nothing is started."""
        if self.resource_limits == "off":
            return [], {"applied": False, "reason": "resource limits are off (PORTAL_RESOURCE_LIMITS=off)"}
        limits = cgroups.Limits(spec.cpu_cores, spec.memory_gb, self.pids_max)
        for attempt in range(2):
            try:
                hierarchy = self._cgroup_hierarchy()
                shared = self._instance_group(hierarchy) if kind == "notebook" else None
                if shared is not None:
                    limits = shared[1]  # the instance's, which its notebooks share
                instance = shared[0] if shared is not None else None
                group, leaves = cgroups.make_workload(
                    hierarchy, name, limits, kind=kind, replicas=spec.replicas, instance=instance
                )
                break
            except FileNotFoundError:  # the portal's root group, emptied by a workload's end, went meanwhile
                if attempt:
                    raise BackendError("the portal's cgroup vanished twice while starting", permanent=False) from None
            except OSError as exc:
                transient = exc.errno in (errno.EAGAIN, errno.EBUSY, errno.ENOSPC, errno.ENOMEM)
                raise BackendError(f"could not make the workload's cgroup: {exc}", permanent=not transient) from exc
        state = {
            "applied": True,
            "version": hierarchy.version,
            "limits": limits.to_json(),
            "root": hierarchy.root.to_json(),
            "group": group.to_json(),
            "replicas": [leaf.to_json() for leaf in leaves],
        }
        return [":".join(leaf.procs_files()) for leaf in leaves], state

    def _cgroup_hierarchy(self) -> cgroups.Hierarchy:
        """Where this portal's groups go: named after its run directory, so that portals sharing
        the machine never share one."""
        portal = hashlib.sha256(os.path.abspath(self.run_dir).encode()).hexdigest()[:12]
        try:
            return cgroups.open_hierarchy(self.cgroup_root, portal)
        except cgroups.Unavailable as exc:
            raise BackendError(
                f"workloads cannot be held to their CPU, memory and process limits: {exc}. Run the portal "
                "where it can create cgroups (as root, or with a delegated cgroup v2 subtree; see "
                "docs/security.md), or, on a single-user workstation only, set PORTAL_RESOURCE_LIMITS=off "
                "to run workloads without limits.",
                permanent=True,
            ) from exc

    def _instance_group(self, hierarchy: cgroups.Hierarchy) -> tuple[cgroups.Group, cgroups.Limits] | None:
        """The group and limits of the instance a notebook runs on (from the instance's state, see
        ``start_notebook()``), where it has one of this portal's that still exists; else ``None``:
        the notebook gets a group of its own, with the instance's size."""
        state = self._instance_cgroup
        if not state.get("applied") or not state.get("group") or not state.get("limits"):
            return None
        group = cgroups.Group.from_json(state["group"])
        if not hierarchy.holds(group) or not group.exists():
            return None
        return group, cgroups.Limits.from_json(state["limits"])

    def _out_of_memory(self, code: int, killed: dict[str, Any]) -> str:
        """The message of a workload that failed after the kernel killed a process of it for going
        past its memory, "killed: out of memory (limit 4 GiB)"; "" otherwise, and for a stop or a
        timeout. Read before the groups are removed, with the count kept in the state."""
        cgroup = self._state.get("cgroup") or {}
        if code == 0 or not cgroup.get("limits") or (killed and killed.get("exit_code") in (None, TIMEOUT_EXIT_CODE)):
            return ""
        cgroup["oom_kills"] = sum(cgroups.oom_kills(cgroups.Group.from_json(leaf)) for leaf in cgroup["replicas"])
        if not cgroup["oom_kills"]:
            return ""
        return f"killed: out of memory (limit {cgroups.Limits.from_json(cgroup['limits']).memory_text()})"

    def _remove_cgroups(self) -> None:
        """Remove the workload's group, and what runs in it still (a process that left its process
        group does not outlive the workload); a notebook's is its leaf in its instance's group."""
        cgroup = self._state.get("cgroup") or {}
        if cgroup.get("group"):
            cgroups.remove(cgroups.Group.from_json(cgroup["group"]))
            cgroups.prune(cgroups.Group.from_json(cgroup["root"]))
        for path in cgroup.get("paths", []):  # the groups of a state written before cgroups.py
            with contextlib.suppress(OSError):
                os.rmdir(path)


# -- helpers -----------------------------------------------------------------------------------


def _memfd(data: bytes) -> int:
    """An anonymous file holding ``data``, positioned at its start, for a child to read."""
    fd = os.memfd_create("portal-sandbox-args")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _is_bwrap(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "bwrap"
    except OSError:
        return False


class _Stat:
    __slots__ = ("pid", "state", "pgid", "start_ticks")

    def __init__(self, pid: int, state: str, pgid: int, start_ticks: int) -> None:
        self.pid, self.state, self.pgid, self.start_ticks = pid, state, pgid, start_ticks

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X", "x")


def _read_stat(pid: int) -> _Stat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = raw[raw.rindex(")") + 2 :].split()
    return _Stat(pid, fields[0], int(fields[2]), int(fields[19]))


def _iter_stats() -> Iterator[_Stat]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _read_stat(int(entry))
            if stat is not None:
                yield stat


def _free_port() -> int:
    # The port is free now; a process could take it before rank 0 binds it (a small, known race).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _read_record(run_dir: Path) -> dict[str, Any] | None:
    """The state a start left in its run directory (``_START_RECORD``), if any."""
    try:
        record = json.loads((run_dir / _START_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("replicas"), list) else None


def _drop_orphan(run_dir: Path, pid: int) -> None:
    """Forget the start that spawned the orphan ``pid``: its record, and its cgroup, with whatever
    still runs in it."""
    record = _read_record(run_dir)
    if record is not None and pid in [replica.get("pid") for replica in record["replicas"]]:
        cgroup = record.get("cgroup") or {}
        if cgroup.get("group"):
            with contextlib.suppress(ValueError, KeyError):
                cgroups.remove(cgroups.Group.from_json(cgroup["group"]))
                cgroups.prune(cgroups.Group.from_json(cgroup["root"]))
    _drop_record(run_dir, pid=pid)


def _drop_record(run_dir: Path, *, started_at: Any = None, pid: int | None = None) -> None:
    """Remove the record of a start (the one begun at ``started_at``, or the one that spawned
    ``pid``); the record of a later start in the same directory stays."""
    record = _read_record(run_dir)
    if record is None or (started_at is not None and record.get("started_at") != started_at):
        return
    if pid is not None and pid not in [replica.get("pid") for replica in record["replicas"]]:
        return
    with contextlib.suppress(OSError):
        (run_dir / _START_RECORD).unlink()


def _copy_json(value: dict[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(value))
    return copied


def parse_nvidia_smi(out: str) -> list[GpuInfo]:
    """Parse ``nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,nounits``."""
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            gpus.append(GpuInfo(index=parts[0], name=parts[1], memory_mb=int(float(parts[2])), uuid=parts[3]))
    return gpus


def _answers(url: str, headers: dict[str, str]) -> bool:
    """Whether ``url`` answers 200 (see ``http_get()``)."""
    try:
        return http_get(url, headers=headers, timeout=2)[0] == 200
    except OSError:
        return False


def _tail(path: str, lines: int = 5) -> str:
    data, _ = read_log(path, 0)
    return " | ".join(data.decode(errors="replace").strip().splitlines()[-lines:])
