"""The contract every orchestration backend implements (modelled on JupyterHub's Spawner).

Nothing here imports Django: a backend is plain Python, driven by Celery tasks that own the row.
"""

from __future__ import annotations

import contextlib
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from workers.backends.steps import StartSteps

#: The layout of every backend's state blob: ``load_state()`` refuses a blob of another version.
STATE_VERSION = 1
#: Exit codes a backend reports where the workload left none of its own (those of timeout(1) and shells).
TIMEOUT_EXIT_CODE = 124  # killed for running past its time limit (``max_runtime_s``)
STOPPED_EXIT_CODE = 143  # stopped on request (SIGTERM)
UNKNOWN_EXIT_CODE = 255  # ended without an exit code the backend could learn (killed from outside, a node failure)
#: A job's self-reported progress: a line ``PROGRESS <fraction>`` in its output.
PROGRESS_RE = re.compile(rb"^PROGRESS\s+([0-9]*\.?[0-9]+)\s*$", re.MULTILINE)

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_DEVICE_RE = re.compile(r"^[0-9]{1,3}$")
_RESERVED_ENV = {"CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}


class PolicyRefusal(Exception):
    """The request breaks a rule the user can fix (a bad env key, an artifact path outside the job).

    The caller shows the message to the user as is, without a traceback, and does not retry.
    """


class BackendError(Exception):
    """The backend could not do what was asked.

    ``permanent=False`` (transient: out of pids, a cluster API timing out) may be retried by the
    caller with backoff; ``permanent=True`` (a malformed spec, a job that already ran) must not be.
    """

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


@dataclass(frozen=True)
class RunAs:
    """The Unix account a workspace's workloads run as: created by the portal for each workspace
    when it runs as root (a sandboxed local workload, a Slurm job submitted as that account)."""

    user: str
    uid: int
    gid: int


@dataclass(frozen=True)
class DiskQuota:
    """The disk a workspace's directory is limited to, where a backend enforces it (local: the
    directory is a filesystem image of ``size_bytes`` mounted on it, workers/backends/diskquota.py).
    ``image`` is the image's path in the portal's private directory, named after the workspace's
    id (never reused, unchanged by a rename); ``directory`` the workspace's directory."""

    image: str
    directory: str
    size_bytes: int


@dataclass
class JobSpec:
    """What the caller asks a backend to run: one job, ``replicas`` processes started as a gang.

    ``devices[r]`` lists the GPU indices replica ``r`` may use (a fractional GPU shares its index
    with others); an empty ``devices`` means no GPU for any replica. ``cpu_cores`` and ``memory_gb``
    are per replica. ``artifact_paths`` are relative to the job's directory under ``work_dir``.
    ``max_runtime_s`` of ``None`` means no limit. ``run_as`` is the workspace's own Unix account
    (``None``: the portal's own user, in a user namespace where the backend sandboxes).
    ``service_account_token``: on Kubernetes, mount a service-account token into the pods (off: none).
    ``portal_env``: what lets the workload use the portal's SDK and CLI at once (``GPUPORTAL_URL``,
    ``GPUPORTAL_WORKSPACE``, and ``GPUPORTAL_TOKEN``, a secret: see :data:`PORTAL_ENV_SECRET`), set
    after ``env``, so that a job's own variables cannot replace them.
    ``writable_dir``: where a backend that confines workloads to their files (local) lets this one
    read and write: that directory alone, which holds the workload's own; empty: its workspace's.
    ``disk``: its workspace's disk quota, where the portal enforces one (``None``: no limit here).
    ``reservation``: on Slurm, the reservation (a GPU provisioning request's, see
    workers/backends/slurm_reservations.py) it runs in, submitted with ``--reservation``; empty: none.
    Other backends ignore it.
    """

    key: str
    workspace: str
    name: str
    command: str
    work_dir: str
    image: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    replicas: int = 1
    devices: list[list[str]] = field(default_factory=list)
    cpu_cores: float = 1.0
    memory_gb: float = 1.0
    max_runtime_s: float | None = None
    artifact_paths: list[str] = field(default_factory=list)
    run_as: RunAs | None = None
    service_account_token: bool = False
    portal_env: dict[str, str] = field(default_factory=dict)
    writable_dir: str = ""
    disk: DiskQuota | None = None
    reservation: str = ""


@dataclass
class InstanceSpec:
    """An instance: a share of a cluster reserved for a workspace's people to work in.

    ``kind`` is the compute profile's kind (``slice``, ``namespace``, ``vcluster``, ``dedicated``);
    ``devices`` the GPU indices it holds (its notebooks run on them); ``users`` the usernames that
    may use it (the Kubernetes backend binds them to its namespace); ``portal_env`` and
    ``writable_dir`` as for a job (an instance's is its own directory: it may be shared with people
    who are not the workspace's), ``disk`` and ``reservation`` (Slurm's: its allocation is a job in
    that reservation).
    """

    key: str
    workspace: str
    name: str
    work_dir: str
    kind: str = "slice"
    devices: list[str] = field(default_factory=list)
    gpu_type: str = ""
    gpus: float = 0.0
    cpu_cores: float = 1.0
    memory_gb: float = 1.0
    users: list[str] = field(default_factory=list)
    run_as: RunAs | None = None
    portal_env: dict[str, str] = field(default_factory=dict)
    writable_dir: str = ""
    disk: DiskQuota | None = None
    reservation: str = ""


@dataclass
class NotebookSpec:
    """A Jupyter server on an instance, served by the portal's proxy on a host name of its own.

    ``base_url`` is ``/`` (the root of the notebook's own host; the proxy routes the host to the
    server); ``token`` is the server's secret.
    ``python_packages`` (pip requirements) build its environment where the backend runs
    processes (local, Slurm); ``image`` is its container image on Kubernetes. ``devices`` are
    its instance's GPUs and ``instance_state`` that instance's backend state (its namespace, say;
    on the local backend its cgroup, which the notebook's processes join: they share its limits).
    ``auth_url`` is where the server asks the portal whether a request's user may pass.
    ``service_account_token``: on Kubernetes, mount a service-account token into the pod (off: none).
    ``portal_env`` as for a job: its kernels and terminals have the SDK and CLI at once.
    ``writable_dir`` as for a job (a notebook's is its instance's directory).
    ``disk`` as for a job.
    """

    key: str
    workspace: str
    name: str
    work_dir: str
    base_url: str
    token: str
    python_packages: list[str] = field(default_factory=list)
    image: str = ""
    devices: list[str] = field(default_factory=list)
    cpu_cores: float = 1.0
    memory_gb: float = 1.0
    instance_state: dict[str, Any] = field(default_factory=dict)
    auth_url: str = ""
    run_as: RunAs | None = None
    service_account_token: bool = False
    portal_env: dict[str, str] = field(default_factory=dict)
    writable_dir: str = ""
    disk: DiskQuota | None = None


@dataclass
class NodeGroup:
    """One role of a framework cluster (its head, its workers): ``replicas`` alike nodes, each with
    ``gpus`` GPUs of ``gpu_type`` (``devices[r]``: the GPU indices node ``r`` may use, where the
    backend places them itself: local), ``cpu_cores`` and ``memory_gb``."""

    role: str
    replicas: int = 1
    gpu_type: str = ""
    gpus: float = 0.0
    cpu_cores: float = 1.0
    memory_gb: float = 1.0
    devices: list[list[str]] = field(default_factory=list)


@dataclass
class RayClusterSpec:
    """A Ray cluster: a head and ``workers.replicas`` worker nodes, run together as one gang.

    ``auth_token`` is the cluster's own Ray token (``RAY_AUTH_MODE=token``): a secret, reaching the
    cluster's nodes through their environment only. ``entrypoint``: a shell command run as the
    cluster's Ray job once every node joined (a fire-and-forget Ray job: the cluster ends with it,
    with its exit code); empty: the cluster runs until it is stopped. ``image`` is the container
    image on Kubernetes; ``env``, ``run_as``, ``portal_env``, ``writable_dir`` and ``disk`` as for a
    job; ``artifact_paths`` as for a job, relative to the cluster's directory.
    """

    key: str
    workspace: str
    name: str
    work_dir: str
    auth_token: str
    head: NodeGroup = field(default_factory=lambda: NodeGroup("head"))
    workers: NodeGroup = field(default_factory=lambda: NodeGroup("worker", replicas=0))
    entrypoint: str = ""
    image: str = ""
    env: dict[str, str] = field(default_factory=dict)
    artifact_paths: list[str] = field(default_factory=list)
    max_runtime_s: float | None = None
    run_as: RunAs | None = None
    portal_env: dict[str, str] = field(default_factory=dict)
    writable_dir: str = ""
    disk: DiskQuota | None = None

    @property
    def groups(self) -> tuple[NodeGroup, NodeGroup]:
        return (self.head, self.workers)


#: The variable of ``portal_env`` that is a credential: it reaches a workload through its
#: environment only (never a command line, a manifest's plain value or a log).
PORTAL_ENV_SECRET = "GPUPORTAL_TOKEN"


@dataclass
class InferenceSpec:
    """One replica of an inference endpoint: an OpenAI-compatible server (``server``, a kind of
    workers/backends/servers.py) loading ``model_path`` (inside ``work_dir``, the workspace's
    directory) and answering for it as ``served_name``, with ``extra_args`` (its profile's).
    ``devices`` are its GPU indices where the backend places them itself (local); ``gpu_type``,
    ``gpus``, ``cpu_cores`` and ``memory_gb`` its size; ``image`` its container image on Kubernetes.
    ``endpoint`` names the endpoint it serves (the Kubernetes backend's Service selects by it).
    ``start_timeout_s``: how long the server may take to load the model and answer.
    ``api_key``: the replica's own secret (the server refuses a request without it; the portal's
    proxy adds it), reaching the server through its environment only.
    ``run_as`` and ``disk`` as for a job. It gets no portal token: a server acts for nobody.
    """

    key: str
    workspace: str
    name: str
    work_dir: str
    server: str
    model_path: str
    served_name: str
    endpoint: str = ""
    extra_args: list[str] = field(default_factory=list)
    image: str = ""
    devices: list[str] = field(default_factory=list)
    gpu_type: str = ""
    gpus: float = 0.0
    cpu_cores: float = 1.0
    memory_gb: float = 1.0
    start_timeout_s: float = 600.0
    api_key: str = ""
    run_as: RunAs | None = None
    disk: DiskQuota | None = None


Spec = JobSpec | InstanceSpec | NotebookSpec | RayClusterSpec | InferenceSpec


@dataclass(frozen=True)
class Endpoint:
    """Where a started workload can be reached (for a gang: its rendezvous address)."""

    host: str
    port: int
    url: str = ""


@dataclass(frozen=True)
class Status:
    """What ``poll()`` saw: ``running``, or ``exited`` with the job's exit code."""

    state: Literal["running", "exited"]
    exit_code: int | None = None
    message: str = ""

    @property
    def running(self) -> bool:
        return self.state == "running"


@dataclass(frozen=True)
class Progress:
    """Self-reported progress: the last ``PROGRESS <fraction>`` line a job printed."""

    fraction: float | None
    line: str = ""


class Artifact(NamedTuple):
    """One file a job left behind: its path relative to the job directory, size and sha256 (hex)."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ArtifactLimits:
    """How much of a job's output the portal records: at most ``max_files`` files and ``max_bytes``
    bytes in all, counted by apparent size (a sparse file counts as large as it claims to be)."""

    max_files: int = 10_000
    max_bytes: int = 10 << 30


@dataclass(frozen=True)
class LeftOut:
    """Files found under the declared paths but not recorded, and their apparent size in all."""

    files: int = 0
    size: int = 0
    more: bool = False  # the listing stopped counting: there are more files than ``files``


@dataclass(frozen=True)
class Artifacts:
    """What ``artifacts()`` found: the files recorded (sorted by path), and those left out for
    passing ``limits`` (``over_count``: beyond the number of files, ``over_size``: beyond the size)."""

    files: list[Artifact] = field(default_factory=list)
    limits: ArtifactLimits = ArtifactLimits()
    over_count: LeftOut = LeftOut()
    over_size: LeftOut = LeftOut()

    def note(self) -> str:
        """What to tell the job's owner ("" when every file was recorded): "artifacts not collected:
        3 files of 60 GiB exceed the limit of 10 GiB"."""
        parts = []
        if self.over_count.files:
            many = f"more than {self.over_count.files:,}" if self.over_count.more else f"{self.over_count.files:,}"
            parts.append(f"{many} {_files(self.over_count.files)} exceed the limit of {self.limits.max_files:,} files")
        if self.over_size.files:
            parts.append(
                f"{self.over_size.files:,} {_files(self.over_size.files)} of {format_bytes(self.over_size.size)} "
                f"exceed the limit of {format_bytes(self.limits.max_bytes)}"
            )
        return f"artifacts not collected: {'; '.join(parts)}" if parts else ""


def _files(count: int) -> str:
    return "file" if count == 1 else "files"


def format_bytes(size: int) -> str:
    """A size in binary units, short: "512 bytes", "4 KiB", "1.5 GiB", "60 GiB"."""
    if size < 1024:
        return f"{size} bytes"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    return f"{value:.1f}".removesuffix(".0") + f" {unit}"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of the inventory, as ``discover()`` reports it."""

    index: str
    name: str
    memory_mb: int
    uuid: str = ""


@dataclass(frozen=True)
class Keep:
    """What an orphan sweep leaves alone: the states (``get_state()`` blobs) of the workloads the portal
    recorded on the backend's cluster, and the keys of the workloads being started right now (whose
    state is not recorded yet)."""

    states: tuple[dict[str, Any], ...] = ()
    keys: frozenset[str] = frozenset()


class Backend(ABC):
    """Runs workloads somewhere: this machine, a Slurm cluster, a Kubernetes cluster.

    **How a backend is driven.** One backend object serves one workload. The caller (a Celery
    task) gets it from ``workers/backends/registry.py: backend_for(cluster, state)``, which builds it
    from the cluster's settings and calls ``load_state()`` with the JSON blob saved on the workload's
    row (none for a new workload); it calls one or more hooks, then saves ``get_state()`` back on the
    row. A worker may die between any two calls: everything a backend needs to find its workload
    again goes into that blob, never into memory alone.

    **What the caller owns, so that backends stay small.** Timeouts around every hook, retries
    (only of ``BackendError`` with ``permanent=False``, with backoff), cleanup on failure (if
    ``start()`` raises, the caller calls ``stop()`` and then ``clear_state()``), persisting the
    state blob, and reconciling: a periodic task polls every running workload and converges the
    row to what ``poll()`` says, and asks each cluster's backend to ``sweep_orphans()``. A start
    whose worker died is taken over with ``adopt()`` before it is started again (see there).

    **Errors.** ``PolicyRefusal``: the user asked for something not allowed; the message is shown
    to them, nothing is retried. ``BackendError(message, permanent=...)``: the backend failed;
    transient ones may be retried, permanent ones fail the workload. Any other exception is a bug.

    **What to override.** The abstract hooks (``poll``, ``stop``, the state, ``logs``, ``progress``)
    always; ``start_job``, ``start_instance``, ``start_notebook`` and ``start_ray_cluster`` for the
    kinds of workload the backend runs (``start()`` dispatches to them; it refuses a spec it does
    not know); the others where their default does not fit:
    ``artifacts()`` (none), ``kubeconfig()`` (none), ``discover()`` and ``nodes()`` (no inventory),
    ``sweep_orphans()`` (nothing to sweep), ``adopt()`` (finds nothing), ``polling()`` (none).
    Hooks must be idempotent where the caller may repeat them: ``stop()`` on a stopped workload and
    ``poll()`` after the exit are harmless and return the same answer. Helpers a backend shares
    with another live here or in a module of their own (``files``, ``processes``); no backend
    imports another.
    """

    #: The name the backend is chosen by in settings.
    name: str = ""
    #: Where a start reports its steps as it takes them (workers/backends/steps.py): set by the
    #: caller before ``start()``; None where nobody listens. A start hook reports each step it takes
    #: (``steps.begin``: building the environment, starting the processes, waiting for an answer).
    steps: StartSteps | None = None

    # -- start ---------------------------------------------------------------------------------

    def start(self, spec: Spec) -> Endpoint:
        """Start the workload and return once it is really running (not merely submitted).

        The spec says which kind of workload, and this calls the hook for it: ``start_job()``,
        ``start_instance()`` or ``start_notebook()`` (a backend overrides those; it may wrap this
        to check its state first). Returns where the workload can be reached. Calling ``start()``
        again while the same workload runs returns the same endpoint. Raises ``PolicyRefusal`` for
        a spec the user must fix, ``BackendError`` otherwise; on either, nothing of the workload is
        left running.
        """
        if isinstance(spec, JobSpec):
            return self.start_job(spec)
        if isinstance(spec, InstanceSpec):
            return self.start_instance(spec)
        if isinstance(spec, NotebookSpec):
            return self.start_notebook(spec)
        if isinstance(spec, RayClusterSpec):
            return self.start_ray_cluster(spec)
        if isinstance(spec, InferenceSpec):
            return self.start_inference(spec)
        raise BackendError(f"no backend starts a {type(spec).__name__}", permanent=True)

    def adopt(self, spec: Spec) -> Endpoint | None:
        """Take over a start of ``spec`` that a worker made and never recorded, instead of starting it again.

        The caller calls it on a backend with no state, before ``start()``, when it takes over the
        stale claim of a start that died: the worker may have died after the workload was started
        but before ``get_state()`` was saved. Find a workload this backend started earlier under
        ``spec.key`` whose start was never recorded; if one exists, running or already ended (its
        exit code kept), take it over: from then on ``get_state()``, ``poll()``, ``logs()``,
        ``progress()``, ``artifacts()`` and ``stop()`` act on it exactly as if this backend had
        started it, and its endpoint is returned (once it can be reached, as ``start()`` would).
        Otherwise return ``None`` and change nothing: the caller then calls ``start()``.

        A start that was recorded (its state came back through ``load_state()``), given up
        (``clear_state()``) or swept as an orphan is never taken over; neither is one that does not
        match the spec as a whole (a gang with only some of its replicas, other devices): what of
        it still runs is stopped, and ``None`` returned, so that the start that follows runs alone.
        Raises as ``start()`` does. Default: ``None``, this backend cannot find its workloads by key.
        """
        return None

    def start_job(self, spec: JobSpec) -> Endpoint:
        """Start a job's ``replicas`` as a gang; return its rendezvous address (``MASTER_ADDR``,
        ``MASTER_PORT``). ``PolicyRefusal`` for env or artifact paths the job may not have (see
        ``validate_spec()``). Default: ``BackendError(permanent=True)``, this backend runs no jobs."""
        raise self._cannot_run("jobs")

    def start_instance(self, spec: InstanceSpec) -> Endpoint:
        """Reserve an instance's share of the cluster (its GPUs, its namespace...) until it is stopped.
        Default: ``BackendError(permanent=True)``, this backend runs no instances."""
        raise self._cannot_run("instances")

    def start_notebook(self, spec: NotebookSpec) -> Endpoint:
        """Start a notebook's Jupyter server on its instance; return once the server answers, with
        the URL the portal's proxy sends its requests to. Default: ``BackendError(permanent=True)``,
        this backend runs no notebooks."""
        raise self._cannot_run("notebooks")

    def start_ray_cluster(self, spec: RayClusterSpec) -> Endpoint:
        """Start a Ray cluster's head and workers as one gang; return once every node joined, with
        ``url`` the address the portal's proxy sends the cluster's dashboard and Jobs API requests
        to. Default: ``BackendError(permanent=True)``, this backend runs no Ray clusters."""
        raise self._cannot_run("Ray clusters")

    def start_inference(self, spec: InferenceSpec) -> Endpoint:
        """Start one replica of an inference endpoint; return once its server answers (its model
        loaded), with ``url`` the address the portal's proxy sends the endpoint's requests to.
        ``BackendError`` (transient) with the server's last log lines where it exited or did not
        answer in time (it is stopped first). Default: ``BackendError(permanent=True)``, this
        backend serves no models."""
        raise self._cannot_run("inference servers")

    def _cannot_run(self, what: str) -> BackendError:
        return BackendError(f"the {self.name or type(self).__name__} backend cannot run {what}", permanent=True)

    # -- poll / stop ---------------------------------------------------------------------------

    @abstractmethod
    def poll(self) -> Status:
        """Return ``Status("running")`` or ``Status("exited", exit_code, message)``.

        A workload has exited only when all its replicas have ended; the exit code is then the
        first non-zero one, else 0, and the message says why (a failed replica, a runtime limit,
        a stop). Where the workload left no code of its own, the code is one of this module's
        ``TIMEOUT_EXIT_CODE``, ``STOPPED_EXIT_CODE`` or ``UNKNOWN_EXIT_CODE``. Once exited, later
        polls return the same status. Raises ``BackendError`` when the truth cannot be learned
        (transient) or the state is unusable (permanent).
        """

    @abstractmethod
    def stop(self, grace_s: float = 10.0) -> None:
        """Ask every replica to end (SIGTERM or the cluster's equivalent), force it after ``grace_s``.

        Returns once nothing of the workload is left running. A no-op on a workload that has
        ended or never started. Raises ``BackendError`` (transient) if something survived.
        """

    # -- state ---------------------------------------------------------------------------------

    @abstractmethod
    def get_state(self) -> dict[str, Any]:
        """Return a JSON-serialisable blob from which a new backend object can reattach.

        It holds ``"version": STATE_VERSION``, so that a later layout can tell it apart."""

    @abstractmethod
    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state()`` returned, possibly in another process after a restart.

        Raises ``BackendError(permanent=True)`` for a blob this backend cannot read.
        """

    @abstractmethod
    def clear_state(self) -> None:
        """Forget the workload (after it ended and its outcome was recorded, or after a failed start)."""

    # -- what the workload left ----------------------------------------------------------------

    @abstractmethod
    def logs(self, replica: int = 0, offset: int = 0) -> tuple[bytes, int]:
        """Return the log bytes of ``replica`` from ``offset`` on, and the offset to continue from.

        Works while the workload runs and after it ended; returns ``(b"", offset)`` when there is
        nothing new. Raises ``BackendError(permanent=True)`` for a replica that does not exist.
        """

    def artifacts(self, limits: ArtifactLimits | None = None) -> Artifacts:
        """Return the files under the declared artifact paths, ``(path, size, sha256)`` sorted by
        path, within ``limits`` (default: ``ArtifactLimits()``): files past them are counted, by
        apparent size and before any byte is read (a sparse file claiming terabytes costs nothing),
        and not recorded.

        Called once the workload ended, never inside a database transaction: it reads every byte
        it records. The sha256 is of the whole file (holes read as zeros without reading them).
        Default: nothing, this backend keeps no files the portal can read."""
        return Artifacts(limits=limits or ArtifactLimits())

    @abstractmethod
    def progress(self) -> Progress | None:
        """Return the last ``PROGRESS <fraction>`` (0..1) the job printed, or ``None`` if none yet
        (``last_progress()`` reads it from the end of a log)."""

    def kubeconfig(self) -> str | None:
        """A kubeconfig (YAML) for the workload's users, where it has one (a Kubernetes namespace
        instance). ``BackendError`` (transient) while it is being issued. Default: ``None``, this
        backend has none."""
        return None

    # -- the cluster ---------------------------------------------------------------------------

    def discover(self) -> list[GpuInfo]:
        """Return the GPUs this backend can place work on (the inventory), in index order; on a
        cluster of several nodes each index is ``<node>:<i>``. ``BackendError`` where the cluster
        does not answer; ``PolicyRefusal`` where its settings name nothing to discover (a Slurm
        partition without nodes). Default: ``PolicyRefusal``, this backend cannot discover its GPUs."""
        raise PolicyRefusal(f"The {self.name or type(self).__name__} backend cannot discover its nodes and GPUs.")

    def nodes(self) -> list[NodeInfo]:
        """Return the nodes that hold the GPUs of ``discover()`` (and those of the cluster's pool
        that hold none), with their CPUs, memory and state. Default: one ``NodeInfo`` per node named
        by ``discover()``'s indices, its CPUs and memory unknown, ready."""
        names = dict.fromkeys(gpu.index.rpartition(":")[0] for gpu in self.discover())
        return [NodeInfo(name) for name in names if name]

    def polling(self, states: Iterable[dict[str, Any]]) -> AbstractContextManager[None]:
        """Within it, ``poll()`` of this cluster's workloads whose states are among ``states``
        (``get_state()`` blobs) may answer from one query of the cluster about all of them made on
        entry, instead of a query each: a reconcile pass polls thousands. What it says is as old as
        the pass; a workload it has no answer for is asked as ``poll()`` asks alone; it raises
        nothing a single poll would not. Only ``poll()`` and ``progress()`` (the pods it reads) may
        use it (a stop, a start, ``adopt()`` need fresh answers). Default: nothing, each asks for
        itself."""
        return contextlib.nullcontext()

    def sweep_orphans(self, owner: str, keep: Keep | None = None) -> list[str]:
        """Stop what this backend started for ``owner`` (the portal's work directory: it tells one
        portal's workloads from another's) that no workload recorded, what a worker that died
        between starting a workload and saving its state left behind; everything ``keep`` names
        stays. Returns what was stopped (keys or the cluster's ids), for the log. ``BackendError``
        where the cluster cannot be asked. Default: ``[]``, nothing to sweep (a backend that names
        what it creates after the workload finds it again when the start is repeated)."""
        return []


@dataclass(frozen=True)
class NodeInfo:
    """One node of the inventory, as ``nodes()`` reports it: ``cpu_cores`` and ``memory_mb`` (0 where
    unknown), ``state`` (``ready``; ``drained``: no new work; ``down``) and the ``pool`` it is filed
    in (a Slurm partition)."""

    name: str
    cpu_cores: int = 0
    memory_mb: int = 0
    state: Literal["ready", "drained", "down"] = "ready"
    pool: str = "default"


def validate_spec(spec: JobSpec) -> None:
    """``BackendError(permanent=True)`` for a job no backend can run (an unsafe key, a replica count
    its devices do not match); ``PolicyRefusal`` for env or artifact paths the user must change."""
    if not _KEY_RE.match(spec.key):
        raise BackendError(f"job key {spec.key!r} is not a safe directory name", permanent=True)
    if spec.replicas < 1:
        raise BackendError("a job needs at least one replica", permanent=True)
    if spec.devices and len(spec.devices) != spec.replicas:
        raise BackendError(f"{len(spec.devices)} device lists for {spec.replicas} replicas", permanent=True)
    if any(not _DEVICE_RE.match(d) for replica in spec.devices for d in replica):
        raise BackendError(f"device indices must be small integers: {spec.devices}", permanent=True)
    for key, value in spec.env.items():
        if not _ENV_KEY_RE.match(key):
            raise PolicyRefusal(f"{key!r} is not a valid environment variable name")
        if key in _RESERVED_ENV or key.startswith("PORTAL_"):
            raise PolicyRefusal(f"{key} is set by the portal and cannot be overridden")
        if "\0" in value:
            raise PolicyRefusal(f"the value of {key} contains a NUL byte")
    for declared in spec.artifact_paths:
        normal = os.path.normpath(declared)
        if os.path.isabs(declared) or normal == ".." or normal.startswith("../") or normal.startswith(".portal"):
            raise PolicyRefusal(f"artifact path {declared!r} must be relative and inside the job directory")


def last_progress(output: bytes) -> Progress | None:
    """The last ``PROGRESS <fraction>`` line in ``output`` (a log's tail), clamped to 0..1."""
    matches = list(PROGRESS_RE.finditer(output))
    if not matches:
        return None
    last = matches[-1]
    return Progress(min(1.0, max(0.0, float(last.group(1)))), last.group(0).decode("utf-8", "replace").strip())
