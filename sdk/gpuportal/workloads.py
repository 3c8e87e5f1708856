"""Every kind of workload in one list: ``client.workloads`` reads ``/api/v1/workloads/`` (jobs,
instances, notebooks, Ray clusters, and any kind the portal adds), each with its ``kind``, state,
pod sets and where it stands in the queue. A kind's own resource (``client.jobs``,
``client.ray_clusters``...) has the rest of it, and changes it.

for w in portal.workloads.queue():
    print(w.kind, w.name, w.queue_info)
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from gpuportal.models import (
    Model,
    QueueInfo,
    ResultList,
    StartStep,
    _int_or_none,
    _queue,
    fmt_duration,
    gpus_of,
    on_replicas,
    parse_time,
    queue_or_end,
    start_steps,
)
from gpuportal.resources import Resource

if TYPE_CHECKING:
    from gpuportal.client import Client

#: The states in which a workload of any kind has ended.
ENDED_STATES = ("SUCCEEDED", "FAILED", "CANCELLED", "STOPPED", "DELETED")


@dataclass(frozen=True)
class PodSet:
    """One role of a workload: ``replicas`` alike replicas, each with ``gpus`` GPUs of ``gpu_type``."""

    role: str
    replicas: int
    gpu_type: str
    gpus: Decimal
    cpu_cores: int
    memory_gb: int

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> PodSet:
        return cls(
            role=data.get("role") or "",
            replicas=int(data.get("replicas") or 0),
            gpu_type=data.get("gpu_type") or "",
            gpus=Decimal(str(data.get("gpus") or "0")),
            cpu_cores=int(data.get("cpu_cores") or 0),
            memory_gb=int(data.get("memory_gb") or 0),
        )


@dataclass(eq=False)
class Workload(Model):
    """One workload of any kind (``job``, ``instance``, ``notebook``, ``raycluster``...)."""

    id: int
    kind: str
    name: str
    workspace: str
    state: str
    podsets: list[PodSet]
    queue_info: QueueInfo
    exit_code: int | None
    failure_reason: str
    cluster: str | None
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> Workload:
        return cls(
            id=int(data["id"]),
            kind=data.get("kind") or "",
            name=data.get("name") or "",
            workspace=data.get("workspace") or "",
            state=data.get("state") or "",
            podsets=[PodSet.from_api(p) for p in data.get("podsets") or []],
            queue_info=_queue(data),
            exit_code=_int_or_none(data.get("exit_code")),
            failure_reason=data.get("failure_reason") or "",
            cluster=data.get("cluster"),
            created_at=parse_time(data.get("created_at")),
            started_at=parse_time(data.get("started_at")),
            finished_at=parse_time(data.get("finished_at")),
            data=data,
            _client=client,
        )

    @property
    def start_progress(self) -> list[StartStep]:
        """What its last start did, step by step, with times (``gpuportal.StartStep``)."""
        return start_steps(self.data)

    @property
    def is_final(self) -> bool:
        return self.state in ENDED_STATES

    @property
    def gpus(self) -> str:
        """``4 × H100 on each of 2 replicas``, per role that has GPUs (``1 × H100 + 1 × H100 on each
        of 2 replicas``); empty without GPUs."""
        parts = []
        for podset in self.podsets:
            if not podset.gpus:
                continue
            parts.append(on_replicas(gpus_of(podset.gpus, podset.gpu_type), podset.replicas))
        return " + ".join(parts)

    @property
    def running_for(self) -> timedelta | None:
        """How long it has run, or ran."""
        if self.started_at is None:
            return None
        return (self.finished_at or datetime.now(timezone.utc)) - self.started_at

    def summary(self) -> dict[str, str]:
        return {
            "ID": str(self.id),
            "Kind": self.kind,
            "Name": self.name,
            "Workspace": self.workspace,
            "GPUs": self.gpus,
            "State": self.state,
            "Queue / running for": queue_or_end(self),
        }

    def details(self) -> list[tuple[str, str]]:
        running = self.running_for
        return [
            ("Workload", f"{self.id} {self.name} ({self.kind})"),
            ("Workspace", self.workspace),
            ("GPUs", self.gpus),
            ("State", self.state),
            ("Waiting because", self.queue_info.reason if self.state == "QUEUED" else ""),
            ("Running for" if not self.is_final else "Ran for", fmt_duration(running) if running else ""),
            ("Exit code", "" if self.exit_code is None else str(self.exit_code)),
            ("Failure", self.failure_reason),
        ]


def _choice(name: str, value: str | builtins.list[str] | tuple[str, ...] | None) -> dict[str, str]:
    """One value as `name=`, several as `name__in=` (the API's filters)."""
    if isinstance(value, str):
        return {name: value}
    return {f"{name}__in": ",".join(value)} if value else {}


class Workloads(Resource):
    """``client.workloads``: every kind's workloads you can see, read-only."""

    kind = "Workload"

    def list(
        self,
        workspace: str | None = None,
        kind: str | builtins.list[str] | tuple[str, ...] | None = None,
        state: str | builtins.list[str] | tuple[str, ...] | None = None,
        name: str | None = None,
        limit: int | None = 100,
    ) -> ResultList[Workload]:
        """Workloads newest first; filter by workspace, kind and state (one or several) and name."""
        params: dict[str, Any] = {**_choice("kind", kind)}
        if isinstance(state, str):
            params["state"] = state.upper()
        elif state:
            params["state__in"] = ",".join(s.upper() for s in state)
        if workspace:
            params["workspace__name"] = workspace
        if name:
            params["name"] = name
        items = self._client.paginate("workloads/", params, limit)
        return ResultList(Workload.from_api(d, self._client) for d in items)

    def queue(
        self,
        workspace: str | None = None,
        kind: str | builtins.list[str] | tuple[str, ...] | None = None,
        limit: int | None = None,
    ) -> ResultList[Workload]:
        """Queued workloads of every kind (or of `kind`) in the cluster's queue order, each with its
        position, reason and estimate."""
        queued = self.list(workspace, kind=kind, state="QUEUED", limit=limit)
        queued.sort(key=lambda w: (w.queue_info.cluster_position is None, w.queue_info.cluster_position or 0, w.id))
        return queued
