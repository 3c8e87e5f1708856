"""Ray clusters through the portal's API: the rows (``RayCluster``) and the resource
``client.ray_clusters``; requests are made from a ``RayClusterSpec`` (gpuportal/rayspec.py). The
CodeFlare-style classes built on them are in ``gpuportal.ray``.

A Ray cluster is a head and ``workers`` workers, each of its own size, admitted all at once under
the workspace's quota. With an ``entrypoint`` it is a fire-and-forget Ray job: the entrypoint runs
once every node joined, and the cluster ends with it (its exit code, its artifacts).
"""

from __future__ import annotations

import builtins
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpuportal.errors import APIError, NotFound, PortalUnreachable, ServerError, WaitTimeout, WorkloadFailed
from gpuportal.models import (
    Artifact,
    LogChunk,
    QueueInfo,
    ResultList,
    _queue,
    _queue_details,
    _Refreshable,
    _waiting,
    fmt_duration,
    fmt_estimate,
    gpus_of,
    parse_time,
)
from gpuportal.rayspec import API_TO_SPEC, RayClusterSpec
from gpuportal.resources import POLL_FIRST_S, POLL_MAX_S, Outage, Resource, download_recorded

if TYPE_CHECKING:
    from gpuportal.client import Client

LIVE_STATES = ("QUEUED", "ADMITTED", "RUNNING", "DEGRADED", "PREEMPTED", "STOPPING")
FINAL_STATES = ("SUCCEEDED", "FAILED", "STOPPED")
# What `gpuportal wait` exits with for a Ray job stopped (deleted) before it ended by itself.
EXIT_STOPPED = 130


class ClusterStatus(Enum):
    """Where a Ray cluster stands, in CodeFlare's words (its ``CodeFlareClusterStatus``) and the
    portal's own ends. ``Cluster.status()`` returns one with whether the cluster is ready."""

    QUEUED = "queued"  # waiting for quota or room, with a queue position and reason
    STARTING = "starting"  # admitted: its nodes are starting
    READY = "ready"  # every node joined; its dashboard and Jobs API answer
    DEGRADED = "degraded"  # a node is down (restarted where its backend can)
    SUSPENDED = "suspended"  # preempted: it is stopped, goes back in the queue and runs again
    STOPPING = "stopping"  # deleted, its nodes stopping
    SUCCEEDED = "succeeded"  # its entrypoint exited 0
    FAILED = "failed"  # its entrypoint failed, or the cluster did
    STOPPED = "stopped"  # deleted
    UNKNOWN = "unknown"  # no such cluster (not brought up yet)


_STATUS = {
    "QUEUED": ClusterStatus.QUEUED, "ADMITTED": ClusterStatus.STARTING, "RUNNING": ClusterStatus.READY,
    "DEGRADED": ClusterStatus.DEGRADED, "PREEMPTED": ClusterStatus.SUSPENDED, "STOPPING": ClusterStatus.STOPPING,
    "SUCCEEDED": ClusterStatus.SUCCEEDED, "FAILED": ClusterStatus.FAILED, "STOPPED": ClusterStatus.STOPPED,
}  # fmt: skip


# -- the rows ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RayNode:
    """One node of a running cluster, as its backend last reported it."""

    name: str
    role: str
    alive: bool


@dataclass(eq=False, repr=False)
class RayCluster(_Refreshable):
    """A Ray cluster: QUEUED until its head and all its workers are admitted together, ADMITTED
    while they start, RUNNING (DEGRADED while a node is down), then SUCCEEDED or FAILED with its
    entrypoint, or STOPPED when deleted. A PREEMPTED cluster goes back to QUEUED and runs again."""

    id: int
    workspace: str
    name: str
    description: str
    state: str
    workers: int
    gpu_type: str
    head_gpus: Decimal
    head_cpu_cores: int
    head_memory_gb: int
    worker_gpus: Decimal
    worker_cpu_cores: int
    worker_memory_gb: int
    entrypoint: str
    image: str
    env: dict[str, str]
    artifact_paths: list[str]
    max_runtime_s: int | None
    priority: int
    failure_reason: str
    exit_code: int | None
    attempts: int
    nodes: list[RayNode]
    dashboard_url: str | None
    queue_info: QueueInfo
    cluster: str | None
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    artifacts: list[Artifact]
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    FINAL_STATES = FINAL_STATES

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> RayCluster:
        dashboard = data.get("dashboard_url") or None
        if dashboard and dashboard.startswith("/") and client is not None:
            dashboard = client.url + dashboard  # a path on the portal itself
        return cls(
            id=int(data["id"]),
            workspace=data.get("workspace") or "",
            name=data.get("name") or "",
            description=data.get("description") or "",
            state=data.get("state") or "",
            workers=int(data.get("workers") or 0),
            gpu_type=data.get("gpu_type") or "",
            head_gpus=Decimal(str(data.get("head_gpus") or "0")),
            head_cpu_cores=int(data.get("head_cpu_cores") or 0),
            head_memory_gb=int(data.get("head_memory_gb") or 0),
            worker_gpus=Decimal(str(data.get("worker_gpus") or "0")),
            worker_cpu_cores=int(data.get("worker_cpu_cores") or 0),
            worker_memory_gb=int(data.get("worker_memory_gb") or 0),
            entrypoint=data.get("entrypoint") or "",
            image=data.get("image") or "",
            env=dict(data.get("env") or {}),
            artifact_paths=list(data.get("artifact_paths") or []),
            max_runtime_s=None if data.get("max_runtime_s") is None else int(data["max_runtime_s"]),
            priority=int(data.get("priority") or 0),
            failure_reason=data.get("failure_reason") or "",
            exit_code=None if data.get("exit_code") is None else int(data["exit_code"]),
            attempts=int(data.get("attempts") or 0),
            nodes=[
                RayNode(str(n.get("name", "")), str(n.get("role", "")), bool(n.get("alive")))
                for n in data.get("nodes") or []
            ],
            dashboard_url=dashboard,
            queue_info=_queue(data),
            cluster=data.get("cluster"),
            created_at=parse_time(data.get("created_at")),
            started_at=parse_time(data.get("started_at")),
            finished_at=parse_time(data.get("finished_at")),
            artifacts=[
                Artifact(a["path"], int(a.get("size_bytes") or 0), a.get("sha256") or "")
                for a in data.get("artifacts") or []
            ],
            data=data,
            _client=client,
        )

    def __repr__(self) -> str:
        text = f"<RayCluster {self.id} {self.name} {self.state}"
        if self.is_final and self.exit_code is not None:
            text += f" exit code {self.exit_code}"
        return text + _waiting(self.state, self.queue_info) + ">"

    @property
    def status(self) -> ClusterStatus:
        return _STATUS.get(self.state, ClusterStatus.UNKNOWN)

    @property
    def is_ready(self) -> bool:
        """Every node joined: its dashboard and Jobs API answer at ``dashboard_url``."""
        return self.state == "RUNNING"

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "SUCCEEDED"

    @property
    def queue(self) -> QueueInfo | None:
        """Where it stands while QUEUED; None otherwise."""
        return self.queue_info if self.state == "QUEUED" else None

    @property
    def num_workers(self) -> int:
        """CodeFlare's name for ``workers``."""
        return self.workers

    @property
    def dashboard(self) -> str | None:
        """CodeFlare's name for ``dashboard_url``."""
        return self.dashboard_url

    @property
    def running_for(self) -> timedelta | None:
        """How long it has run (its last start), or ran."""
        if self.started_at is None:
            return None
        return (self.finished_at or datetime.now(timezone.utc)) - self.started_at

    @property
    def head_size(self) -> str:
        return _node_size(self.head_gpus, self.gpu_type, self.head_cpu_cores, self.head_memory_gb)

    @property
    def worker_size(self) -> str:
        if not self.workers:
            return "none"
        size = _node_size(self.worker_gpus, self.gpu_type, self.worker_cpu_cores, self.worker_memory_gb)
        return f"{self.workers} × ({size})"

    def _fetch(self) -> RayCluster:
        return self._bound().ray_clusters.get(self.id)

    def wait_ready(
        self, timeout: float | None = None, on_update: Callable[[RayCluster], None] | None = None
    ) -> RayCluster:
        """Wait until it is RUNNING (updated in place); ``WorkloadFailed`` if it fails or is deleted first."""
        self._update_from(lambda: self._bound().ray_clusters.wait_ready(self.id, timeout=timeout, on_update=on_update))
        return self

    def wait(
        self,
        timeout: float | None = None,
        *,
        check: bool = False,
        on_update: Callable[[RayCluster], None] | None = None,
    ) -> RayCluster:
        """Wait for it to end (updated in place); with `check`, ``WorkloadFailed`` unless it succeeded."""
        self._update_from(
            lambda: self._bound().ray_clusters.wait(self.id, timeout=timeout, check=check, on_update=on_update)
        )
        return self

    def delete(self) -> RayCluster:
        """Stop it (its Ray jobs with it); its record stays, STOPPED."""
        self._update_from(lambda: self._bound().ray_clusters.delete(self.id))
        return self

    def logs(self) -> str:
        """Its log so far: its nodes' start and, for a Ray job, its entrypoint's output."""
        return "".join(self._bound().ray_clusters.stream_logs(self.id, follow=False))

    def stream_logs(self, *, follow: bool = True, offset: int = 0) -> Iterator[str]:
        return self._bound().ray_clusters.stream_logs(self.id, follow=follow, offset=offset)

    def download_artifacts(self, dest: str | Path = ".", paths: list[str] | None = None) -> list[Path]:
        """Save its artifacts under `dest`, each at its path, checked against the recorded sha256."""
        return self._bound().ray_clusters.download_artifacts(self.id, dest, paths=paths)

    def summary(self) -> dict[str, str]:
        running = self.running_for
        status = ""
        if self.state == "QUEUED":
            position = self.queue_info.position
            status = f"{'#' + str(position) if position is not None else ''} {self.queue_info.reason}"
        elif self.is_final:
            status = f"exit code {self.exit_code}" if self.exit_code is not None else self.failure_reason[:60]
        elif running is not None:
            status = fmt_duration(running)
        return {
            "ID": str(self.id),
            "Name": self.name,
            "Workspace": self.workspace,
            "Head": self.head_size,
            "Workers": self.worker_size,
            "State": self.state,
            "Queue / running for": status.strip(),
        }

    def details(self) -> list[tuple[str, str]]:
        running = self.running_for
        nodes = ", ".join(n.name if n.alive else f"{n.name} (down)" for n in self.nodes)
        return [
            ("Ray cluster", f"{self.id} {self.name}"),
            ("Workspace", self.workspace),
            ("Head", self.head_size),
            ("Workers", self.worker_size),
            ("State", self.state),
            *_queue_details(self.state, self.queue_info),
            ("Preempted", "it goes back in the queue and runs again" if self.state == "PREEMPTED" else ""),
            ("Nodes", nodes),
            ("Dashboard", self.dashboard_url or ""),
            ("Entrypoint", self.entrypoint.strip().splitlines()[0][:100] if self.entrypoint.strip() else ""),
            ("Running for" if not self.is_final else "Ran for", fmt_duration(running) if running else ""),
            ("Exit code", "" if self.exit_code is None else str(self.exit_code)),
            ("Failure", self.failure_reason),
            ("Artifacts", ", ".join(a.path for a in self.artifacts)),
        ]

    def _repr_html_(self) -> str:
        table = super()._repr_html_()
        if self.dashboard_url:
            import html

            link = html.escape(self.dashboard_url, quote=True)
            table += f"<p><a href='{link}' target='_blank'>Ray dashboard of {html.escape(self.name)}</a></p>"
        return table


def _node_size(gpus: Decimal, gpu_type: str, cpus: int, memory_gb: int) -> str:
    gpu = gpus_of(gpus, gpu_type) if gpus else "no GPU"
    return f"{gpu}, {cpus} CPU, {memory_gb} GB"


def describe(cluster: RayCluster, *, timer: bool = True) -> str:
    """One line saying where a cluster stands: its queue position and reason, its nodes, or its end.
    Without `timer`, the line leaves out what changes by itself (times), to tell real changes apart."""
    head = f"Ray cluster {cluster.id} {cluster.name}: {cluster.state}"
    queue = cluster.queue_info
    if cluster.state == "QUEUED":
        parts = []
        if queue.position is not None:
            parts.append(f"#{queue.position} in {cluster.workspace}")
        if queue.cluster_position is not None:
            parts.append(f"#{queue.cluster_position} in the cluster")
        if queue.reason:
            parts.append(queue.reason)
        if timer:
            parts.append(f"estimated start {fmt_estimate(queue.estimated_start_at)}")
        return head + (", " + ", ".join(parts) if parts else "")
    if cluster.state == "ADMITTED":
        return f"{head}, starting its head and {cluster.workers} worker{'s' if cluster.workers != 1 else ''}"
    if cluster.state == "PREEMPTED":
        return f"{head}, {queue.reason or 'preempted'}; it goes back in the queue and runs again"
    if cluster.state in ("RUNNING", "DEGRADED"):
        running = cluster.running_for
        text = f"{head} for {fmt_duration(running)}" if running and timer else head
        down = [n.name for n in cluster.nodes if not n.alive]
        if down:
            text += f", {', '.join(down)} down"
        elif cluster.nodes:
            text += f", {len(cluster.nodes)} nodes"
        return text + (f", dashboard {cluster.dashboard_url}" if cluster.dashboard_url else "")
    if cluster.is_final:
        running = cluster.running_for
        text = head + (f" with exit code {cluster.exit_code}" if cluster.exit_code not in (None, 0) else "")
        text += f" after {fmt_duration(running)}" if running else ""
        return text + (f": {cluster.failure_reason}" if cluster.failure_reason else "")
    return head


def exit_code_of(cluster: RayCluster) -> int:
    """A Ray job's outcome as a process exit code, as `gpuportal wait` gives it: 0 for success, its
    entrypoint's own code for a failure (124 after its max runtime, 128+N when killed by signal N),
    1 for a failure without one, 130 for a cluster stopped (deleted) before it ended."""
    if cluster.state == "SUCCEEDED":
        return 0
    if cluster.state == "STOPPED":
        return EXIT_STOPPED
    if cluster.exit_code is not None and 0 < cluster.exit_code < 256:
        return cluster.exit_code
    return 1


class ChangePrinter:
    """Writes a cluster's line to `stream` each time its state, queue place or reason changes
    (what ``Cluster.wait_ready`` and ``RayJob.wait`` show while they wait)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.last: str | None = None

    def __call__(self, cluster: RayCluster) -> None:
        key = describe(cluster, timer=False)
        if key != self.last:
            stream = self.stream or sys.stdout
            stream.write(describe(cluster) + "\n")
            stream.flush()
        self.last = key


# -- the resource ------------------------------------------------------------------------------------


class RayClusters(Resource):
    """``client.ray_clusters``: request Ray clusters and Ray jobs, follow them, stop them."""

    kind = "Ray cluster"

    def create(
        self, spec: RayClusterSpec | Mapping[str, Any] | str | os.PathLike[str] | None = None, /, **fields: Any
    ) -> RayCluster:
        """Request a cluster from a spec (a YAML file's path with ``kind: ray``, a dict, a
        ``RayClusterSpec``) and/or keyword arguments, which take precedence. It is QUEUED until its
        head and all its workers can be admitted together. Where GPUs are asked for without a
        ``gpu_type`` or a profile, the workspace's only GPU type is used."""
        request = RayClusterSpec.load(spec, **fields)
        request.workspace = request.workspace or self._client.default_workspace()
        if request.has_gpus and not request.gpu_type and not (request.head_profile or request.worker_profile):
            request.gpu_type = self._client.jobs._only_gpu_type(request.workspace)
        try:
            answer = self._client.request("POST", "ray-clusters/", json=request.to_api())
        except APIError as refused:
            raise _in_spec_words(refused) from None
        return RayCluster.from_api(answer, self._client)

    def get(self, cluster_id: int) -> RayCluster:
        return RayCluster.from_api(self._on(cluster_id, "GET", f"ray-clusters/{int(cluster_id)}/"), self._client)

    def list(
        self,
        workspace: str | None = None,
        state: str | builtins.list[str] | tuple[str, ...] | None = None,
        name: str | None = None,
        limit: int | None = 100,
    ) -> ResultList[RayCluster]:
        """Clusters you can see, newest first; filter by workspace, state (one or several) and name."""
        params: dict[str, Any] = {}
        if workspace:
            params["workspace__name"] = workspace
        if isinstance(state, str):
            params["state"] = state.upper()
        elif state:
            params["state__in"] = ",".join(s.upper() for s in state)
        if name:
            params["name"] = name
        items = self._client.paginate("ray-clusters/", params, limit)
        return ResultList(RayCluster.from_api(d, self._client) for d in items)

    def find(self, name: str, workspace: str | None = None) -> RayCluster | None:
        """The live (not yet ended) cluster of this name in the workspace, if there is one."""
        found = self.list(workspace or self._client.default_workspace(), state=LIVE_STATES, name=name, limit=1)
        return found[0] if found else None

    def delete(self, cluster_id: int) -> RayCluster:
        """Stop a cluster (and the Ray jobs on it): STOPPED at once if it never started, else
        STOPPING until its nodes are gone. ``Conflict`` if it has already ended. Returns the
        cluster as it is then."""
        answer = self._on(cluster_id, "DELETE", f"ray-clusters/{int(cluster_id)}/")
        if not answer:  # the portal answers 204, without the row
            return self.get(cluster_id)
        return RayCluster.from_api(answer, self._client)

    def wait_ready(
        self, cluster_id: int, timeout: float | None = None, on_update: Callable[[RayCluster], None] | None = None
    ) -> RayCluster:
        """Wait until the cluster is RUNNING. It returns too for a Ray job that already SUCCEEDED (an
        entrypoint quicker than the wait); ``WorkloadFailed`` if it failed or was deleted."""
        until_ready: Callable[[RayCluster], bool] = lambda c: c.is_ready or c.state == "STOPPING"  # noqa: E731
        cluster = self.wait(cluster_id, timeout, on_update=on_update, until=until_ready)
        if cluster.state in ("FAILED", "STOPPED", "STOPPING"):
            reason = f": {cluster.failure_reason}" if cluster.failure_reason else ""
            raise WorkloadFailed(f"Ray cluster {cluster.id} {cluster.name} is {cluster.state}{reason}", cluster)
        return cluster

    def wait(
        self,
        cluster_id: int,
        timeout: float | None = None,
        *,
        check: bool = False,
        on_update: Callable[[RayCluster], None] | None = None,
        logs: Callable[[str], None] | None = None,
        until: Callable[[RayCluster], bool] | None = None,
        interval: float = POLL_MAX_S,
    ) -> RayCluster:
        """Wait for the cluster to end (or for `until`); the cluster as last seen. `on_update` gets
        each answer; `logs`, if given, gets its log text as it grows, all of it by the time this
        returns. With `check`, ``WorkloadFailed`` unless it succeeded. ``WaitTimeout`` (with the
        cluster as ``obj``) after `timeout` seconds; the cluster goes on. A portal that restarts or
        is unreachable is ridden out for up to five minutes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay, offset, outage = POLL_FIRST_S, 0, Outage()
        while True:
            try:
                cluster = self.get(cluster_id)  # before the log: once it has ended, the log read next is whole
                while logs is not None:
                    chunk = self.logs(cluster_id, offset)
                    offset = chunk.offset
                    if not chunk.text:
                        break
                    logs(chunk.text)
                outage.over()
            except (PortalUnreachable, ServerError):
                outage.check()
            else:
                if on_update is not None:
                    on_update(cluster)
                if cluster.is_final or (until is not None and until(cluster)):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    message = f"Ray cluster {cluster.id} is still {cluster.state} after waiting {timeout:g} s."
                    raise WaitTimeout(message, cluster)
            pause = delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))
            time.sleep(pause)
            delay = min(delay * 1.5, interval)
        if check and not cluster.succeeded:
            detail = f" with exit code {cluster.exit_code}" if cluster.exit_code is not None else ""
            reason = f": {cluster.failure_reason}" if cluster.failure_reason else ""
            raise WorkloadFailed(f"Ray cluster {cluster.id} {cluster.state}{detail}{reason}", cluster)
        return cluster

    def logs(self, cluster_id: int, offset: int = 0) -> LogChunk:
        """One read of the cluster's log from `offset`; pass back ``offset`` to continue."""
        answer = self._on(cluster_id, "GET", f"ray-clusters/{int(cluster_id)}/logs/", params={"offset": offset})
        return LogChunk(text=answer["text"], offset=int(answer["offset"]), state=answer["state"], replica=0)

    def stream_logs(
        self,
        cluster_id: int,
        *,
        follow: bool = True,
        offset: int = 0,
        timeout: float | None = None,
        interval: float = 1.0,
    ) -> Iterator[str]:
        """Yield the cluster's log text as it grows. With `follow`, until the cluster has ended and
        its log is read to the end (``WaitTimeout`` after `timeout` s); without, what is there now."""
        deadline = None if timeout is None else time.monotonic() + timeout
        outage = Outage()
        while True:
            try:
                chunk = self.logs(cluster_id, offset)
                outage.over()
            except (PortalUnreachable, ServerError):
                outage.check()
                time.sleep(interval)
                continue
            offset = chunk.offset
            if chunk.text:
                yield chunk.text
                continue
            if not follow or chunk.state in FINAL_STATES:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"Ray cluster {cluster_id} is still {chunk.state} after waiting {timeout:g} s.")
            time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))

    def download_artifacts(
        self, cluster_id: int, dest: str | Path = ".", paths: builtins.list[str] | None = None
    ) -> builtins.list[Path]:
        """Download the cluster's artifacts (those under `paths`, or all) into `dest`, each at its
        path, checked against the size and sha256 the portal recorded."""
        cluster = self.get(cluster_id)
        where = f"ray-clusters/{cluster.id}/artifact/"
        return download_recorded(self._client, where, f"Ray cluster {cluster.id}", cluster.artifacts, dest, paths)


def _in_spec_words(refused: APIError) -> APIError:
    """The portal's refusal with its fields named as a Ray spec names them (head_cpus, not head_cpu_cores)."""
    if not refused.fields:
        return refused
    fields = {API_TO_SPEC.get(k, k): v for k, v in refused.fields.items()}
    message = refused.message
    for api, spec in API_TO_SPEC.items():
        message = message.replace(api, spec)
    return type(refused)(message, status=refused.status, code=refused.code, fields=fields)


def find_cluster_or(client: Client, ident: int, missing: NotFound) -> RayCluster:
    """The Ray cluster of this id, or `missing` (the job's "not found") raised again: workload ids
    are one sequence, so an id that is no job's may be a Ray job's."""
    try:
        return client.ray_clusters.get(ident)
    except NotFound:
        raise missing from None
