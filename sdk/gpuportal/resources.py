"""The portal's resources, reached as ``client.workspaces``, ``client.profiles``, ``client.instances``,
``client.notebooks`` and ``client.jobs`` (``client.ray_clusters`` and ``client.endpoints`` have
modules of their own)."""

from __future__ import annotations

import builtins
import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeVar

from gpuportal.errors import (
    ArtifactError,
    NotFound,
    PortalUnreachable,
    ServerError,
    SpecError,
    WaitTimeout,
    WorkloadFailed,
)
from gpuportal.models import (
    Artifact,
    ComputeProfile,
    InferenceProfile,
    Instance,
    Job,
    LogChunk,
    Notebook,
    NotebookProfile,
    ResultList,
    StartStep,
    Workspace,
    check_succeeded,
    following_steps,
)
from gpuportal.spec import JobSpec

if TYPE_CHECKING:
    from gpuportal.client import Client

M = TypeVar("M")

POLL_FIRST_S = 0.5
POLL_MAX_S = 2.0
# A wait rides out a portal that restarts or is briefly unreachable, for up to this long.
OUTAGE_TOLERANCE_S = 300.0


class Outage:
    """How long the portal has been unreachable; re-raises once that passes the tolerance."""

    def __init__(self) -> None:
        self.since: float | None = None

    def over(self) -> None:
        self.since = None

    def check(self) -> None:
        """Call from an ``except`` block for a transient error: re-raises it past the tolerance."""
        self.since = self.since or time.monotonic()
        if time.monotonic() - self.since > OUTAGE_TOLERANCE_S:
            raise


def poll(
    fetch: Callable[[], M],
    done: Callable[[M], bool],
    *,
    timeout: float | None,
    describe: Callable[[M], str],
    on_update: Callable[[M], None] | None = None,
    interval: float = POLL_MAX_S,
) -> M:
    """Fetch until `done`, calling `on_update` with each answer; ``WaitTimeout`` after `timeout` s."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = min(POLL_FIRST_S, interval)
    outage = Outage()
    while True:
        try:
            obj = fetch()
            outage.over()
        except (PortalUnreachable, ServerError):
            outage.check()
        else:
            if on_update is not None:
                on_update(obj)
            if done(obj):
                return obj
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"{describe(obj)} after waiting {timeout:g} s.", obj)
        pause = delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))
        time.sleep(pause)
        delay = min(delay * 1.5, interval)


class Resource:
    kind = "Object"

    def __init__(self, client: Client) -> None:
        self._client = client

    def _on(self, ident: object, method: str, path: str, **kwargs: Any) -> Any:
        """A request about one object, whose "not found" names it."""
        try:
            return self._client.request(method, path, **kwargs)
        except NotFound as exc:
            message = f"{self.kind} {ident} was not found (or you cannot see it)."
            raise NotFound(message, status=exc.status, code=exc.code) from None


class Workspaces(Resource):
    kind = "Workspace"

    def list(self) -> ResultList[Workspace]:
        """The workspaces you can use, with their GPU quotas and your role."""
        return ResultList(Workspace.from_api(d, self._client) for d in self._client.paginate("workspaces/"))

    def get(self, name: str) -> Workspace:
        return Workspace.from_api(self._on(name, "GET", f"workspaces/{name}/"), self._client)


class Profiles(Resource):
    def compute(self) -> ResultList[ComputeProfile]:
        """The compute profiles (instance sizes) you may launch."""
        items = self._client.paginate("compute-profiles/")
        return ResultList(ComputeProfile.from_api(d, self._client) for d in items)

    def notebooks(self) -> ResultList[NotebookProfile]:
        """The notebook profiles (images and packages) you may launch."""
        items = self._client.paginate("notebook-profiles/")
        return ResultList(NotebookProfile.from_api(d, self._client) for d in items)

    def inference(self) -> ResultList[InferenceProfile]:
        """The inference profiles (server and replica size) your endpoints may use."""
        items = self._client.paginate("inference-profiles/")
        return ResultList(InferenceProfile.from_api(d, self._client) for d in items)


def _filters(workspace: str | None, state: str | list[str] | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if workspace:
        params["workspace__name"] = workspace
    if isinstance(state, str):
        params["state"] = state.upper()
    elif state:
        params["state__in"] = ",".join(s.upper() for s in state)
    return params


class Instances(Resource):
    kind = "Instance"

    def list(
        self, workspace: str | None = None, state: str | list[str] | None = None, limit: int | None = None
    ) -> ResultList[Instance]:
        items = self._client.paginate("instances/", _filters(workspace, state), limit)
        return ResultList(Instance.from_api(d, self._client) for d in items)

    def get(self, instance_id: int) -> Instance:
        return Instance.from_api(self._on(instance_id, "GET", f"instances/{int(instance_id)}/"), self._client)

    def create(self, name: str, *, profile: str, workspace: str | None = None, description: str = "") -> Instance:
        """Launch an instance from a compute profile; it is QUEUED until the scheduler admits it."""
        body = {
            "workspace": workspace or self._client.default_workspace(),
            "name": name,
            "profile": profile,
            "description": description,
        }
        return Instance.from_api(self._client.request("POST", "instances/", json=body), self._client)

    def wait_ready(
        self,
        instance_id: int,
        timeout: float | None = None,
        on_update: Callable[[Instance], None] | None = None,
        *,
        on_step: Callable[[StartStep], None] | None = None,
    ) -> Instance:
        """Wait until the instance is RUNNING; ``WorkloadFailed`` if it fails or is deleted first.
        ``on_step`` is called with each step of its start as it begins (``StartStep``)."""
        instance = poll(
            lambda: self.get(instance_id),
            lambda i: i.state in Instance.READY_STATES + Instance.DEAD_STATES,
            timeout=timeout,
            describe=lambda i: f"Instance {i.id} is still {i.state}",
            on_update=following_steps(on_update, on_step),
        )
        if not instance.is_ready:
            reason = f": {instance.failure_reason}" if instance.failure_reason else ""
            raise WorkloadFailed(f"Instance {instance.id} is {instance.state}{reason}", instance)
        return instance

    def delete(self, instance_id: int) -> None:
        """Delete an instance, and the notebooks on it, irreversibly."""
        self._on(instance_id, "DELETE", f"instances/{int(instance_id)}/")


class Notebooks(Resource):
    kind = "Notebook"

    def list(
        self, workspace: str | None = None, state: str | list[str] | None = None, limit: int | None = None
    ) -> ResultList[Notebook]:
        items = self._client.paginate("notebooks/", _filters(workspace, state), limit)
        return ResultList(Notebook.from_api(d, self._client) for d in items)

    def get(self, notebook_id: int) -> Notebook:
        return Notebook.from_api(self._on(notebook_id, "GET", f"notebooks/{int(notebook_id)}/"), self._client)

    def launch(self, instance: int | Instance, name: str, *, profile: str, description: str = "") -> Notebook:
        """Start a notebook on an instance; it is PENDING until the instance runs, then STARTING and READY."""
        instance_id = instance.id if isinstance(instance, Instance) else int(instance)
        body = {"instance": instance_id, "name": name, "profile": profile, "description": description}
        return Notebook.from_api(self._client.request("POST", "notebooks/", json=body), self._client)

    def wait_ready(
        self,
        notebook_id: int,
        timeout: float | None = None,
        on_update: Callable[[Notebook], None] | None = None,
        *,
        on_step: Callable[[StartStep], None] | None = None,
    ) -> Notebook:
        """Wait until the notebook is READY; ``WorkloadFailed`` if it fails or stops first.
        ``on_step`` is called with each step of its start as it begins (``StartStep``): waiting for
        its instance or a worker, building its environment, starting Jupyter, waiting for it to answer."""
        notebook = poll(
            lambda: self.get(notebook_id),
            lambda n: n.state in Notebook.READY_STATES + Notebook.DEAD_STATES,
            timeout=timeout,
            describe=lambda n: f"Notebook {n.id} is still {n.state}",
            on_update=following_steps(on_update, on_step),
        )
        if not notebook.is_ready:
            reason = f": {notebook.failure_reason}" if notebook.failure_reason else ""
            raise WorkloadFailed(f"Notebook {notebook.id} is {notebook.state}{reason}", notebook)
        return notebook

    def url(self, notebook_id: int) -> str | None:
        """The address that opens the notebook once it is READY."""
        return self.get(notebook_id).url

    def delete(self, notebook_id: int) -> None:
        self._on(notebook_id, "DELETE", f"notebooks/{int(notebook_id)}/")


class Jobs(Resource):
    kind = "Job"

    def submit(self, spec: JobSpec | Mapping[str, Any] | str | os.PathLike[str] | None = None, /, **fields: Any) -> Job:
        """Submit a job from a spec (a YAML or JSON file's path, a dict, a ``JobSpec``) and/or keyword
        arguments, which take precedence. See ``gpuportal.spec`` for the fields."""
        job_spec = JobSpec.load(spec, **fields)
        job_spec.workspace = job_spec.workspace or self._client.default_workspace()
        if job_spec.gpus and not job_spec.gpu_type:
            job_spec.gpu_type = self._only_gpu_type(job_spec.workspace)
        return Job.from_api(self._client.request("POST", "jobs/", json=job_spec.to_api()), self._client)

    def _only_gpu_type(self, workspace: str) -> str:
        types = self._client.workspaces.get(workspace).gpu_types
        if len(types) == 1:
            return types[0]
        if not types:
            raise SpecError(f"workspace {workspace} has no GPU quota", field="gpu_type")
        raise SpecError(f"workspace {workspace} has quota for {', '.join(types)}: name one", field="gpu_type")

    def get(self, job_id: int) -> Job:
        return Job.from_api(self._on(job_id, "GET", f"jobs/{int(job_id)}/"), self._client)

    def list(
        self,
        workspace: str | None = None,
        state: str | list[str] | None = None,
        name: str | None = None,
        limit: int | None = 100,
    ) -> ResultList[Job]:
        """Jobs you can see, newest first; filter by workspace, state (one or a list) and name."""
        params = _filters(workspace, state)
        if name:
            params["name"] = name
        return ResultList(Job.from_api(d, self._client) for d in self._client.paginate("jobs/", params, limit))

    def queue(self, workspace: str | None = None, limit: int | None = None) -> ResultList[Job]:
        """Queued jobs in the cluster's queue order, each with its position, reason and estimate."""
        jobs = self.list(workspace, state="QUEUED", limit=limit)
        jobs.sort(key=lambda j: (j.queue_info.cluster_position is None, j.queue_info.cluster_position or 0, j.id))
        return jobs

    def cancel(self, job_id: int) -> Job:
        """Cancel a queued or running job; ``Conflict`` if it has already ended."""
        return Job.from_api(self._on(job_id, "POST", f"jobs/{int(job_id)}/cancel/"), self._client)

    def wait(
        self,
        job_id: int,
        timeout: float | None = None,
        *,
        check: bool = False,
        on_update: Callable[[Job], None] | None = None,
        on_step: Callable[[StartStep], None] | None = None,
    ) -> Job:
        """Wait for the job to end; the job as it ended. With `check`, ``WorkloadFailed`` unless it
        succeeded. ``WaitTimeout`` (with the job as ``obj``) after `timeout` seconds. ``on_step`` is
        called with each step of its start as it begins (``StartStep``)."""
        job = poll(
            lambda: self.get(job_id),
            lambda j: j.is_final,
            timeout=timeout,
            describe=lambda j: f"Job {j.id} is still {j.state}",
            on_update=following_steps(on_update, on_step),
        )
        if check:
            check_succeeded(job)
        return job

    def logs(self, job_id: int, replica: int = 0, offset: int = 0) -> LogChunk:
        """One read of a replica's log from `offset` (up to 1 MiB); pass back ``offset`` to continue."""
        answer = self._on(job_id, "GET", f"jobs/{int(job_id)}/logs/", params={"replica": replica, "offset": offset})
        return LogChunk(text=answer["text"], offset=int(answer["offset"]), state=answer["state"], replica=replica)

    def stream_logs(
        self,
        job_id: int,
        replica: int = 0,
        *,
        follow: bool = True,
        offset: int = 0,
        timeout: float | None = None,
        interval: float = 1.0,
    ) -> Iterator[str]:
        """Yield a replica's log text as it grows. With `follow`, keep reading until the job has
        ended and its log is read to the end (``WaitTimeout`` after `timeout` s); without, stop
        at the end of what is there now."""
        deadline = None if timeout is None else time.monotonic() + timeout
        outage = Outage()
        while True:
            try:
                chunk = self.logs(job_id, replica, offset)
                outage.over()
            except (PortalUnreachable, ServerError):
                outage.check()
                time.sleep(interval)
                continue
            offset = chunk.offset
            if chunk.text:
                yield chunk.text
                continue
            if not follow or chunk.state in Job.FINAL_STATES:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"Job {job_id} is still {chunk.state} after waiting {timeout:g} s.")
            time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))

    def download_artifacts(
        self, job_id: int, dest: str | Path = ".", paths: builtins.list[str] | None = None
    ) -> builtins.list[Path]:
        """Download the job's artifacts (those under `paths`, or all) into `dest`, each at its
        path in the job's directory, checked against the size and sha256 the portal recorded."""
        job = self.get(job_id)
        return download_recorded(self._client, f"jobs/{job.id}/artifact/", f"Job {job.id}", job.artifacts, dest, paths)


def download_recorded(
    client: Client,
    endpoint: str,
    owner: str,
    artifacts: list[Artifact],
    dest: str | Path = ".",
    paths: list[str] | None = None,
) -> list[Path]:
    """Download recorded artifacts (those under `paths`, or all) from `endpoint` into `dest`, each at
    its path, checked against the size and sha256 the portal recorded. `owner` names the workload
    in messages ("Job 12")."""
    wanted = [a for a in artifacts if paths is None or any(_under(a.path, p) for p in paths)]
    if paths is not None and not wanted:
        recorded = ", ".join(a.path for a in artifacts) or "none"
        raise ArtifactError(f"{owner} has no artifact under {', '.join(paths)} (it has: {recorded}).")
    saved = []
    root = Path(dest)
    for artifact in wanted:
        target = root / _safe_relative(artifact.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "w+b") as handle:
                size = client.download(endpoint, {"path": artifact.path}, handle)
                handle.seek(0)
                digest = _sha256(handle)
            if size != artifact.size_bytes or (artifact.sha256 and digest != artifact.sha256):
                raise ArtifactError(
                    f"{artifact.path}: got {size} bytes with sha256 {digest}, but the portal recorded "
                    f"{artifact.size_bytes} bytes with sha256 {artifact.sha256}."
                )
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
        saved.append(target)
    return saved


def _sha256(handle: Any) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: handle.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.strip("/")
    return path == prefix or path.startswith(prefix + "/")


def _safe_relative(path: str) -> Path:
    parts = PurePosixPath(path).parts
    if not parts or PurePosixPath(path).is_absolute() or ".." in parts:
        raise ArtifactError(f"Refusing to write the artifact {path!r} outside the destination folder.")
    return Path(*parts)
