"""GPU provisioning requests (GPRs) through the portal's API: the rows (``GPR``, its timeline's
``GPREvent``, an ``GPREstimate``, the calendar's ``Reservation``) and the resource ``client.gprs``.

A GPR asks ahead of time for whole GPUs of a type (in one cluster, or any), from a start (or as soon
as possible) for a duration, with a priority and a justification. The portal finds its earliest
feasible start; the workspace's policy approves it at once (within its quota and the policy's
longest time) or an admin decides. REQUESTED, APPROVED (its GPUs held from ``held_start`` to
``held_end``), ACTIVE, ENDED; or REJECTED, CANCELLED (before it began), RELEASED (ended early).

gpr = portal.gprs.create(workspace="demo-team", gpu_type="h100", gpus=4, duration="3d",
                         justification="Fine-tuning before the review")
print(gpr.state, gpr.held_start, gpr.held_end)
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpuportal.errors import SpecError
from gpuportal.models import Model, ResultList, _Refreshable, fmt_duration, parse_time
from gpuportal.resources import Resource

if TYPE_CHECKING:
    from gpuportal.client import Client

OPEN_STATES = ("REQUESTED", "APPROVED", "ACTIVE")
FINAL_STATES = ("ENDED", "REJECTED", "CANCELLED", "RELEASED")

#: A duration: seconds, a ``timedelta``, or words the portal reads (``"3d"``, ``"36h"``, ``"90m"``).
Duration = int | timedelta | str
#: A start: an aware ``datetime`` (a naive one is local time), or the same in ISO 8601.
Start = datetime | str


def _fmt_time(moment: datetime | None) -> str:
    """A local time to the minute, with its date."""
    return moment.astimezone().strftime("%Y-%m-%d %H:%M") if moment is not None else ""


def _fmt_seconds(seconds: int) -> str:
    """``3d``, ``36h``, ``90m`` where exact; else ``1d 2:03:00``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return fmt_duration(timedelta(seconds=seconds))


@dataclass(eq=False, repr=False)
class GPR(_Refreshable):
    """A GPU provisioning request: what was asked (``gpus`` ``gpu_type`` for ``duration_s`` from
    ``start_at``, or as soon as possible: ``asap``), what the calendar found (``earliest_start``),
    what is held once approved (``held_gpus`` on ``held_cluster`` from ``held_start`` to
    ``held_end``; ``in_use`` of them used now) and the decision (``decided_by``, ``decision_reason``;
    ``auto_approved`` when the workspace's policy approved it). ``pending_change``: an extension
    that waits for an admin."""

    id: int
    workspace: str
    state: str
    gpu_type: str
    gpus: int
    cluster: str | None
    asap: bool
    start_at: datetime | None
    duration_s: int
    end_at: datetime | None
    priority: int
    justification: str
    earliest_start: datetime | None
    held_cluster: str | None
    held_start: datetime | None
    held_end: datetime | None
    held_gpus: int
    in_use: int
    requested_by: str | None
    decided_by: str | None
    decided_at: datetime | None
    decision_reason: str
    auto_approved: bool
    pending_change: dict[str, Any] | None
    url: str
    created_at: datetime | None
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    FINAL_STATES = FINAL_STATES

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> GPR:
        return cls(
            id=int(data["id"]),
            workspace=data.get("workspace") or "",
            state=data.get("state") or "",
            gpu_type=data.get("gpu_type") or "",
            gpus=int(data.get("gpus") or 0),
            cluster=data.get("cluster"),
            asap=bool(data.get("asap")),
            start_at=parse_time(data.get("start_at")),
            duration_s=int(data.get("duration_s") or 0),
            end_at=parse_time(data.get("end_at")),
            priority=int(data.get("priority") or 0),
            justification=data.get("justification") or "",
            earliest_start=parse_time(data.get("earliest_start")),
            held_cluster=data.get("held_cluster"),
            held_start=parse_time(data.get("held_start")),
            held_end=parse_time(data.get("held_end")),
            held_gpus=int(data.get("held_gpus") or 0),
            in_use=int(data.get("in_use") or 0),
            requested_by=data.get("requested_by"),
            decided_by=data.get("decided_by"),
            decided_at=parse_time(data.get("decided_at")),
            decision_reason=data.get("decision_reason") or "",
            auto_approved=bool(data.get("auto_approved")),
            pending_change=data.get("pending_change"),
            url=data.get("url") or "",
            created_at=parse_time(data.get("created_at")),
            data=data,
            _client=client,
        )

    def __repr__(self) -> str:
        return f"<GPR {self.id} {self.gpus} {self.gpu_type} {self.workspace} {self.state}>"

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def window(self) -> str:
        """When it holds (or would hold) its GPUs: the held window once approved, else the earliest
        feasible start the calendar found, for the duration asked."""
        start = self.held_start or self.earliest_start
        if start is None:
            return ""
        end = self.held_end or start + timedelta(seconds=self.duration_s)
        return f"{_fmt_time(start)} to {_fmt_time(end)}"

    def _fetch(self) -> GPR:
        return self._bound().gprs.get(self.id)

    def modify(self, gpus: int | None = None, duration: Duration | None = None, start: Start | None = None) -> GPR:
        """Change it (see ``GPRs.modify``); updated in place."""
        self._update_from(lambda: self._bound().gprs.modify(self.id, gpus=gpus, duration=duration, start=start))
        return self

    def cancel(self) -> GPR:
        """Withdraw it before it began; updated in place."""
        self._update_from(lambda: self._bound().gprs.cancel(self.id))
        return self

    def release(self) -> GPR:
        """End it now, while it is active; updated in place."""
        self._update_from(lambda: self._bound().gprs.release(self.id))
        return self

    def events(self) -> ResultList[GPREvent]:
        return self._bound().gprs.events(self.id)

    def summary(self) -> dict[str, str]:
        return {
            "ID": str(self.id),
            "Workspace": self.workspace,
            "GPUs": f"{self.gpus} {self.gpu_type}",
            "Cluster": self.held_cluster or self.cluster or "any",
            "Duration": _fmt_seconds(self.duration_s),
            "Priority": str(self.priority),
            "State": self.state,
            "When": self.window,
        }

    def details(self) -> list[tuple[str, str]]:
        decided = ""
        if self.auto_approved:
            decided = "by the workspace's policy"
        elif self.decided_by:
            decided = f"by {self.decided_by} at {_fmt_time(self.decided_at)}"
        change = self.pending_change or {}
        return [
            ("GPR", str(self.id)),
            ("Workspace", self.workspace),
            ("State", self.state),
            ("Asked", f"{self.gpus} {self.gpu_type} on {self.cluster or 'any cluster'} for "
                      f"{_fmt_seconds(self.duration_s)}, "
                      f"{'as soon as possible' if self.asap else 'from ' + _fmt_time(self.start_at)}"),
            ("Priority", str(self.priority)),
            ("Justification", self.justification),
            ("Requested by", self.requested_by or ""),
            ("Earliest start", _fmt_time(self.earliest_start)),
            ("Held", f"{self.held_gpus} on {self.held_cluster}, {self.window}" if self.held_start else ""),
            ("In use", f"{self.in_use} of {self.held_gpus}" if self.state == "ACTIVE" else ""),
            ("Decided", decided),
            ("Reason", self.decision_reason),
            ("Extension", f"until {change.get('held_end')}: waits for an admin" if change else ""),
            ("Page", self.url),
        ]  # fmt: skip


@dataclass(eq=False)
class GPREvent(Model):
    """One step of a request's timeline: asked, approved, pending, rejected, changed, began,
    warned, idle, ended..., with who did it (None: the portal)."""

    at: datetime | None
    kind: str
    message: str
    actor: str | None
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> GPREvent:
        return cls(at=parse_time(data.get("at")), kind=data.get("kind") or "", message=data.get("message") or "",
                   actor=data.get("actor"), data=data, _client=client)  # fmt: skip

    def summary(self) -> dict[str, str]:
        return {"At": _fmt_time(self.at), "Step": self.kind, "By": self.actor or "", "What": self.message}


@dataclass(eq=False)
class GPREstimate(Model):
    """What a request would get, saved nowhere: the earliest feasible start, the cluster and GPUs it
    would hold, and whether the workspace's policy would approve it at once (``auto_approve``;
    ``needs_admin`` says why not)."""

    workspace: str
    gpu_type: str
    gpus: int
    cluster: str
    earliest_start: datetime | None
    end_at: datetime | None
    duration_s: int
    auto_approve: bool
    needs_admin: str
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> GPREstimate:
        return cls(
            workspace=data.get("workspace") or "",
            gpu_type=data.get("gpu_type") or "",
            gpus=int(data.get("gpus") or 0),
            cluster=data.get("cluster") or "",
            earliest_start=parse_time(data.get("earliest_start")),
            end_at=parse_time(data.get("end_at")),
            duration_s=int(data.get("duration_s") or 0),
            auto_approve=bool(data.get("auto_approve")),
            needs_admin=data.get("needs_admin") or "",
            data=data,
            _client=client,
        )

    def summary(self) -> dict[str, str]:
        return {
            "Workspace": self.workspace,
            "GPUs": f"{self.gpus} {self.gpu_type}",
            "Cluster": self.cluster,
            "Earliest start": _fmt_time(self.earliest_start),
            "End": _fmt_time(self.end_at),
            "Approval": "at once" if self.auto_approve else f"by an admin: {self.needs_admin}",
        }


@dataclass(eq=False)
class Reservation(Model):
    """One reservation of the calendar, whichever workspace holds it: only what the queue shows."""

    workspace: str
    gpu_type: str
    gpus: int
    cluster: str | None
    start: datetime | None
    end: datetime | None
    state: str
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> Reservation:
        return cls(
            workspace=data.get("workspace") or "",
            gpu_type=data.get("gpu_type") or "",
            gpus=int(data.get("gpus") or 0),
            cluster=data.get("cluster"),
            start=parse_time(data.get("start")),
            end=parse_time(data.get("end")),
            state=data.get("state") or "",
            data=data,
            _client=client,
        )

    def summary(self) -> dict[str, str]:
        return {
            "Start": _fmt_time(self.start),
            "End": _fmt_time(self.end),
            "Workspace": self.workspace,
            "GPUs": f"{self.gpus} {self.gpu_type}",
            "Cluster": self.cluster or "",
            "State": self.state,
        }


def _duration(value: Duration, name: str = "duration") -> dict[str, Any]:
    """The API's field for a duration: ``duration`` for words, ``duration_s`` for seconds."""
    if isinstance(value, timedelta):
        return {"duration_s": int(value.total_seconds())}
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SpecError(f"give seconds, a timedelta, or words such as 3d or 36h, not {value!r}", field=name)
    return {"duration": value} if isinstance(value, str) else {"duration_s": value}


def _time(value: Start, name: str = "start") -> str:
    """An ISO 8601 time with its offset (a naive one is local time)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise SpecError(f"{value!r} is not a time such as 2026-12-01T09:00", field=name) from None
    if not isinstance(value, datetime):
        raise SpecError(f"give a datetime or an ISO 8601 time, not {value!r}", field=name)
    return (value if value.tzinfo else value.astimezone()).isoformat()


def _id(gpr: int | GPR) -> int:
    return gpr.id if isinstance(gpr, GPR) else int(gpr)


class GPRs(Resource):
    """``client.gprs``: ask for GPUs ahead of time, follow, change and withdraw the requests; see
    the calendar of reservations; admins approve and reject."""

    kind = "GPR"

    def _terms(
        self, workspace: str | None, gpu_type: str, gpus: int, duration: Duration, start: Start | None,
        cluster: str | None, priority: int, justification: str | None,
    ) -> dict[str, Any]:  # fmt: skip
        body: dict[str, Any] = {"workspace": workspace or self._client.default_workspace(), "gpu_type": gpu_type,
                                "gpus": gpus, **_duration(duration), "priority": priority}  # fmt: skip
        if start is not None:
            body["start_at"] = _time(start)
        if cluster is not None:
            body["cluster"] = cluster
        if justification is not None:
            body["justification"] = justification
        return body

    def create(
        self,
        *,
        gpu_type: str,
        gpus: int,
        duration: Duration,
        justification: str,
        workspace: str | None = None,
        start: Start | None = None,
        cluster: str | None = None,
        priority: int = 0,
    ) -> GPR:
        """Ask for `gpus` whole GPUs of `gpu_type` (on `cluster`, or any one cluster) for `duration`
        (seconds, a timedelta, or ``"3d"``, ``"36h"``), from `start` (default: as soon as
        possible), with a `priority` (-100 to 100) and a `justification` the admin reads. It comes
        back APPROVED where the workspace's policy approves it at once (``held_start`` says from
        when), else REQUESTED. ``ValidationError`` names a refused field (``fields``): an unknown
        GPU type or cluster, more GPUs than a cluster has, a start in the past, longer than the
        policy allows."""
        body = self._terms(workspace, gpu_type, gpus, duration, start, cluster, priority, justification)
        return GPR.from_api(self._client.request("POST", "gprs/", json=body), self._client)

    def estimate(
        self,
        *,
        gpu_type: str,
        gpus: int,
        duration: Duration,
        workspace: str | None = None,
        start: Start | None = None,
        cluster: str | None = None,
        priority: int = 0,
    ) -> GPREstimate:
        """What ``create`` with these terms would get, saving nothing: the earliest feasible
        start, the cluster, and whether the policy would approve it at once. The same refusals."""
        body = self._terms(workspace, gpu_type, gpus, duration, start, cluster, priority, None)
        return GPREstimate.from_api(self._client.request("POST", "gprs/estimate/", json=body), self._client)

    def list(
        self,
        workspace: str | None = None,
        state: str | builtins.list[str] | tuple[str, ...] | None = None,
        gpu_type: str | None = None,
        limit: int | None = 100,
    ) -> ResultList[GPR]:
        """Requests you can see (every workspace's, for an admin), newest first; filter by
        workspace, state (one or several: ``"REQUESTED"`` is an admin's queue) and GPU type."""
        params: dict[str, Any] = {}
        if workspace:
            params["workspace"] = workspace
        if isinstance(state, str):
            params["state"] = state.upper()
        elif state:
            params["state__in"] = ",".join(s.upper() for s in state)
        if gpu_type:
            params["gpu_type"] = gpu_type
        return ResultList(GPR.from_api(d, self._client) for d in self._client.paginate("gprs/", params, limit))

    def get(self, gpr: int | GPR) -> GPR:
        """A request by id; ``NotFound`` if there is none you can see."""
        ident = _id(gpr)
        return GPR.from_api(self._on(ident, "GET", f"gprs/{ident}/"), self._client)

    def modify(
        self, gpr: int | GPR, *, gpus: int | None = None, duration: Duration | None = None, start: Start | None = None
    ) -> GPR:
        """Change a request. Not yet approved: its GPUs, duration or start, checked again.
        Approved or active: fewer GPUs (the others go back at once), a shorter time, or a longer
        one (beyond what the policy approves by itself, it waits for an admin: ``pending_change``)."""
        body: dict[str, Any] = {}
        if gpus is not None:
            body["gpus"] = gpus
        if duration is not None:
            body.update(_duration(duration))
        if start is not None:
            body["start_at"] = _time(start)
        if not body:
            raise SpecError("give gpus, duration or start", field="gpus")
        return self._post_or_patch(gpr, "PATCH", "", body)

    def cancel(self, gpr: int | GPR) -> GPR:
        """Withdraw a request that has not begun (``Conflict`` once it has: release it)."""
        return self._post_or_patch(gpr, "POST", "cancel/")

    def release(self, gpr: int | GPR) -> GPR:
        """End an active reservation now: its GPUs go back to everyone (``Conflict`` unless ACTIVE)."""
        return self._post_or_patch(gpr, "POST", "release/")

    def events(self, gpr: int | GPR) -> ResultList[GPREvent]:
        """Its timeline, oldest first."""
        ident = _id(gpr)
        return ResultList(GPREvent.from_api(d, self._client) for d in self._on(ident, "GET", f"gprs/{ident}/events/"))

    def calendar(self, start: Start | None = None, end: Start | None = None) -> ResultList[Reservation]:
        """Every approved or active reservation overlapping `start` to `end` (default: now to 14
        days on), whichever workspace holds it, earliest first."""
        params = {}
        if start is not None:
            params["from"] = _time(start, "start")
        if end is not None:
            params["to"] = _time(end, "end")
        answer = self._client.request("GET", "gprs/calendar/", params=params)
        return ResultList(Reservation.from_api(d, self._client) for d in answer)

    # -- Platform admins ---------------------------------------------------------------------------

    def approve(
        self,
        gpr: int | GPR,
        *,
        start: Start | None = None,
        gpus: int | None = None,
        duration: Duration | None = None,
        reason: str = "",
    ) -> GPR:
        """Approve a pending request, as asked or with a later `start`, fewer `gpus` or a shorter
        `duration`; `reason` is mailed to the requester. Platform admins only (``PermissionDenied``)."""
        body: dict[str, Any] = {"reason": reason}
        if start is not None:
            body["start_at"] = _time(start)
        if gpus is not None:
            body["gpus"] = gpus
        if duration is not None:
            body.update(_duration(duration))
        return self._post_or_patch(gpr, "POST", "approve/", body)

    def reject(self, gpr: int | GPR, reason: str) -> GPR:
        """Reject a pending request, saying why (the requester reads it). Platform admins only."""
        return self._post_or_patch(gpr, "POST", "reject/", {"reason": reason})

    def decide_change(self, gpr: int | GPR, approve: bool, reason: str = "") -> GPR:
        """Approve or refuse the extension an approved request waits for (``pending_change``).
        Platform admins only."""
        return self._post_or_patch(gpr, "POST", "decide-change/", {"approve": approve, "reason": reason})

    def _post_or_patch(self, gpr: int | GPR, method: str, action: str, body: dict[str, Any] | None = None) -> GPR:
        ident = _id(gpr)
        answer = self._on(ident, method, f"gprs/{ident}/{action}", json=body if body is not None else {})
        return GPR.from_api(answer, self._client)


def describe(gpr: GPR) -> str:
    """One line saying where a request stands: what it holds and when, why it waits, or how it ended."""
    head = f"GPR {gpr.id}: {gpr.state}"
    what = f"{gpr.gpus} {gpr.gpu_type}"
    if gpr.state == "REQUESTED":
        return f"{head}, waits for an admin: {what}, earliest feasible start {_fmt_time(gpr.earliest_start)}"
    if gpr.state == "APPROVED":
        how = " by the workspace's policy" if gpr.auto_approved else f" by {gpr.decided_by}" if gpr.decided_by else ""
        return f"{head}{how}: {what} on {gpr.held_cluster}, {gpr.window}"
    if gpr.state == "ACTIVE":
        return f"{head}: {what} on {gpr.held_cluster} until {_fmt_time(gpr.held_end)}, {gpr.in_use} in use"
    return head + (f": {gpr.decision_reason}" if gpr.state == "REJECTED" and gpr.decision_reason else "")
