"""What the portal returns, as objects: workspaces, profiles, instances, notebooks and jobs.

Each keeps the API's fields as sent in ``data`` (what ``--json`` prints), and shows itself in
Jupyter as a small table with its state and, while it waits, its queue position and reason.
"""

from __future__ import annotations

import html
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from gpuportal.errors import WaitTimeout, WorkloadFailed

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpuportal.client import Client

T = TypeVar("T", bound="Model")
R = TypeVar("R", bound="_Refreshable")
W = TypeVar("W")

STATE_COLOURS = {
    "QUEUED": "#b26b00", "ADMITTED": "#0b62a4", "PROVISIONING": "#0b62a4", "PENDING": "#b26b00",
    "STARTING": "#0b62a4", "RUNNING": "#1a7f37", "READY": "#1a7f37", "SUCCEEDED": "#1a7f37",
    "FAILED": "#c62828", "CANCELLED": "#6e7781", "PREEMPTED": "#b26b00", "DELETING": "#6e7781",
    "DELETED": "#6e7781", "STOPPING": "#6e7781", "STOPPED": "#6e7781",
}  # fmt: skip


def parse_time(value: Any) -> datetime | None:
    """An API timestamp (ISO 8601, 'Z' for UTC) as an aware datetime."""
    if not value:
        return None
    text = str(value)
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)


def fmt_gpus(value: Decimal) -> str:
    return f"{value.normalize():f}"


def gpus_of(count: Decimal, gpu_type: str) -> str:
    """How many GPUs of which type, as the portal's pages and API write it: ``1 × H100``."""
    return f"{fmt_gpus(count)} × {(gpu_type or 'GPU').upper()}"


def on_replicas(per_replica: str, replicas: int) -> str:
    """``1 × H100``, or ``1 × H100 on each of 2 replicas`` (the pages' words)."""
    return per_replica if replicas == 1 else f"{per_replica} on each of {replicas} replicas"


def fmt_duration(delta: timedelta) -> str:
    """``1:02:03`` (hours:minutes:seconds), days in front past a day."""
    seconds = max(0, int(delta.total_seconds()))
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    text = f"{hours}:{minutes:02d}:{seconds:02d}"
    return f"{days}d {text}" if days else text


def fmt_when(moment: datetime | None, now: datetime | None = None) -> str:
    """A local time with how far away it is: ``14:05 (in 0:12:00)``."""
    if moment is None:
        return ""
    now = now or datetime.now(timezone.utc)
    local = moment.astimezone()
    shown = local.strftime("%H:%M") if abs(moment - now) < timedelta(hours=20) else local.strftime("%Y-%m-%d %H:%M")
    delta = moment - now
    return f"{shown} (in {fmt_duration(delta)})" if delta.total_seconds() > 0 else shown


def fmt_estimate(moment: datetime | None, now: datetime | None = None) -> str:
    """An estimated start: ``14:05 (in 0:12:00)``; ``unknown`` without one, and for one that has
    passed (the portal replaces an estimate seconds after it passes, so a passed one is stale)."""
    now = now or datetime.now(timezone.utc)
    if moment is None or moment <= now:
        return "unknown"
    return fmt_when(moment, now)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


class Model(ABC):
    """Methods shared by every object the portal returns."""

    data: dict[str, Any]
    _client: Client | None

    def _bound(self) -> Client:
        if self._client is None:
            raise RuntimeError(f"this {type(self).__name__} is not attached to a Client")
        return self._client

    @abstractmethod
    def summary(self) -> dict[str, str]:
        """One row of a table: column name -> text."""

    def details(self) -> list[tuple[str, str]]:
        """Label and text of each line shown for this object alone."""
        return list(self.summary().items())

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(label)}</th>"
            f"<td style='text-align:left'>{_cell(label, text)}</td></tr>"
            for label, text in self.details()
            if text
        )
        return f"<table>{rows}</table>"


def _cell(label: str, text: str) -> str:
    if label.lower() == "state" and text in STATE_COLOURS:
        return f"<b style='color:{STATE_COLOURS[text]}'>{html.escape(text)}</b>"
    return html.escape(text)


class ResultList(list[T], Generic[T]):
    """A list of portal objects that shows itself in Jupyter as one table."""

    def _repr_html_(self) -> str:
        if not self:
            return "<i>none</i>"
        rows = [item.summary() for item in self]
        columns = list(rows[0])
        head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in columns)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{_cell(c, row.get(c, ''))}</td>" for c in columns) + "</tr>"
            for row in rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass
class GPUQuota:
    gpu_type: str
    gpus: Decimal
    in_use: Decimal


@dataclass(eq=False)
class User(Model):
    username: str
    is_staff: bool
    private_workspace: str
    workspaces: list[str]
    groups: list[str]
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> User:
        return cls(
            username=data["username"],
            is_staff=bool(data.get("is_staff")),
            private_workspace=data.get("private_workspace") or "",
            workspaces=list(data.get("workspaces") or []),
            groups=list(data.get("groups") or []),
            data=data,
            _client=client,
        )

    def summary(self) -> dict[str, str]:
        return {
            "User": self.username,
            "Workspaces": ", ".join(self.workspaces),
            "Admin": "yes" if self.is_staff else "",
        }


@dataclass(eq=False)
class Workspace(Model):
    name: str
    display_name: str
    kind: str
    my_role: str | None
    gpu_quotas: list[GPUQuota]
    max_instances: int | None
    max_notebooks: int | None
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> Workspace:
        quotas = [
            GPUQuota(q["gpu_type"], Decimal(str(q.get("gpus", "0"))), Decimal(str(q.get("in_use") or "0")))
            for q in data.get("gpu_quotas") or []
        ]
        return cls(
            name=data["name"],
            display_name=data.get("display_name") or "",
            kind=data.get("kind") or "",
            my_role=data.get("my_role"),
            gpu_quotas=quotas,
            max_instances=_int_or_none(data.get("max_instances")),
            max_notebooks=_int_or_none(data.get("max_notebooks")),
            data=data,
            _client=client,
        )

    @property
    def gpu_types(self) -> list[str]:
        return [q.gpu_type for q in self.gpu_quotas]

    def summary(self) -> dict[str, str]:
        quotas = ", ".join(f"{fmt_gpus(q.in_use)}/{fmt_gpus(q.gpus)} {q.gpu_type}" for q in self.gpu_quotas)
        return {"Name": self.name, "Kind": self.kind, "Role": self.my_role or "", "GPUs in use/quota": quotas}


@dataclass(eq=False)
class ComputeProfile(Model):
    name: str
    display_name: str
    description: str
    gpu_type: str
    gpu_count: Decimal
    cpu_cores: int
    memory_gb: int
    size: str
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> ComputeProfile:
        return cls(
            name=data["name"],
            display_name=data.get("display_name") or "",
            description=data.get("description") or "",
            gpu_type=data.get("gpu_type") or "",
            gpu_count=Decimal(str(data.get("gpu_count") or "0")),
            cpu_cores=int(data.get("cpu_cores") or 0),
            memory_gb=int(data.get("memory_gb") or 0),
            size=data.get("size") or "",
            data=data,
            _client=client,
        )

    def summary(self) -> dict[str, str]:
        return {"Name": self.name, "Size": self.size, "Description": self.description}


@dataclass(eq=False)
class NotebookProfile(Model):
    name: str
    display_name: str
    description: str
    image: str
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> NotebookProfile:
        return cls(
            name=data["name"],
            display_name=data.get("display_name") or "",
            description=data.get("description") or "",
            image=data.get("image") or "",
            data=data,
            _client=client,
        )

    def summary(self) -> dict[str, str]:
        return {"Name": self.name, "Image": self.image, "Description": self.description}


@dataclass(eq=False)
class InferenceProfile(Model):
    """What an endpoint's replicas run: a server (``llamacpp`` on CPU, ``vllm`` on a GPU) and the
    size of one replica; ``concurrency`` is how many requests one replica serves at once."""

    name: str
    display_name: str
    description: str
    server: str
    gpu_type: str
    gpus: Decimal
    cpu_cores: int
    memory_gb: int
    size: str
    concurrency: int
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> InferenceProfile:
        return cls(
            name=data["name"],
            display_name=data.get("display_name") or "",
            description=data.get("description") or "",
            server=data.get("server") or "",
            gpu_type=data.get("gpu_type") or "",
            gpus=Decimal(str(data.get("gpus") or "0")),
            cpu_cores=int(data.get("cpu_cores") or 0),
            memory_gb=int(data.get("memory_gb") or 0),
            size=data.get("size") or "",
            concurrency=int(data.get("concurrency") or 0),
            data=data,
            _client=client,
        )

    def summary(self) -> dict[str, str]:
        return {"Name": self.name, "Server": self.server, "Size": self.size, "Description": self.description}


@dataclass(frozen=True)
class QueueInfo:
    """Where a waiting workload stands: its places in its workspace's and the cluster's queue,
    why it waits, and when the scheduler expects it to start."""

    position: int | None
    cluster_position: int | None
    reason: str
    estimated_start_at: datetime | None

    def __str__(self) -> str:
        parts = []
        if self.position is not None:
            parts.append(f"#{self.position} in its workspace")
        if self.cluster_position is not None:
            parts.append(f"#{self.cluster_position} in the cluster")
        text = ", ".join(parts) or "queued"
        if self.reason:
            text += f"; {self.reason}"
        return f"{text}; estimated start {fmt_estimate(self.estimated_start_at)}"


def _queue(data: dict[str, Any]) -> QueueInfo:
    return QueueInfo(
        position=_int_or_none(data.get("workspace_queue_position")),
        cluster_position=_int_or_none(data.get("cluster_queue_position")),
        reason=data.get("wait_reason") or "",
        estimated_start_at=parse_time(data.get("estimated_start_at")),
    )


STEP_LABELS = {
    "queued": "waiting for a worker",
    "environment": "environment",
    "starting": "starting",
    "answering": "waiting for an answer",
}


@dataclass(frozen=True)
class StartStep:
    """One step of a workload's start, as the portal recorded it when it happened: ``step``
    (``queued``, ``environment``, ``starting``, ``answering``), ``detail`` in words, when it began
    and ended (``ended_at`` None while it runs), how long it usually takes (``expected_s``, from
    earlier runs; None where there are none) and, for an environment build, the ``packages``."""

    step: str
    detail: str
    started_at: datetime | None
    ended_at: datetime | None
    expected_s: float | None = None
    packages: tuple[str, ...] = ()

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> StartStep:
        expected = data.get("expected_s")
        return cls(
            step=str(data.get("step") or ""),
            detail=str(data.get("detail") or ""),
            started_at=parse_time(data.get("started_at")),
            ended_at=parse_time(data.get("ended_at")),
            expected_s=None if expected is None else float(expected),
            packages=tuple(data.get("packages") or ()),
        )

    @property
    def took(self) -> timedelta | None:
        """How long it took, once it ended."""
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at

    def line(self) -> str:
        """``22:01:02 environment: building the Python environment (...): usually 40 s``."""
        when = self.started_at.astimezone().strftime("%H:%M:%S") if self.started_at else "--:--:--"
        return f"{when} {STEP_LABELS.get(self.step, self.step)}: {self.detail}"


def start_steps(data: dict[str, Any]) -> list[StartStep]:
    """The ``start_progress`` of an API answer, as steps."""
    return [StartStep.from_api(step) for step in data.get("start_progress") or [] if isinstance(step, dict)]


class StepFollower:
    """Calls ``on_step`` once with each new step of a workload's start, as successive answers
    about the workload show them (pass it as a wait's ``on_update``, or call it yourself); a new
    start of the same workload (its first step begun at another time) is followed from its first
    step. ``then``: another ``on_update`` called after it with every answer."""

    def __init__(self, on_step: Callable[[StartStep], None], then: Callable[[Any], None] | None = None) -> None:
        self.on_step, self.then = on_step, then
        self.seen: list[tuple[str, datetime | None]] = []

    def __call__(self, obj: Any) -> None:
        steps = start_steps(getattr(obj, "data", {}) or {})
        keys = [(step.step, step.started_at) for step in steps]
        if keys[:1] != self.seen[:1]:
            self.seen = []  # another start
        for step, key in zip(steps, keys, strict=True):
            if key not in self.seen:
                self.seen.append(key)
                self.on_step(step)
        if self.then is not None:
            self.then(obj)


def following_steps(
    on_update: Callable[[W], None] | None, on_step: Callable[[StartStep], None] | None
) -> Callable[[W], None] | None:
    """``on_update`` with ``on_step`` called first for each new start step (either may be None)."""
    return on_update if on_step is None else StepFollower(on_step, on_update)


class _Refreshable(Model):
    """Objects with an id that can be fetched again; ``refresh()`` updates them in place."""

    id: int

    @property
    def start_progress(self) -> list[StartStep]:
        """What its last start did, step by step, with times (empty before any start): waiting for
        a worker, building the environment, starting, waiting for it to answer."""
        return start_steps(self.data)

    @abstractmethod
    def _fetch(self) -> _Refreshable:
        """The same object, fetched again from the portal."""

    def _update_from(self, call: Callable[[], _Refreshable]) -> None:
        """Take on the fields of what `call` returns, or of the object a failed wait carries."""
        try:
            fresh = call()
        except (WaitTimeout, WorkloadFailed) as exc:
            if isinstance(exc.obj, type(self)):
                vars(self).update(vars(exc.obj))
            raise
        vars(self).update(vars(fresh))

    def refresh(self: R) -> R:
        """Fetch the object again and update this one in place; returns it."""
        fresh = self._fetch()
        vars(self).update(vars(fresh))
        return self


@dataclass(eq=False, repr=False)
class Instance(_Refreshable):
    """A compute instance: QUEUED until admitted, PROVISIONING, then RUNNING."""

    id: int
    workspace: str
    name: str
    profile: str
    size: str
    state: str
    failure_reason: str
    wait_reason: str
    queue_info: QueueInfo
    started_at: datetime | None
    running_for_s: int | None
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    READY_STATES = ("RUNNING",)
    DEAD_STATES = ("FAILED", "DELETING", "DELETED")

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> Instance:
        return cls(
            id=int(data["id"]),
            workspace=data.get("workspace") or "",
            name=data.get("name") or "",
            profile=data.get("profile") or "",
            size=data.get("size") or "",
            state=data.get("state") or "",
            failure_reason=data.get("failure_reason") or "",
            wait_reason=data.get("wait_reason") or "",
            queue_info=_queue(data),
            started_at=parse_time(data.get("started_at")),
            running_for_s=_int_or_none(data.get("running_for_s")),
            data=data,
            _client=client,
        )

    def __repr__(self) -> str:
        return f"<Instance {self.id} {self.name} {self.state}{_waiting(self.state, self.queue_info)}>"

    @property
    def is_ready(self) -> bool:
        return self.state in self.READY_STATES

    @property
    def queue(self) -> QueueInfo | None:
        """Where it stands while QUEUED; None otherwise."""
        return self.queue_info if self.state == "QUEUED" else None

    def _fetch(self) -> Instance:
        return self._bound().instances.get(self.id)

    def wait_ready(
        self,
        timeout: float | None = None,
        on_update: Callable[[Instance], None] | None = None,
        *,
        on_step: Callable[[StartStep], None] | None = None,
    ) -> Instance:
        """Wait until the instance is RUNNING; ``WorkloadFailed`` if it fails or is deleted instead.
        ``on_step`` (``print``, say) is called with each step of its start as it begins."""
        instances = self._bound().instances
        self._update_from(lambda: instances.wait_ready(self.id, timeout=timeout, on_update=on_update, on_step=on_step))
        return self

    def delete(self) -> None:
        """Delete the instance and what runs on it, irreversibly."""
        self._bound().instances.delete(self.id)

    def launch_notebook(self, name: str, *, profile: str, description: str = "") -> Notebook:
        return self._bound().notebooks.launch(self.id, name, profile=profile, description=description)

    def summary(self) -> dict[str, str]:
        return {
            "ID": str(self.id),
            "Name": self.name,
            "Workspace": self.workspace,
            "Profile": self.profile,
            "State": self.state,
            "Queue / running for": _status_text(self.state, self.queue_info, self.running_for_s),
        }

    def details(self) -> list[tuple[str, str]]:
        return [
            ("Instance", f"{self.id} {self.name}"),
            ("Workspace", self.workspace),
            ("Profile", f"{self.profile} ({self.size})" if self.size else self.profile),
            ("State", self.state),
            *_queue_details(self.state, self.queue_info),
            ("Running for", fmt_duration(timedelta(seconds=self.running_for_s)) if self.running_for_s else ""),
            ("Failure", self.failure_reason),
        ]


@dataclass(eq=False, repr=False)
class Notebook(_Refreshable):
    """A Jupyter notebook on an instance: PENDING, STARTING, then READY with its ``url``."""

    id: int
    workspace: str
    instance: int
    name: str
    profile: str
    state: str
    failure_reason: str
    url: str | None
    access_token: str | None
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    READY_STATES = ("READY",)
    DEAD_STATES = ("FAILED", "STOPPING", "STOPPED")

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> Notebook:
        url = data.get("url") or None
        if url and url.startswith("/") and client is not None:
            url = client.url + url  # the portal gives a path on itself
        return cls(
            id=int(data["id"]),
            workspace=data.get("workspace") or "",
            instance=int(data["instance"]),
            name=data.get("name") or "",
            profile=data.get("profile") or "",
            state=data.get("state") or "",
            failure_reason=data.get("failure_reason") or "",
            url=url,
            access_token=data.get("access_token"),
            data=data,
            _client=client,
        )

    def __repr__(self) -> str:
        return f"<Notebook {self.id} {self.name} {self.state}{' ' + self.url if self.url else ''}>"

    @property
    def is_ready(self) -> bool:
        return self.state in self.READY_STATES

    def _fetch(self) -> Notebook:
        return self._bound().notebooks.get(self.id)

    def wait_ready(
        self,
        timeout: float | None = None,
        on_update: Callable[[Notebook], None] | None = None,
        *,
        on_step: Callable[[StartStep], None] | None = None,
    ) -> Notebook:
        """Wait until the notebook is READY (its ``url`` then opens it). ``on_step`` (``print``,
        say) is called with each step of its start as it begins."""
        notebooks = self._bound().notebooks
        self._update_from(lambda: notebooks.wait_ready(self.id, timeout=timeout, on_update=on_update, on_step=on_step))
        return self

    def delete(self) -> None:
        self._bound().notebooks.delete(self.id)

    def summary(self) -> dict[str, str]:
        return {
            "ID": str(self.id),
            "Name": self.name,
            "Workspace": self.workspace,
            "Instance": str(self.instance),
            "Profile": self.profile,
            "State": self.state,
            "URL": self.url if self.url and self.is_ready else "",
        }

    def _repr_html_(self) -> str:
        table = super()._repr_html_()
        if self.url and self.is_ready:
            link = html.escape(self.url, quote=True)
            table += f"<p><a href='{link}' target='_blank'>Open {html.escape(self.name)}</a></p>"
        return table


@dataclass(frozen=True)
class Artifact:
    """A file a job left behind: its path in the job's directory, size and sha256."""

    path: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class LogChunk:
    """Part of a replica's log: the text from the offset asked for, the offset to continue from,
    and the job's state when it was read."""

    text: str
    offset: int
    state: str
    replica: int


JOB_FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")


@dataclass(eq=False, repr=False)
class Job(_Refreshable):
    """A batch job: QUEUED, ADMITTED, RUNNING, then SUCCEEDED, FAILED or CANCELLED (PREEMPTED
    jobs go back to QUEUED)."""

    id: int
    workspace: str
    name: str
    state: str
    command: str
    image: str
    env: dict[str, str]
    gpu_type: str
    gpus_per_replica: Decimal
    replicas: int
    priority: int
    max_runtime_s: int | None
    artifact_paths: list[str]
    failure_reason: str
    exit_code: int | None
    attempts: int
    progress: float | None
    queue_info: QueueInfo
    cluster: str | None
    created_by: str | None
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    artifacts: list[Artifact]
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    FINAL_STATES = JOB_FINAL_STATES

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> Job:
        progress = data.get("progress")
        return cls(
            id=int(data["id"]),
            workspace=data.get("workspace") or "",
            name=data.get("name") or "",
            state=data.get("state") or "",
            command=data.get("command") or "",
            image=data.get("image") or "",
            env=dict(data.get("env") or {}),
            gpu_type=data.get("gpu_type") or "",
            gpus_per_replica=Decimal(str(data.get("gpus_per_replica") or "0")),
            replicas=int(data.get("replicas") or 1),
            priority=int(data.get("priority") or 0),
            max_runtime_s=_int_or_none(data.get("max_runtime_s")),
            artifact_paths=list(data.get("artifact_paths") or []),
            failure_reason=data.get("failure_reason") or "",
            exit_code=_int_or_none(data.get("exit_code")),
            attempts=int(data.get("attempts") or 0),
            progress=None if progress is None else float(progress),
            queue_info=_queue(data),
            cluster=data.get("cluster"),
            created_by=data.get("created_by"),
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
        text = f"<Job {self.id} {self.name} {self.state}"
        if self.state in JOB_FINAL_STATES and self.exit_code is not None:
            text += f" exit code {self.exit_code}"
        return text + _waiting(self.state, self.queue_info) + ">"

    @property
    def is_final(self) -> bool:
        return self.state in JOB_FINAL_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "SUCCEEDED"

    @property
    def queue(self) -> QueueInfo | None:
        """Where the job stands while QUEUED; None once it has been admitted."""
        return self.queue_info if self.state == "QUEUED" else None

    @property
    def running_for(self) -> timedelta | None:
        """How long it has run (its last attempt), or ran."""
        if self.started_at is None:
            return None
        end = self.finished_at or datetime.now(timezone.utc)
        return end - self.started_at

    @property
    def gpus(self) -> str:
        """``4 × H100 on each of 2 replicas``: GPUs per replica and type; empty without GPUs."""
        if not self.gpus_per_replica:
            return ""
        return on_replicas(gpus_of(self.gpus_per_replica, self.gpu_type), self.replicas)

    def _fetch(self) -> Job:
        return self._bound().jobs.get(self.id)

    def wait(
        self,
        timeout: float | None = None,
        *,
        check: bool = False,
        on_update: Callable[[Job], None] | None = None,
        on_step: Callable[[StartStep], None] | None = None,
    ) -> Job:
        """Wait for the job to end and return it (updated in place). ``check=True`` raises
        ``WorkloadFailed`` unless it succeeded; ``WaitTimeout`` after `timeout` seconds.
        ``on_step`` (``print``, say) is called with each step of its start as it begins."""
        jobs = self._bound().jobs
        self._update_from(lambda: jobs.wait(self.id, timeout=timeout, on_update=on_update, on_step=on_step))
        if check:
            check_succeeded(self)
        return self

    def cancel(self) -> Job:
        self._update_from(lambda: self._bound().jobs.cancel(self.id))
        return self

    def logs(self, replica: int = 0) -> str:
        """The whole log of one replica so far."""
        return "".join(self._bound().jobs.stream_logs(self.id, replica=replica, follow=False))

    def stream_logs(self, replica: int = 0, *, follow: bool = True, offset: int = 0) -> Iterator[str]:
        """Yield the log of one replica as it grows; with `follow`, until the job has ended."""
        return self._bound().jobs.stream_logs(self.id, replica=replica, follow=follow, offset=offset)

    def download_artifacts(self, dest: str | Path = ".", paths: list[str] | None = None) -> list[Path]:
        """Save the job's artifacts under `dest` (each at its path in the job's directory)."""
        return self._bound().jobs.download_artifacts(self.id, dest, paths=paths)

    def summary(self) -> dict[str, str]:
        return {
            "ID": str(self.id),
            "Name": self.name,
            "Workspace": self.workspace,
            "GPUs": self.gpus,
            "State": self.state,
            "Queue / running for": queue_or_end(self),
        }

    def details(self) -> list[tuple[str, str]]:
        running = self.running_for
        return [
            ("Job", f"{self.id} {self.name}"),
            ("Workspace", self.workspace),
            ("GPUs", self.gpus),
            ("State", self.state),
            *_queue_details(self.state, self.queue_info),
            ("Running for" if not self.is_final else "Ran for", fmt_duration(running) if running else ""),
            ("Progress", f"{self.progress:.0%}" if self.progress is not None else ""),
            ("Exit code", "" if self.exit_code is None else str(self.exit_code)),
            ("Failure", self.failure_reason),
            ("Artifacts", ", ".join(a.path for a in self.artifacts)),
        ]


def check_succeeded(job: Job) -> None:
    """``WorkloadFailed`` unless the job succeeded."""
    if not job.succeeded:
        detail = f" with exit code {job.exit_code}" if job.exit_code is not None else ""
        reason = f": {job.failure_reason}" if job.failure_reason else ""
        raise WorkloadFailed(f"Job {job.id} {job.state}{detail}{reason}", job)


def _waiting(state: str, queue: QueueInfo) -> str:
    if state != "QUEUED" or queue.position is None:
        return ""
    return f" position {queue.position}" + (f": {queue.reason}" if queue.reason else "")


class _Ending(Protocol):
    state: str
    queue_info: QueueInfo
    exit_code: int | None
    failure_reason: str

    @property
    def is_final(self) -> bool: ...

    @property
    def running_for(self) -> timedelta | None: ...


def queue_or_end(work: _Ending) -> str:
    """A listing's "Queue / running for": the place and reason in line, how long it has run, or
    how it ended (its exit code, else why it failed)."""
    if work.is_final:
        return f"exit code {work.exit_code}" if work.exit_code is not None else work.failure_reason[:60]
    running = work.running_for
    return _status_text(work.state, work.queue_info, int(running.total_seconds()) if running else None)


def _status_text(state: str, queue: QueueInfo, running_s: int | None) -> str:
    if state == "QUEUED":
        position = f"#{queue.position}" if queue.position is not None else ""
        return f"{position} {queue.reason}".strip()
    if running_s is not None:
        return fmt_duration(timedelta(seconds=running_s))
    return ""


def _queue_details(state: str, queue: QueueInfo) -> list[tuple[str, str]]:
    if state != "QUEUED":
        return []
    return [
        ("Queue position", "" if queue.position is None else f"{queue.position} in its workspace"),
        ("Cluster position", "" if queue.cluster_position is None else str(queue.cluster_position)),
        ("Waiting because", queue.reason),
        ("Estimated start", fmt_estimate(queue.estimated_start_at)),
    ]
