"""Ray clusters and Ray jobs with the names CodeFlare users know (codeflare-sdk's
``ClusterConfiguration``, ``Cluster``, ``RayJob``), on the portal: its quotas, queue and sign-in
instead of Kubernetes'.

    from gpuportal.ray import Cluster, ClusterConfiguration

    cluster = Cluster(ClusterConfiguration(name="tune", workspace="demo-team", num_workers=2,
                                           worker_gpus=1, worker_cpus=4, worker_memory=16))
    cluster.up()                 # QUEUED until its head and both workers can be admitted together
    cluster.wait_ready()         # prints where it waits: queue position, reason, estimated start
    client = cluster.job_client  # ray.job_submission.JobSubmissionClient, through the portal
    client.submit_job(entrypoint="python tune.py")
    cluster.down()

A fire-and-forget Ray job is a cluster with an entrypoint, which ends with it:

    job = RayJob("sweep", "python sweep.py", cluster_config=ClusterConfiguration(num_workers=4,
                 worker_gpus=1), artifact_paths=["results"])
    job.submit()
    sys.exit(job.wait())         # the exit codes of `gpuportal wait`
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from gpuportal.errors import GPUPortalError, SpecError, WaitTimeout
from gpuportal.models import ResultList
from gpuportal.rayclusters import LIVE_STATES, ChangePrinter, ClusterStatus, RayCluster, describe, exit_code_of
from gpuportal.rayspec import RayClusterSpec, parse_cpus, parse_gpus, parse_memory_gb

if TYPE_CHECKING:
    from gpuportal.client import Client

#: CodeFlare's name for the status enum.
CodeFlareClusterStatus = ClusterStatus

# Extended resources that are GPUs (CodeFlare's head/worker_extended_resource_requests keys).
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "intel.com/gpu")
EXIT_TIMEOUT = 124

Size = int | float | str | None


@dataclass
class ClusterConfiguration:
    """What a Ray cluster asks for: a head and ``num_workers`` workers, each of its own size, or
    of a compute profile's (``head_profile``, ``worker_profile``: see ``portal.profiles.compute()``).

    Sizes take CodeFlare's names. The portal gives each node one size, which it both reserves and
    enforces: where requests and limits differ, the larger is asked for. CPUs are whole cores
    (``2``, or ``"500m"`` rounded up); memory is GB (``8``, or ``"8G"``, ``"512Mi"`` rounded up to
    whole GB); GPUs per node (``1``, or a share of one such as ``0.5``). A size left out takes the
    portal's default (1 core, 4 GB, no GPU). ``workspace`` (CodeFlare's ``namespace``) defaults to
    the client's; ``gpu_type`` to the workspace's only GPU type.

    Kubernetes' own options (``appwrapper``, ``local_queue``, ``image_pull_secrets``, ``labels``,
    ...) have no meaning here: admission and queueing are the portal's.
    """

    name: str = ""
    workspace: str | None = None
    namespace: str | None = None
    num_workers: int | None = None
    head_cpus: Size = None
    head_cpu_requests: Size = None
    head_cpu_limits: Size = None
    head_memory: Size = None
    head_memory_requests: Size = None
    head_memory_limits: Size = None
    head_gpus: Size = None
    head_extended_resource_requests: dict[str, int | str] = field(default_factory=dict)
    worker_cpus: Size = None
    worker_cpu_requests: Size = None
    worker_cpu_limits: Size = None
    worker_memory: Size = None
    worker_memory_requests: Size = None
    worker_memory_limits: Size = None
    worker_gpus: Size = None
    num_gpus: Size = None
    worker_extended_resource_requests: dict[str, int | str] = field(default_factory=dict)
    head_profile: str | None = None
    worker_profile: str | None = None
    gpu_type: str | None = None
    envs: dict[str, str] = field(default_factory=dict)
    image: str | None = None
    priority: int | None = None
    preemptible: bool | None = None
    max_runtime: int | str | None = None
    cluster: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if self.workspace and self.namespace and self.workspace != self.namespace:
            raise SpecError(
                f"workspace {self.workspace!r} and namespace {self.namespace!r} differ: give one", field="namespace"
            )
        # Every field is checked now, not only once the cluster is brought up. A RayJob names its
        # cluster itself, so a configuration may have no name of its own.
        self.to_spec(name=self.name or "unnamed")

    @property
    def where(self) -> str | None:
        """The workspace the cluster goes to (None: the client's default)."""
        return self.workspace or self.namespace

    def to_spec(self, **extra: Any) -> RayClusterSpec:
        """The portal's request for this configuration; `extra` spec fields (``name``,
        ``entrypoint``, ``artifacts``, ``max_runtime``...) win over the configuration's."""
        values: dict[str, Any] = {
            "name": self.name or None, "workspace": self.where, "description": self.description or None,
            "workers": self.num_workers, "gpu_type": self.gpu_type, "head_profile": self.head_profile,
            "worker_profile": self.worker_profile, "image": self.image, "env": dict(self.envs) or None,
            "priority": self.priority, "preemptible": self.preemptible, "max_runtime": self.max_runtime,
            "cluster": self.cluster,
            "head_cpus": _largest(parse_cpus, "head_cpus", self.head_cpus, self.head_cpu_requests,
                                  self.head_cpu_limits),
            "head_memory": _largest(parse_memory_gb, "head_memory", self.head_memory, self.head_memory_requests,
                                    self.head_memory_limits),
            "head_gpus": _gpus("head_gpus", self.head_extended_resource_requests, self.head_gpus),
            "worker_cpus": _largest(parse_cpus, "worker_cpus", self.worker_cpus, self.worker_cpu_requests,
                                    self.worker_cpu_limits),
            "worker_memory": _largest(parse_memory_gb, "worker_memory", self.worker_memory,
                                      self.worker_memory_requests, self.worker_memory_limits),
            "worker_gpus": _gpus("worker_gpus", self.worker_extended_resource_requests, self.worker_gpus,
                                 self.num_gpus),
        }  # fmt: skip
        values.update(extra)
        return RayClusterSpec.from_dict({k: v for k, v in values.items() if v is not None})


def _largest(parse: Callable[[Any, str], int], name: str, *given: Size) -> int | None:
    """The largest of the sizes given (a size, its request, its limit), parsed; None if none was."""
    sizes = [parse(value, name) for value in given if value is not None]
    return max(sizes) if sizes else None


def _gpus(name: str, extended: Mapping[str, int | str], *given: Size) -> str | None:
    """GPUs per node from the plain fields and CodeFlare's extended resources; only GPUs exist here."""
    for key in extended:
        if key not in GPU_RESOURCES:
            raise SpecError(
                f"the portal gives GPUs, CPUs and memory only; {key!r} is none of them",
                field=name.replace("gpus", "extended_resource_requests"),
            )
    values = [v for v in (*given, *(extended[k] for k in GPU_RESOURCES if k in extended)) if v is not None]
    if not values:
        return None
    return f"{max(parse_gpus(v, name) for v in values).normalize():f}"


def _default_client() -> Client:
    from gpuportal.client import Client

    return Client.from_env()


def reachable(address: str) -> tuple[str, dict[str, str]]:
    """Where a program sends requests for `address`, and the headers that name it. Browsers take
    every ``*.localhost`` name for the loopback address (RFC 6761), which is how a portal on a
    workstation gives each dashboard its own host name; a program's resolver may not know such a
    name: it is reached at 127.0.0.1 with its name as the ``Host``."""
    parts = urlsplit(address)
    host = parts.hostname or ""
    if parts.scheme != "http" or not host.endswith(".localhost"):
        return address, {}
    loopback = f"127.0.0.1:{parts.port}" if parts.port else "127.0.0.1"
    return urlunsplit(parts._replace(netloc=loopback)), {"Host": parts.netloc}


def job_submission_client(address: str, token: str) -> Any:
    """``ray.job_submission.JobSubmissionClient`` for a cluster's dashboard through the portal,
    signed in with the portal token (Ray is imported only here: it is not a dependency of the SDK).
    The client checks at once that the address answers (``/api/version``)."""
    try:
        module = importlib.import_module("ray.job_submission")
    except ImportError as missing:
        raise GPUPortalError(
            "Submitting Ray jobs to a cluster needs Ray's job client, which is not installed here: "
            f"pip install 'ray[default]' ({missing})."
        ) from None
    refused_sign_in: Any = importlib.import_module("ray.exceptions").AuthenticationError
    target, headers = reachable(address)
    try:
        return module.JobSubmissionClient(address=target, headers={**headers, "Authorization": f"Bearer {token}"})
    except refused_sign_in:  # Ray's own message speaks of Ray's local token files: not the case here
        raise GPUPortalError(
            f"The portal refused the sign-in to the Ray dashboard at {address}: it takes a portal token "
            "(GPUPORTAL_TOKEN, or `gpuportal login`) of a user who may see the cluster."
        ) from None
    except (OSError, RuntimeError) as failed:  # requests' errors are OSErrors; a 404 is a RuntimeError
        raise GPUPortalError(f"The Ray dashboard at {address} did not take the connection: {failed}") from None


class Cluster:
    """A Ray cluster of the portal, as CodeFlare's ``Cluster``: ``up()``, ``status()``,
    ``wait_ready()``, ``details()``, ``job_client``, ``down()``.

    `client` defaults to ``Client.from_env()`` (GPUPORTAL_URL and GPUPORTAL_TOKEN, or
    ``gpuportal login``'s configuration), made when first needed.
    """

    def __init__(self, config: ClusterConfiguration, client: Client | None = None) -> None:
        self.config = config
        self._client = client
        self.id: int | None = None
        self.info: RayCluster | None = None  # the cluster as last seen
        self._job_client: Any = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = _default_client()
        return self._client

    def __repr__(self) -> str:
        state = self.info.state if self.info else "not up"
        return f"<gpuportal.ray.Cluster {self.config.name} {state}>"

    def _repr_html_(self) -> str:
        return self.info._repr_html_() if self.info else f"<i>Ray cluster {self.config.name}: not up</i>"

    def up(self) -> RayCluster:
        """Request the cluster. It is QUEUED until its head and all its workers can be admitted
        together; ``Conflict`` if the workspace has a live cluster of this name already."""
        if not self.config.name:
            raise SpecError("a cluster needs a name", field="name")
        self.info = self.client.ray_clusters.create(self.config.to_spec())
        self.id, self._job_client = self.info.id, None
        print(f"Ray cluster {self.info.name} ({self.info.id}) requested in workspace {self.info.workspace}.")
        print(describe(self.info))
        return self.info

    def refresh(self) -> RayCluster | None:
        """The cluster as it is now: the one `up()` made, else the live cluster of this name."""
        if self.id is None:
            found = self.client.ray_clusters.find(self.config.name, self.config.where)
            if found is None:
                return None
            self.id = found.id
            self.info = found
            return found
        self.info = self.client.ray_clusters.get(self.id)
        return self.info

    def _need(self) -> RayCluster:
        cluster = self.refresh()
        if cluster is None:
            where = self.config.where or self.client.default_workspace()
            raise GPUPortalError(f"No live Ray cluster {self.config.name} in workspace {where}: call up() first.")
        return cluster

    def down(self) -> RayCluster:
        """Stop the cluster and the Ray jobs on it (``Conflict`` if it has already ended)."""
        cluster = self._need()
        self.info = self.client.ray_clusters.delete(cluster.id)
        self._job_client = None
        print(describe(self.info))
        return self.info

    def status(self, print_to_console: bool = True) -> tuple[ClusterStatus, bool]:
        """Where the cluster stands, and whether it is ready (RUNNING: every node joined). A
        preempted cluster (SUSPENDED) goes back in the queue and runs again by itself."""
        cluster = self.refresh()
        if cluster is None:
            if print_to_console:
                print(f"Ray cluster {self.config.name}: none is up (call up()).")
            return ClusterStatus.UNKNOWN, False
        if print_to_console:
            print(describe(cluster))
        return cluster.status, cluster.is_ready

    def wait_ready(
        self,
        timeout: float | None = None,
        dashboard_check: bool = False,
        on_update: Callable[[RayCluster], None] | None = None,
    ) -> RayCluster:
        """Wait until the cluster is RUNNING, printing where it stands each time that changes (its
        queue position, why it waits and its estimated start; a preemption, after which it goes
        back in the queue). ``WorkloadFailed`` if it fails or is deleted; ``WaitTimeout`` (a
        ``TimeoutError``) after `timeout` seconds. The portal says RUNNING once every node joined
        and the dashboard answered its backend; `dashboard_check` also waits for the dashboard to
        answer through the portal (``/api/version``)."""
        cluster = self._need()
        start = time.monotonic()
        printer = on_update or ChangePrinter()
        self.info = self.client.ray_clusters.wait_ready(cluster.id, timeout=timeout, on_update=printer)
        if dashboard_check and self.info.is_ready:
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
            self._wait_dashboard(left)
        return self.info

    def _wait_dashboard(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        url, headers = reachable(self.cluster_dashboard_uri().rstrip("/") + "/api/version")
        headers["Authorization"] = f"Bearer {self.client.token}"
        while True:
            try:
                if httpx.get(url, headers=headers, timeout=10).status_code == 200:
                    print("Dashboard is ready!")
                    return
            except httpx.HTTPError:
                pass
            if deadline is not None and time.monotonic() >= deadline:
                message = f"The dashboard of Ray cluster {self.config.name} did not answer at {url}."
                raise WaitTimeout(message, self.info)
            time.sleep(2)

    def details(self, print_to_console: bool = True) -> RayCluster:
        """The cluster: its sizes, state, nodes (name, role, alive), dashboard URL, exit code and
        artifacts. ``print_to_console`` prints them (a notebook shows the returned object as a table)."""
        cluster = self._need()
        if print_to_console:
            lines = [(label, text) for label, text in cluster.details() if text]
            width = max(len(label) for label, _ in lines)
            print("\n".join(f"{label + ':':<{width + 1}} {text}" for label, text in lines))
        return cluster

    def cluster_dashboard_uri(self) -> str:
        """The dashboard's and Jobs API's address, through the portal, while the cluster runs."""
        cluster = self._need()
        if not cluster.dashboard_url:
            raise GPUPortalError(
                f"Ray cluster {cluster.name} is {cluster.state}: its dashboard is there only while it runs "
                "(wait_ready() first)."
            )
        return cluster.dashboard_url

    @property
    def job_client(self) -> Any:
        """A ``ray.job_submission.JobSubmissionClient`` for this cluster (as CodeFlare's, a property):
        its dashboard's address through the portal, signed in with your portal token."""
        if self._job_client is None:
            self._job_client = job_submission_client(self.cluster_dashboard_uri(), self.client.token or "")
        return self._job_client

    def list_jobs(self) -> list[Any]:
        """The Ray jobs on the cluster (``JobDetails``), from its Jobs API."""
        return list(self.job_client.list_jobs())

    def job_status(self, job_id: str) -> Any:
        return self.job_client.get_job_status(job_id)

    def job_logs(self, job_id: str) -> str:
        return str(self.job_client.get_job_logs(job_id))

    def logs(self) -> str:
        """The cluster's own log so far: its nodes' start, and an entrypoint's output."""
        return self._need().logs()


def get_cluster(cluster_name: str, workspace: str | None = None, client: Client | None = None) -> Cluster:
    """The live Ray cluster of this name (CodeFlare's ``get_cluster``), as a ``Cluster`` whose
    configuration is the cluster's; ``NotFound``-like ``GPUPortalError`` if there is none."""
    portal = client or _default_client()
    found = portal.ray_clusters.find(cluster_name, workspace)
    if found is None:
        where = workspace or portal.default_workspace()
        raise GPUPortalError(f"No live Ray cluster {cluster_name} in workspace {where}.")
    config = ClusterConfiguration(
        name=found.name, workspace=found.workspace, num_workers=found.workers,
        head_cpus=found.head_cpu_cores, head_memory=found.head_memory_gb, head_gpus=str(found.head_gpus),
        worker_cpus=found.worker_cpu_cores, worker_memory=found.worker_memory_gb, worker_gpus=str(found.worker_gpus),
        gpu_type=found.gpu_type or None, envs=dict(found.env), image=found.image or None,
    )  # fmt: skip
    cluster = Cluster(config, portal)
    cluster.id, cluster.info = found.id, found
    return cluster


def list_all_clusters(
    workspace: str | None = None, print_to_console: bool = True, client: Client | None = None
) -> ResultList[RayCluster]:
    """The workspace's live Ray clusters (CodeFlare's ``list_all_clusters``)."""
    portal = client or _default_client()
    found = portal.ray_clusters.list(workspace or portal.default_workspace(), state=LIVE_STATES)
    if print_to_console:
        for cluster in found:
            print(describe(cluster))
    return found


class RayJob:
    """A fire-and-forget Ray job (CodeFlare's ``RayJob`` with a ``cluster_config``): a cluster of its
    own, named `job_name`, that runs `entrypoint` once every node joined and ends with it, keeping
    what the entrypoint leaves under `artifact_paths`. The entrypoint is a shell command, run as
    the cluster's Ray job (``ray.init()`` in it joins the cluster).

    Only ``env_vars`` of a `runtime_env` apply (as environment variables of every node): the nodes
    run the image and environment the portal gives them. `active_deadline_seconds` is CodeFlare's
    name for `max_runtime`.
    """

    def __init__(
        self,
        job_name: str,
        entrypoint: str,
        *,
        cluster_config: ClusterConfiguration | None = None,
        cluster_name: str | None = None,
        workspace: str | None = None,
        namespace: str | None = None,
        artifact_paths: list[str] | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        max_runtime: int | str | None = None,
        active_deadline_seconds: int | None = None,
        priority: int | None = None,
        client: Client | None = None,
    ) -> None:
        if max_runtime is not None and active_deadline_seconds is not None:
            raise SpecError("give max_runtime or active_deadline_seconds, not both", field="max_runtime")
        if cluster_name is not None:
            raise SpecError(
                "a Ray job of the portal brings its own cluster (cluster_config); to run a job on a running "
                "cluster, use Cluster(...).job_client.submit_job(...)",
                field="cluster_name",
            )
        if not entrypoint or not entrypoint.strip():
            raise SpecError("a Ray job needs an entrypoint (a shell command)", field="entrypoint")
        self.name = job_name
        self.entrypoint = entrypoint
        self.cluster_config = cluster_config or ClusterConfiguration()
        env = dict(self.cluster_config.envs)
        env.update(_env_vars(runtime_env))
        self._spec = self.cluster_config.to_spec(
            name=job_name,
            workspace=workspace or namespace,
            entrypoint=entrypoint,
            env=env or None,
            artifacts=list(artifact_paths) if artifact_paths is not None else None,
            max_runtime=max_runtime if max_runtime is not None else active_deadline_seconds,
            priority=priority,
        )
        self._client = client
        self.id: int | None = None
        self.info: RayCluster | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = _default_client()
        return self._client

    def __repr__(self) -> str:
        return f"<gpuportal.ray.RayJob {self.name} {self.info.state if self.info else 'not submitted'}>"

    def _need(self) -> RayCluster:
        if self.id is None:
            raise GPUPortalError(f"Ray job {self.name} has not been submitted: call submit() first.")
        self.info = self.client.ray_clusters.get(self.id)
        return self.info

    @property
    def exit_code(self) -> int | None:
        """The entrypoint's exit code once it ended (None before, or for a cluster that failed to start)."""
        return self.info.exit_code if self.info else None

    def submit(self) -> RayCluster:
        """Queue the Ray job: its cluster waits until its head and workers are admitted together."""
        self.info = self.client.ray_clusters.create(self._spec)
        self.id = self.info.id
        return self.info

    def status(self, print_to_console: bool = True) -> tuple[ClusterStatus, bool]:
        """Where the job's cluster stands, and whether the job has ended."""
        cluster = self._need()
        if print_to_console:
            print(describe(cluster))
        return cluster.status, cluster.is_final

    def wait(
        self,
        timeout: float | None = None,
        stream_logs: bool = True,
        on_update: Callable[[RayCluster], None] | None = None,
    ) -> int:
        """Wait for the job to end and return its exit code as `gpuportal wait` gives it: 0 if it
        succeeded, the entrypoint's own code if it failed (124 after its max runtime), 1 for a
        failure without one, 130 if it was stopped, and 124 if `timeout` passed first (the job
        goes on). Its log is printed as it grows (`stream_logs`), and a line on stderr each time
        its state, queue position or reason changes."""
        if self.id is None:
            raise GPUPortalError(f"Ray job {self.name} has not been submitted: call submit() first.")

        def write(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        try:
            self.info = self.client.ray_clusters.wait(
                self.id,
                timeout,
                on_update=on_update or ChangePrinter(sys.stderr),
                logs=write if stream_logs else None,
            )
        except WaitTimeout as late:
            if isinstance(late.obj, RayCluster):
                self.info = late.obj
            return EXIT_TIMEOUT
        return exit_code_of(self.info)

    def logs(self) -> str:
        return self._need().logs()

    def stream_logs(self, *, follow: bool = True) -> Iterator[str]:
        if self.id is None:
            raise GPUPortalError(f"Ray job {self.name} has not been submitted: call submit() first.")
        return self.client.ray_clusters.stream_logs(self.id, follow=follow)

    def download_artifacts(self, dest: str | Path = ".", paths: list[str] | None = None) -> list[Path]:
        """Save what the entrypoint left under its artifact paths into `dest`, sha256 checked."""
        return self._need().download_artifacts(dest, paths)

    def stop(self) -> RayCluster:
        """Stop the job and its cluster (``Conflict`` if it has already ended)."""
        self._need()
        assert self.id is not None
        self.info = self.client.ray_clusters.delete(self.id)
        return self.info

    delete = stop


def _env_vars(runtime_env: Mapping[str, Any] | None) -> dict[str, str]:
    if not runtime_env:
        return {}
    other = [key for key in runtime_env if key != "env_vars"]
    if other:
        raise SpecError(
            f"only env_vars apply here, not {', '.join(other)}: the nodes run the image and environment the "
            "portal gives them",
            field="runtime_env",
        )
    env = runtime_env.get("env_vars") or {}
    if not isinstance(env, Mapping):
        raise SpecError("env_vars should be a mapping of NAME: value", field="runtime_env")
    return {str(k): str(v) for k, v in env.items()}


__all__ = [
    "Cluster", "ClusterConfiguration", "ClusterStatus", "CodeFlareClusterStatus", "RayCluster", "RayJob",
    "get_cluster", "list_all_clusters",
]  # fmt: skip
