"""The contract every orchestration backend implements (modelled on JupyterHub's Spawner).

Nothing here imports Django: a backend is plain Python, driven by Celery tasks that own the row.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple


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


@dataclass
class InstanceSpec:
    """An instance: a share of a cluster reserved for a workspace's people to work in.

    ``kind`` is the compute profile's kind (``slice``, ``namespace``, ``vcluster``, ``dedicated``);
    ``devices`` the GPU indices it holds (its notebooks run on them); ``users`` the usernames that
    may use it (the Kubernetes backend binds them to its namespace); ``portal_env`` as for a job.
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


@dataclass
class NotebookSpec:
    """A Jupyter server on an instance, served by the portal's proxy on a host name of its own.

    ``base_url`` is ``/`` (the root of the notebook's own host; the proxy routes the host to the
    server); ``token`` is the server's secret.
    ``python_packages`` (pip requirements) build its environment where the backend runs
    processes (local, Slurm); ``image`` is its container image on Kubernetes. ``devices`` are
    its instance's GPUs and ``instance_state`` that instance's backend state (its namespace, say).
    ``auth_url`` is where the server asks the portal whether a request's user may pass.
    ``service_account_token``: on Kubernetes, mount a service-account token into the pod (off: none).
    ``portal_env`` as for a job: its kernels and terminals have the SDK and CLI at once.
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


#: The variable of ``portal_env`` that is a credential: it reaches a workload through its
#: environment only (never a command line, a manifest's plain value or a log).
PORTAL_ENV_SECRET = "GPUPORTAL_TOKEN"

Spec = JobSpec | InstanceSpec | NotebookSpec


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
class GpuInfo:
    """One GPU of the inventory, as ``discover()`` reports it."""

    index: str
    name: str
    memory_mb: int
    uuid: str = ""


class Backend(ABC):
    """Runs workloads somewhere: this machine, a Slurm cluster, a Kubernetes cluster.

    **How a backend is driven.** One backend object serves one workload. The caller (a Celery
    task) creates it, calls ``load_state()`` with the JSON blob saved on the workload's row (empty
    for a new workload), calls one or more hooks, then saves ``get_state()`` back on the row. A
    worker may die between any two calls: everything a backend needs to find its workload again
    goes into that blob, never into memory alone.

    **What the caller owns, so that backends stay small.** Timeouts around every hook, retries
    (only of ``BackendError`` with ``permanent=False``, with backoff), cleanup on failure (if
    ``start()`` raises, the caller calls ``stop()`` and then ``clear_state()``), persisting the
    state blob, and reconciling: a periodic task polls every running workload and converges the
    row to what ``poll()`` says.

    **Errors.** ``PolicyRefusal``: the user asked for something not allowed; the message is shown
    to them, nothing is retried. ``BackendError(message, permanent=...)``: the backend failed;
    transient ones may be retried, permanent ones fail the workload. Any other exception is a bug.

    **What to override.** Every hook below (they are abstract); the base class implements none of them.
    Hooks must be idempotent where the caller may repeat them: ``stop()`` on a stopped workload
    and ``poll()`` after the exit are harmless and return the same answer.
    """

    #: The name the backend is chosen by in settings.
    name: str = ""

    @abstractmethod
    def start(self, spec: Spec) -> Endpoint:
        """Start the workload and return once it is really running (not merely submitted).

        The spec says which kind of workload: a job, an instance or a notebook (a notebook is
        running once its server answers). A backend that cannot run a kind raises
        ``BackendError(permanent=True)``. Returns where it can be reached. Calling ``start()``
        again while the same workload runs returns the same endpoint. Raises ``PolicyRefusal``
        for a spec the user must fix, ``BackendError`` otherwise; on either, nothing of the workload is left running.
        """

    @abstractmethod
    def poll(self) -> Status:
        """Return ``Status("running")`` or ``Status("exited", exit_code, message)``.

        A workload has exited only when all its replicas have ended; the exit code is then the
        first non-zero one, else 0, and the message says why (a failed replica, a runtime limit,
        a stop). Once exited, later polls return the same status. Raises ``BackendError`` when
        the truth cannot be learned (transient) or the state is unusable (permanent).
        """

    @abstractmethod
    def stop(self, grace_s: float = 10.0) -> None:
        """Ask every replica to end (SIGTERM or the cluster's equivalent), force it after ``grace_s``.

        Returns once nothing of the workload is left running. A no-op on a workload that has
        ended or never started. Raises ``BackendError`` (transient) if something survived.
        """

    @abstractmethod
    def get_state(self) -> dict[str, Any]:
        """Return a JSON-serialisable blob from which a new backend object can reattach."""

    @abstractmethod
    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state()`` returned, possibly in another process after a restart.

        Raises ``BackendError(permanent=True)`` for a blob this backend cannot read.
        """

    @abstractmethod
    def clear_state(self) -> None:
        """Forget the workload (after it ended and its outcome was recorded, or after a failed start)."""

    @abstractmethod
    def logs(self, replica: int = 0, offset: int = 0) -> tuple[bytes, int]:
        """Return the log bytes of ``replica`` from ``offset`` on, and the offset to continue from.

        Works while the workload runs and after it ended; returns ``(b"", offset)`` when there is
        nothing new. Raises ``BackendError(permanent=True)`` for a replica that does not exist.
        """

    @abstractmethod
    def artifacts(self) -> list[Artifact]:
        """Return the files under the declared artifact paths: ``(path, size, sha256)``, sorted by path."""

    @abstractmethod
    def progress(self) -> Progress | None:
        """Return the last ``PROGRESS <fraction>`` (0..1) the job printed, or ``None`` if none yet."""

    def kubeconfig(self) -> str | None:
        """A kubeconfig for the workload's users, where the backend has one (a namespace instance)."""
        return None

    @abstractmethod
    def discover(self) -> list[GpuInfo]:
        """Return the GPUs this backend can place work on (the inventory), in index order."""
