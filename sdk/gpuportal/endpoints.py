"""Inference endpoints through the portal's API: the rows (``Endpoint``, its replicas, scaling
events and figures) and the resource ``client.endpoints``.

An endpoint serves a model at a stable ``url``, the base URL of the OpenAI API (``<url>/chat/completions``,
``<url>/completions``), with replicas of an inference profile's server between ``min_replicas`` and
``max_replicas``, each admitted under the workspace's quota. The model is a path in the
workspace's directory, or a finished job's artifact. It is DEPLOYING until a replica serves, then
READY; IDLE when it has scaled to zero (the next request starts a replica); FAILED when its model
could not be served; DELETING, then DELETED once deleted.

endpoint = portal.endpoints.create("chat", profile="llama-cpu", job=42, artifact="model/")
endpoint.wait_ready()
token = endpoint.token()     # for OpenAI(base_url=endpoint.url, api_key=token)
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from types import EllipsisType
from typing import TYPE_CHECKING, Any

from gpuportal.errors import NotFound, PortalUnreachable, ServerError, SpecError, WaitTimeout, WorkloadFailed
from gpuportal.models import (
    Job,
    Model,
    ResultList,
    StartStep,
    _int_or_none,
    _Refreshable,
    fmt_when,
    parse_time,
    start_steps,
)
from gpuportal.resources import POLL_MAX_S, Outage, Resource, poll

if TYPE_CHECKING:
    from gpuportal.client import Client

LIVE_STATES = ("DEPLOYING", "READY", "IDLE", "DELETING")
FINAL_STATES = ("FAILED", "DELETED")
#: The states of an endpoint that no longer serves, and will not again.
GONE_STATES = ("FAILED", "DELETING", "DELETED")
REPLICA_LIVE_STATES = ("QUEUED", "ADMITTED", "READY", "STOPPING", "PREEMPTED")


# -- the rows ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EndpointReplica:
    """One server of an endpoint: QUEUED until admitted, ADMITTED while it starts, READY once it
    answers (STOPPING, PREEMPTED, then STOPPED or FAILED). ``version`` is the endpoint's version
    it serves; ``baseline`` replicas are its minimum, the others give way first."""

    id: int
    name: str
    version: int
    baseline: bool
    state: str
    reason: str
    wait_reason: str
    created_at: datetime | None
    started_at: datetime | None
    #: What its start did, step by step (``StartStep``), as a job's ``start_progress``.
    start_progress: tuple[StartStep, ...] = ()
    #: Set while it makes way for a drain of its node: it serves on until its replacement serves.
    retiring_at: datetime | None = None
    retire_reason: str = ""

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> EndpointReplica:
        return cls(
            id=int(data["id"]),
            name=data.get("name") or "",
            version=int(data.get("version") or 0),
            baseline=bool(data.get("baseline")),
            state=data.get("state") or "",
            reason=data.get("reason") or "",
            wait_reason=data.get("wait_reason") or "",
            created_at=parse_time(data.get("created_at")),
            started_at=parse_time(data.get("started_at")),
            start_progress=tuple(start_steps(data)),
            retiring_at=parse_time(data.get("retiring_at")),
            retire_reason=data.get("retire_reason") or "",
        )

    def __str__(self) -> str:
        why = self.wait_reason if self.state == "QUEUED" else self.reason
        return f"{self.id} {self.name} (v{self.version}) {self.state}" + (f": {why}" if why else "")


@dataclass(eq=False)
class ScaleEvent(Model):
    """One scaling decision of the portal, or a change asked for, with its reason in words."""

    at: datetime | None
    from_replicas: int
    to_replicas: int
    reason: str
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> ScaleEvent:
        return cls(
            at=parse_time(data.get("at")),
            from_replicas=int(data.get("from_replicas") or 0),
            to_replicas=int(data.get("to_replicas") or 0),
            reason=data.get("reason") or "",
            data=data,
            _client=client,
        )

    def summary(self) -> dict[str, str]:
        return {
            "At": _fmt_at(self.at),
            "Replicas": f"{self.from_replicas} -> {self.to_replicas}",
            "Reason": self.reason,
        }


@dataclass(eq=False)
class EndpointSample(Model):
    """The endpoint's figures at one time: replicas and those serving, requests waiting, requests
    and errors per second, p50 and p95 latency in seconds, tokens per second (None where unknown)."""

    at: datetime | None
    replicas: int
    serving: int
    waiting: int
    requests_per_s: float
    errors_per_s: float
    p50_s: float | None
    p95_s: float | None
    tokens_per_s: float | None
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> EndpointSample:
        return cls(
            at=parse_time(data.get("at")),
            replicas=int(data.get("replicas") or 0),
            serving=int(data.get("serving") or 0),
            waiting=int(data.get("waiting") or 0),
            requests_per_s=float(data.get("requests_per_s") or 0.0),
            errors_per_s=float(data.get("errors_per_s") or 0.0),
            p50_s=_float_or_none(data.get("p50_s")),
            p95_s=_float_or_none(data.get("p95_s")),
            tokens_per_s=_float_or_none(data.get("tokens_per_s")),
            data=data,
            _client=client,
        )

    def summary(self) -> dict[str, str]:
        return {
            "At": _fmt_at(self.at),
            "Replicas": str(self.replicas),
            "Serving": str(self.serving),
            "Waiting": str(self.waiting),
            "Req/s": f"{self.requests_per_s:.2f}",
            "Errors/s": f"{self.errors_per_s:.2f}",
            "p50 s": _fmt_float(self.p50_s, 3),
            "p95 s": _fmt_float(self.p95_s, 3),
            "Tokens/s": _fmt_float(self.tokens_per_s, 1),
        }


@dataclass(frozen=True)
class ReplicaLog:
    """Part of a replica's server log: its text from the offset asked for, and the offset to
    continue from. ``replica`` is the replica's id (None: the endpoint has had no replica)."""

    replica: int | None
    offset: int
    text: str


def _fmt_at(moment: datetime | None) -> str:
    """A local time to the second, with its date unless it is today."""
    if moment is None:
        return ""
    local = moment.astimezone()
    return local.strftime("%H:%M:%S" if local.date() == datetime.now().astimezone().date() else "%Y-%m-%d %H:%M:%S")


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _fmt_float(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


@dataclass(eq=False, repr=False)
class Endpoint(_Refreshable):
    """An inference endpoint: DEPLOYING until a replica serves, READY, IDLE once scaled to zero,
    FAILED, or DELETING then DELETED. ``url`` is the OpenAI API's base URL (``.../v1``)."""

    id: int
    workspace: str
    name: str
    description: str
    profile: str
    source: str
    path: str
    source_job: int | None
    artifact: str
    min_replicas: int
    max_replicas: int
    scale_to_zero_s: int | None
    version: int
    desired_replicas: int
    replicas: list[EndpointReplica]
    serving: int
    state: str
    failure_reason: str
    url: str
    last_request_at: datetime | None
    created_at: datetime | None
    finished_at: datetime | None
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Client | None = field(default=None, repr=False)

    FINAL_STATES = FINAL_STATES

    @classmethod
    def from_api(cls, data: dict[str, Any], client: Client | None = None) -> Endpoint:
        url = data.get("url") or ""
        if url.startswith("/") and client is not None:
            url = client.url + url  # a path on the portal itself
        return cls(
            id=int(data["id"]),
            workspace=data.get("workspace") or "",
            name=data.get("name") or "",
            description=data.get("description") or "",
            profile=data.get("profile") or "",
            source=data.get("source") or "",
            path=data.get("path") or "",
            source_job=_int_or_none(data.get("source_job")),
            artifact=data.get("artifact") or "",
            min_replicas=int(data.get("min_replicas") or 0),
            max_replicas=int(data.get("max_replicas") or 0),
            scale_to_zero_s=_int_or_none(data.get("scale_to_zero_s")),
            version=int(data.get("version") or 0),
            desired_replicas=int(data.get("desired_replicas") or 0),
            replicas=[EndpointReplica.from_api(r) for r in data.get("replicas") or []],
            serving=int(data.get("serving") or 0),
            state=data.get("state") or "",
            failure_reason=data.get("failure_reason") or "",
            url=url,
            last_request_at=parse_time(data.get("last_request_at")),
            created_at=parse_time(data.get("created_at")),
            finished_at=parse_time(data.get("finished_at")),
            data=data,
            _client=client,
        )

    def __repr__(self) -> str:
        return f"<Endpoint {self.id} {self.name} {self.state} {self.serving}/{self.bounds} serving>"

    @property
    def is_ready(self) -> bool:
        """A replica of its current version serves, or it has scaled to zero (the next request
        starts one): requests to ``url`` are answered."""
        return self.state == "IDLE" or (self.state == "READY" and self.serving_current > 0)

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def serving_current(self) -> int:
        """How many replicas of its current version serve (a rollout's new ones)."""
        return sum(1 for r in self.replicas if r.state == "READY" and r.version == self.version)

    @property
    def bounds(self) -> str:
        """``1-3`` replicas, or ``2`` where min and max are the same."""
        if self.min_replicas == self.max_replicas:
            return str(self.max_replicas)
        return f"{self.min_replicas}-{self.max_replicas}"

    @property
    def model(self) -> str:
        """What it serves, as it was asked for: ``job 42: model/``, or the path."""
        if self.source == "artifact" and self.source_job is not None:
            return f"job {self.source_job}: {self.artifact}"
        return self.path

    def _fetch(self) -> Endpoint:
        return self._bound().endpoints.get(self.id)

    def wait_ready(self, timeout: float | None = None, on_update: Callable[[Endpoint], None] | None = None) -> Endpoint:
        """Wait until its current version serves (see ``Endpoints.wait_ready``); updated in place."""
        self._update_from(
            lambda: self._bound().endpoints.wait_ready(
                self.id, timeout=timeout, on_update=on_update, version=self.version
            )
        )
        return self

    def scale(
        self,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        scale_to_zero_s: int | None | EllipsisType = ...,
    ) -> Endpoint:
        """Change its bounds (see ``Endpoints.scale``); updated in place."""
        self._update_from(lambda: self._bound().endpoints.scale(self.id, min_replicas, max_replicas, scale_to_zero_s))
        return self

    def update(self, **changes: Any) -> Endpoint:
        """Serve another model, or change its profile or description (see ``Endpoints.update``)."""
        self._update_from(lambda: self._bound().endpoints.update(self.id, **changes))
        return self

    def delete(self) -> Endpoint:
        """Stop every replica; it is DELETING until they stopped, then DELETED."""
        self._update_from(lambda: self._bound().endpoints.delete(self.id))
        return self

    def events(self) -> ResultList[ScaleEvent]:
        return self._bound().endpoints.events(self.id)

    def metrics(self) -> ResultList[EndpointSample]:
        return self._bound().endpoints.metrics(self.id)

    def logs(self, replica: int | None = None) -> str:
        """A replica's server log so far (default: the newest replica)."""
        return "".join(self._bound().endpoints.stream_logs(self.id, replica=replica, follow=False))

    def token(self, name: str | None = None, expires_in_days: int | None = None) -> str:
        """A new token that calls this endpoint alone (see ``Endpoints.token``)."""
        return self._bound().endpoints.token(self.id, name=name, expires_in_days=expires_in_days)

    def summary(self) -> dict[str, str]:
        return {
            "ID": str(self.id),
            "Name": self.name,
            "Workspace": self.workspace,
            "Profile": self.profile,
            "Model": self.model,
            "Serving": f"{self.serving}/{self.bounds}",
            "State": self.state,
            "URL": "" if self.is_final else self.url,
        }

    def details(self) -> list[tuple[str, str]]:
        to_zero = f"after {self.scale_to_zero_s} s without requests" if self.scale_to_zero_s is not None else "never"
        return [
            ("Endpoint", f"{self.id} {self.name}"),
            ("Workspace", self.workspace),
            ("Description", self.description),
            ("Profile", self.profile),
            ("Model", self.model),
            ("Served from", self.path if self.source == "artifact" else ""),
            ("Version", str(self.version)),
            ("State", self.state),
            ("Failure", self.failure_reason),
            ("URL", "" if self.is_final else self.url),
            ("Replicas", f"{self.min_replicas} to {self.max_replicas}; {self.desired_replicas} wanted now"),
            ("Scale to zero", to_zero),
            ("Serving", str(self.serving)),
            *((f"Replica {i + 1}", str(replica)) for i, replica in enumerate(self.replicas)),
            ("Last request", fmt_when(self.last_request_at)),
        ]


def describe(endpoint: Endpoint) -> str:
    """One line saying where an endpoint stands: its replicas while it deploys (why one waits), how
    many serve at which URL, or why it failed."""
    head = f"Endpoint {endpoint.id} {endpoint.name}: {endpoint.state}"
    if endpoint.state == "FAILED":
        return head + (f": {endpoint.failure_reason}" if endpoint.failure_reason else "")
    if endpoint.state in ("DELETING", "DELETED"):
        return head
    if endpoint.state == "IDLE":
        return f"{head}, scaled to zero (the next request starts a replica) at {endpoint.url}"
    current = [r for r in endpoint.replicas if r.version == endpoint.version]
    waiting = [r for r in current if r.state == "QUEUED"]
    parts = [f"{endpoint.serving_current} of {endpoint.desired_replicas} serving"]
    if waiting:
        parts.append(f"{len(waiting)} queued" + (f": {waiting[0].wait_reason}" if waiting[0].wait_reason else ""))
    starting = sum(1 for r in current if r.state == "ADMITTED")
    if starting:
        parts.append(f"{starting} starting")
    text = f"{head}, {', '.join(parts)}"
    if endpoint.state == "READY" and endpoint.serving_current < endpoint.serving:
        text += f", rolling out version {endpoint.version}"
    if endpoint.failure_reason:
        text += f" ({endpoint.failure_reason})"
    return text + (f", at {endpoint.url}" if endpoint.state == "READY" else "")


# -- the resource ------------------------------------------------------------------------------------

EndpointRef = int | Endpoint


def _id(endpoint: EndpointRef) -> int:
    return endpoint.id if isinstance(endpoint, Endpoint) else int(endpoint)


def _job_id(job: int | Job | None) -> int | None:
    return job.id if isinstance(job, Job) else job


class Endpoints(Resource):
    """``client.endpoints``: deploy models at stable URLs, scale them, follow them, delete them."""

    kind = "Endpoint"

    def create(
        self,
        name: str,
        *,
        profile: str | None = None,
        path: str | None = None,
        job: int | Job | None = None,
        artifact: str | None = None,
        workspace: str | None = None,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        scale_to_zero_s: int | None = None,
        description: str = "",
        cluster: str | None = None,
    ) -> Endpoint:
        """Deploy a model: a `path` in the workspace's directory (a GGUF file for llama.cpp, a
        Hugging Face model directory for vLLM), or the `artifact` of a finished `job` of the
        workspace (a file it left, or a directory of them: ``"model/"``). `profile` defaults to
        the only inference profile you may use. Replicas: `min_replicas` (default 1) to
        `max_replicas` (default the minimum, at least 1); with `scale_to_zero_s`, every replica
        stops after so many seconds without a request (a minimum of 0 needs it). Its minimum
        replicas are queued at once. A refused field raises ``ValidationError`` naming it."""
        model = _model_fields(path, job, artifact)  # checked before anything is sent
        body: dict[str, Any] = {
            "workspace": workspace or self._client.default_workspace(),
            "name": name,
            "profile": profile or self._only_profile(),
            **model,
            "description": description,
        }
        for key, value in (("min_replicas", min_replicas), ("max_replicas", max_replicas),
                           ("scale_to_zero_s", scale_to_zero_s), ("cluster", cluster)):  # fmt: skip
            if value is not None:
                body[key] = value
        return Endpoint.from_api(self._client.request("POST", "endpoints/", json=body), self._client)

    def _only_profile(self) -> str:
        names = [p.name for p in self._client.profiles.inference()]
        if len(names) == 1:
            return names[0]
        if not names:
            raise SpecError("no inference profile is open to you: ask an admin for one", field="profile")
        raise SpecError(f"name one of the inference profiles: {', '.join(names)}", field="profile")

    def get(self, endpoint: int | str, workspace: str | None = None) -> Endpoint:
        """An endpoint by id, or by name: the live one of that name in `workspace` (default: the
        client's workspace, else your private one). ``NotFound`` if there is none you can see."""
        if isinstance(endpoint, str) and not endpoint.isdigit():
            found = self.find(endpoint, workspace)
            if found is None:
                where = workspace or self._client.default_workspace()
                raise NotFound(
                    f"Endpoint {endpoint} was not found in workspace {where} (or you cannot see it).", status=404
                )
            return found
        ident = int(endpoint)
        return Endpoint.from_api(self._on(ident, "GET", f"endpoints/{ident}/"), self._client)

    def find(self, name: str, workspace: str | None = None) -> Endpoint | None:
        """The live (not ended) endpoint of this name in the workspace, if there is one."""
        found = self.list(workspace or self._client.default_workspace(), state=LIVE_STATES, name=name, limit=1)
        return found[0] if found else None

    def list(
        self,
        workspace: str | None = None,
        state: str | builtins.list[str] | tuple[str, ...] | None = None,
        name: str | None = None,
        limit: int | None = 100,
    ) -> ResultList[Endpoint]:
        """Endpoints you can see, newest first; filter by workspace, state (one or several) and name."""
        params: dict[str, Any] = {}
        if workspace:
            params["workspace__name"] = workspace
        if isinstance(state, str):
            params["state"] = state.upper()
        elif state:
            params["state__in"] = ",".join(s.upper() for s in state)
        if name:
            params["name"] = name
        items = self._client.paginate("endpoints/", params, limit)
        return ResultList(Endpoint.from_api(d, self._client) for d in items)

    def scale(
        self,
        endpoint: EndpointRef,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        scale_to_zero_s: int | None | EllipsisType = ...,
    ) -> Endpoint:
        """Change how many replicas it has: between `min_replicas` and `max_replicas` (each left
        as it is where not given); `scale_to_zero_s` seconds without a request stop every replica
        (None: never; left out: as it is). The replicas follow at once. ``ValidationError`` for
        bounds the portal refuses (a minimum above the maximum...), ``Conflict`` for an endpoint
        that has failed or is being deleted."""
        body: dict[str, Any] = {}
        if min_replicas is not None:
            body["min_replicas"] = min_replicas
        if max_replicas is not None:
            body["max_replicas"] = max_replicas
        if scale_to_zero_s is not ...:
            body["scale_to_zero_s"] = scale_to_zero_s
        if not body:
            raise SpecError("give min_replicas, max_replicas or scale_to_zero_s", field="min_replicas")
        return self._patch(endpoint, body)

    def update(
        self,
        endpoint: EndpointRef,
        *,
        path: str | None = None,
        job: int | Job | None = None,
        artifact: str | None = None,
        profile: str | None = None,
        description: str | None = None,
    ) -> Endpoint:
        """Serve another model (a `path`, or a finished `job`'s `artifact`) or the same with
        another `profile`: a new ``version``, rolled out without a failed request (the new
        replicas answer before the old ones stop; if they cannot start, it goes back to what
        served before and says why in ``failure_reason``). `description` changes only that.
        ``wait_ready(..., version=...)`` waits for the rollout."""
        body: dict[str, Any] = {}
        if path is not None or job is not None or artifact is not None:
            body.update(_model_fields(path, job, artifact))
        if profile is not None:
            body["profile"] = profile
        if description is not None:
            body["description"] = description
        if not body:
            raise SpecError("give path, or job and artifact, profile or description", field="path")
        return self._patch(endpoint, body)

    def _patch(self, endpoint: EndpointRef, body: dict[str, Any]) -> Endpoint:
        ident = _id(endpoint)
        return Endpoint.from_api(self._on(ident, "PATCH", f"endpoints/{ident}/", json=body), self._client)

    def delete(self, endpoint: EndpointRef) -> Endpoint:
        """Stop every replica: DELETING until they stopped, then DELETED (its URL answers 404 from
        now on). ``Conflict`` if it is already deleted. Returns the endpoint as it is then."""
        ident = _id(endpoint)
        self._on(ident, "DELETE", f"endpoints/{ident}/")  # 204, without the row
        return self.get(ident)

    def events(self, endpoint: EndpointRef) -> ResultList[ScaleEvent]:
        """Its scaling decisions, newest first, each with its reason (the last 200)."""
        ident = _id(endpoint)
        answer = self._on(ident, "GET", f"endpoints/{ident}/events/")
        return ResultList(ScaleEvent.from_api(d, self._client) for d in answer)

    def metrics(self, endpoint: EndpointRef) -> ResultList[EndpointSample]:
        """Its figures over the last day, oldest first."""
        ident = _id(endpoint)
        answer = self._on(ident, "GET", f"endpoints/{ident}/metrics/")
        return ResultList(EndpointSample.from_api(d, self._client) for d in answer)

    def logs(self, endpoint: EndpointRef, replica: int | None = None, offset: int = 0) -> ReplicaLog:
        """One read of a replica's server log from `offset` (`replica`: its id; default the
        newest); pass back ``offset`` to continue."""
        ident = _id(endpoint)
        params: dict[str, Any] = {"offset": offset}
        if replica is not None:
            params["replica"] = replica
        answer = self._on(ident, "GET", f"endpoints/{ident}/logs/", params=params)
        return ReplicaLog(_int_or_none(answer.get("replica")), int(answer.get("offset") or 0), answer.get("text") or "")

    def stream_logs(
        self,
        endpoint: EndpointRef,
        replica: int | None = None,
        *,
        follow: bool = True,
        offset: int = 0,
        timeout: float | None = None,
        interval: float = 1.0,
    ) -> Iterator[str]:
        """Yield a replica's log text as it grows (default: the newest replica when it starts).
        With `follow`, until that replica has ended (or the endpoint) and its log is read to the
        end (``WaitTimeout`` after `timeout` s); without, what is there now."""
        ident = _id(endpoint)
        deadline = None if timeout is None else time.monotonic() + timeout
        outage = Outage()
        while True:
            try:
                chunk = self.logs(ident, replica, offset)
                outage.over()
            except (PortalUnreachable, ServerError):
                outage.check()
                time.sleep(interval)
                continue
            replica, offset = chunk.replica if replica is None else replica, chunk.offset
            if chunk.text:
                yield chunk.text
                continue
            if not follow or not self._still_logging(ident, replica):
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"Endpoint {ident}'s replica {replica} still runs after waiting {timeout:g} s.")
            time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))

    def _still_logging(self, ident: int, replica: int | None) -> bool:
        """Whether the replica followed may still write (a live replica of a live endpoint); an
        endpoint without any replica yet may get one."""
        endpoint = self.get(ident)
        if endpoint.is_final:
            return False
        if replica is None:
            return True
        return any(r.id == replica and r.state in REPLICA_LIVE_STATES for r in endpoint.replicas)

    def token(self, endpoint: EndpointRef, name: str | None = None, expires_in_days: int | None = None) -> str:
        """Make a token that calls this endpoint alone (nothing else: not the portal's API, not
        another endpoint) and return its text, which the portal shows only this once. The
        portal's tokens page lists and revokes it. `name` says what it is for; it expires after
        `expires_in_days` (1 to 365; the portal's default otherwise)."""
        ident = _id(endpoint)
        body: dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        if expires_in_days is not None:
            body["expires_in_days"] = expires_in_days
        answer = self._on(ident, "POST", f"endpoints/{ident}/tokens/", json=body)
        return str(answer["token"])

    def wait_ready(
        self,
        endpoint: EndpointRef,
        timeout: float | None = None,
        on_update: Callable[[Endpoint], None] | None = None,
        *,
        version: int | None = None,
        interval: float = POLL_MAX_S,
    ) -> Endpoint:
        """Wait until requests to its URL are answered: a replica of its current version serves,
        or it has scaled to zero (IDLE: the next request starts one). With `version` (what
        ``update`` returned), until that version serves: a rollout. ``WorkloadFailed`` if it
        fails, is deleted, or the rollout is given up (it went back to an older version);
        ``WaitTimeout`` (with the endpoint as ``obj``) after `timeout` seconds."""
        ident = _id(endpoint)
        found = poll(
            lambda: self.get(ident),
            lambda e: e.state in GONE_STATES or e.is_ready or (version is not None and e.version < version),
            timeout=timeout,
            describe=lambda e: f"Endpoint {e.id} is still {e.state}",
            on_update=on_update,
            interval=interval,
        )
        reason = f": {found.failure_reason}" if found.failure_reason else ""
        if found.state in GONE_STATES:
            raise WorkloadFailed(f"Endpoint {found.id} {found.name} is {found.state}{reason}", found)
        if version is not None and found.version < version:
            message = f"Endpoint {found.id} {found.name} went back to version {found.version}{reason}"
            raise WorkloadFailed(message, found)
        return found


def _model_fields(path: str | None, job: int | Job | None, artifact: str | None) -> dict[str, Any]:
    """The API's fields for a model: a path, or a job and its artifact (``SpecError`` for both or
    for half of the second)."""
    job_id = _job_id(job)
    if path is not None and (job_id is not None or artifact is not None):
        raise SpecError("give a path, or a job and its artifact, not both", field="path")
    if path is not None:
        return {"path": path}
    if job_id is None:
        if artifact is not None:
            raise SpecError("an artifact is a job's: give the job too", field="source_job")
        raise SpecError("give the model: a path in the workspace's directory, or a job and its artifact", field="path")
    if not artifact:
        raise SpecError(f"name the artifact of job {job_id} to serve (a file, or a directory)", field="artifact")
    return {"source_job": job_id, "artifact": artifact}
