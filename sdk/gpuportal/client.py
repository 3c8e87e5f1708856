"""The client: one HTTP session to a portal, with its resources as attributes.

portal = Client("http://127.0.0.1:8000", token="...")   # or Client.from_env()
portal.jobs.submit("job.yaml").wait()
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from gpuportal import __version__, config
from gpuportal.endpoints import Endpoints
from gpuportal.errors import (
    APIError,
    AuthenticationError,
    ConfigError,
    NotFound,
    PortalUnreachable,
    ValidationError,
    WaitTimeout,
    error_for,
)
from gpuportal.gprs import GPRs
from gpuportal.models import User
from gpuportal.rayclusters import RayClusters
from gpuportal.resources import Instances, Jobs, Notebooks, Profiles, Workspaces
from gpuportal.workloads import Workloads

IDEMPOTENT = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
RETRY_STATUSES = frozenset({502, 503, 504})
RETRIES = 3


class Client:
    """A connection to one portal, authenticated by an API token.

    Resources: ``workspaces``, ``profiles``, ``instances``, ``notebooks``, ``jobs``,
    ``ray_clusters`` (``gpuportal.ray`` builds CodeFlare's ``Cluster`` and ``RayJob`` on it),
    ``endpoints`` (inference endpoints), ``gprs`` (GPU provisioning requests: GPUs reserved ahead of
    time) and ``workloads`` (every kind in one read-only list, with its kind). Errors
    are raised as the typed exceptions of ``gpuportal.errors``, with the portal's message.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        workspace: str | None = None,
        timeout: float = 30.0,
        verify: bool | str = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not url or not url.startswith(("http://", "https://")):
            raise ConfigError(f"The portal URL should start with http:// or https://, not {url!r}.")
        self.url = url.rstrip("/")
        self.token = token
        self.workspace = workspace
        headers = {"User-Agent": f"gpuportal/{__version__}", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Token {token}"
        self._http = httpx.Client(
            base_url=f"{self.url}/api/v1/", headers=headers, timeout=timeout, verify=verify, transport=transport
        )
        self._private_workspace: str | None = None
        self.workspaces = Workspaces(self)
        self.profiles = Profiles(self)
        self.instances = Instances(self)
        self.notebooks = Notebooks(self)
        self.jobs = Jobs(self)
        self.ray_clusters = RayClusters(self)
        self.endpoints = Endpoints(self)
        self.gprs = GPRs(self)
        self.workloads = Workloads(self)

    @classmethod
    def from_env(cls, **kwargs: Any) -> Client:
        """From ``GPUPORTAL_URL``, ``GPUPORTAL_TOKEN`` (and ``GPUPORTAL_WORKSPACE``); what they leave
        out comes from the configuration file that ``gpuportal login`` writes."""
        return cls._from(config.resolve(), "Set GPUPORTAL_URL and GPUPORTAL_TOKEN, or run `gpuportal login`.", kwargs)

    @classmethod
    def from_config(cls, path: str | Path | None = None, **kwargs: Any) -> Client:
        """From the configuration file only (``~/.config/gpuportal/config.yaml`` unless `path`)."""
        file = Path(path).expanduser() if path else config.config_path()
        return cls._from(config.read_file(file), f"{file} has no url and token: run `gpuportal login`.", kwargs)

    @classmethod
    def _from(cls, conf: config.Config, hint: str, kwargs: dict[str, Any]) -> Client:
        if not conf.url or not conf.token:
            missing = " and ".join(name for name in ("url", "token") if not getattr(conf, name))
            raise ConfigError(f"No portal {missing} configured. {hint}")
        kwargs.setdefault("workspace", conf.workspace)
        return cls(conf.url, conf.token, **kwargs)

    @classmethod
    def login(cls, url: str, username: str, password: str, **kwargs: Any) -> Client:
        """Exchange a username and password for a token (the portal's token endpoint) and connect."""
        anonymous = cls(url, **{k: v for k, v in kwargs.items() if k != "workspace"})
        try:
            answer = anonymous.request("POST", "auth/token/", json={"username": username, "password": password})
        finally:
            anonymous.close()
        return cls(url, str(answer["token"]), **kwargs)

    @classmethod
    def login_in_browser(
        cls,
        url: str,
        show: Callable[[str, str, str], None],
        *,
        name: str = "gpuportal login",
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> Client:
        """Sign in through the portal's web page (single sign-on included) and connect.

        `show(page, code, page_with_code)` tells the person where to go and which code to allow
        there (the CLI prints both and opens a browser where there is one); then the portal is
        asked every few seconds until the code is allowed (the token comes back), refused, or
        expired (`AuthenticationError`)."""
        anonymous = cls(url, **{k: v for k, v in kwargs.items() if k != "workspace"})
        try:
            login = anonymous.request("POST", "auth/device/", json={"name": name})
            show(str(login["verification_uri"]), str(login["user_code"]), str(login["verification_uri_complete"]))
            deadline = time.monotonic() + min(float(login["expires_in"]), timeout_s or float("inf"))
            interval = max(1.0, float(login.get("interval") or 2))
            while True:
                try:
                    answer = anonymous.request("POST", "auth/device/token/", json={"device_code": login["device_code"]})
                    break
                except ValidationError as error:
                    if error.code != "authorization_pending":
                        raise AuthenticationError(error.message, status=401, code=error.code) from error
                if time.monotonic() + interval > deadline:
                    raise AuthenticationError("The code was not allowed in time.", status=401, code="expired_token")
                time.sleep(interval)
        finally:
            anonymous.close()
        return cls(url, str(answer["token"]), **kwargs)

    def revoke_token(self) -> bool:
        """Revoke this client's own token on the portal (a personal token: `gpuportal logout` does);
        False for a token the portal does not list, such as a workload's."""
        if not self.token or not self.token.startswith("gpp_"):
            return False
        key_id = self.token.split("_", 2)[1]
        found = self.request("GET", "tokens/", params={"key_id": key_id})["results"]
        if not found:
            return False
        self.request("DELETE", f"tokens/{found[0]['id']}/")
        return True

    def __repr__(self) -> str:
        return f"<gpuportal.Client {self.url}>"

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def me(self) -> User:
        """Who the token belongs to, and the workspaces it can use."""
        return User.from_api(self.request("GET", "me/"), self)

    def default_workspace(self) -> str:
        """The workspace used where none is named: the configured one, else your private one."""
        if self.workspace:
            return self.workspace
        if self._private_workspace is None:
            self._private_workspace = self.me().private_workspace
        return self._private_workspace

    # -- Admin: what-if replays ------------------------------------------------------------------

    def start_replay(
        self,
        *,
        since: str,
        until: str | None = None,
        quotas: list[str] | None = None,
        cohorts: list[str] | None = None,
        policy: str | None = None,
        preemption: bool | None = None,
        min_runtime_s: float | None = None,
        starvation_s: float | None = None,
        cluster_gpus: str | None = None,
    ) -> dict[str, Any]:
        """Start a what-if replay of the portal's history (platform admins only): the workloads
        submitted from `since` to `until` (ISO 8601; default now), replayed under today's settings
        and under these changes. `quotas`: "WORKSPACE=+N", "=-N" or "=N" whole GPUs; `cohorts`:
        "WORKSPACE=COHORT" ("WORKSPACE=" for none); `cluster_gpus`: "+N", "-N" or "N". Returns the
        replay (its ``id``, ``state``, ``progress``); it runs in the background: see `wait_replay`.
        A refused field raises `ValidationError` naming it."""
        body = {
            "since": since, "until": until, "quotas": quotas, "cohorts": cohorts, "policy": policy,
            "preemption": preemption, "min_runtime_s": min_runtime_s, "starvation_s": starvation_s,
            "cluster_gpus": cluster_gpus,
        }  # fmt: skip
        given = {name: value for name, value in body.items() if value is not None and value != []}
        answer: dict[str, Any] = self.request("POST", "admin/whatif/", json=given)
        return answer

    def replay(self, replay_id: int) -> dict[str, Any]:
        """A what-if replay: its state, progress and, once done, its figures (``result``)."""
        answer: dict[str, Any] = self.request("GET", f"admin/whatif/{int(replay_id)}/")
        return answer

    def replay_csv(self, replay_id: int) -> str:
        """A finished replay's figures as CSV: per workspace, each figure today and what-if."""
        return self._send("GET", f"admin/whatif/{int(replay_id)}/csv/").text

    def wait_replay(
        self,
        replay_id: int,
        *,
        timeout_s: float | None = None,
        poll_s: float = 1.0,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Wait for a replay to end (SUCCEEDED or FAILED) and return it; `WaitTimeout` after `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            replay = self.replay(replay_id)
            if on_progress is not None:
                on_progress(replay)
            if replay["state"] in ("SUCCEEDED", "FAILED"):
                return replay
            if deadline is not None and time.monotonic() + poll_s > deadline:
                raise WaitTimeout(f"What-if replay {replay_id} is still {replay['state'].lower()}.", replay)
            time.sleep(poll_s)

    # -- Admin: node maintenance ----------------------------------------------------------------

    def node(self, cluster: str, name: str) -> dict[str, Any]:
        """The node `name` of `cluster`, with its maintenance (``""``, ``cordoned``, ``draining``,
        ``drained``); `NotFound` if there is none."""
        for node in self.paginate("nodes/", {"pool__cluster__name": cluster}):
            if node["name"] == name:
                return dict(node)
        raise NotFound(f"No node {name} in cluster {cluster}.", status=404, code="not_found")

    def cordon_node(self, cluster: str, name: str, *, reason: str = "") -> dict[str, Any]:
        """Place no new work on the node (platform admins only); what runs there goes on."""
        node = self.node(cluster, name)
        answer: dict[str, Any] = self.request("POST", f"nodes/{node['id']}/cordon/", json={"reason": reason})
        return answer

    def drain_node(self, cluster: str, name: str, *, reason: str = "", grace_s: int | None = None) -> dict[str, Any]:
        """Cordon the node and move its work off (platform admins only): preemptible work is given
        `grace_s` (default: the portal's preemption grace) and requeued, endpoint replicas replaced
        elsewhere before they stop, the rest waited out."""
        node = self.node(cluster, name)
        body: dict[str, Any] = {"reason": reason, **({"grace_s": grace_s} if grace_s is not None else {})}
        answer: dict[str, Any] = self.request("POST", f"nodes/{node['id']}/drain/", json=body)
        return answer

    def uncordon_node(self, cluster: str, name: str) -> dict[str, Any]:
        """Bring the node back into service (platform admins only)."""
        node = self.node(cluster, name)
        answer: dict[str, Any] = self.request("POST", f"nodes/{node['id']}/uncordon/")
        return answer

    def maintenance_windows(self, cluster: str | None = None) -> list[dict[str, Any]]:
        """The maintenance windows (platform admins only), soonest first."""
        params = {"cluster__name": cluster} if cluster else None
        return list(self.paginate("maintenance-windows/", params))

    def announce_maintenance(
        self, cluster: str, *, start_at: str, end_at: str, reason: str, nodes: list[str] | None = None
    ) -> dict[str, Any]:
        """Announce a maintenance window (platform admins only): `nodes` of `cluster` (none: all of
        them) drained from `start_at` to `end_at` (ISO 8601); the users whose work it affects are
        mailed. A refused field raises `ValidationError` naming it."""
        body = {"cluster": cluster, "start_at": start_at, "end_at": end_at, "reason": reason, "nodes": nodes or []}
        answer: dict[str, Any] = self.request("POST", "maintenance-windows/", json=body)
        return answer

    def withdraw_maintenance(self, window_id: int) -> None:
        """Withdraw a maintenance window; one under way ends at once (its nodes come back)."""
        self.request("DELETE", f"maintenance-windows/{int(window_id)}/")

    # -- Admin: the platform as manifests --------------------------------------------------------

    def apply_manifests(
        self, documents: list[dict[str, Any]], *, dry_run: bool = False, prune: bool = False
    ) -> dict[str, Any]:
        """Apply manifest documents in one transaction (platform admins only; docs/manifests.md).
        Each item is ``{"source": file, "index": position from 1, "manifest": document}``. Returns
        the plan: ``documents`` (each ``created``, ``changed``, ``unchanged`` or ``deleted``, with
        its field-level ``changes``), ``summary`` and ``applied``; ``dry_run`` writes nothing;
        ``prune`` also deletes what the documents' kinds have that no document names. If any
        document is refused, nothing is applied and `ValidationError` is raised: its message names
        the file, document and field, and ``fields["documents"]`` lists every refusal."""
        body = {"documents": documents, "dry_run": dry_run, "prune": prune}
        answer: dict[str, Any] = self.request("POST", "admin/manifests/", json=body)
        return answer

    def export_manifests(self) -> list[dict[str, Any]]:
        """Today's platform as manifest documents (platform admins only), in the order they apply."""
        answer: dict[str, Any] = self.request("GET", "admin/manifests/")
        return list(answer["items"])

    # -- HTTP ------------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None) -> Any:
        """Send one API request (`path` relative to ``/api/v1/``); the decoded JSON answer, or None."""
        response = self._send(method, path, params=params, json=json)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise APIError(
                f"{response.url} did not answer with JSON: is {self.url} a GPU Portal?",
                status=response.status_code,
                code="not_json",
            ) from None

    def paginate(self, path: str, params: dict[str, Any] | None = None, limit: int | None = None) -> Iterator[Any]:
        """Every item of a list endpoint, page after page, up to `limit` items."""
        query = dict(params or {})
        query["page_size"] = min(limit, 500) if limit else 500
        page = 1
        count = 0
        while True:
            answer = self.request("GET", path, params={**query, "page": page})
            for item in answer["results"]:
                yield item
                count += 1
                if limit is not None and count >= limit:
                    return
            if not answer.get("next"):
                return
            page += 1

    def download(self, path: str, params: dict[str, Any], handle: Any) -> int:
        """Stream a download into the binary file `handle` (rewritten on a retry); returns its size."""
        for attempt in range(RETRIES):
            try:
                return self._stream_into(path, params, handle)
            except httpx.TransportError as exc:
                if attempt == RETRIES - 1:
                    raise self._unreachable(exc) from None
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _stream_into(self, path: str, params: dict[str, Any], handle: Any) -> int:
        with self._http.stream("GET", path, params=params) as response:
            if response.status_code >= 400:
                response.read()
                self._raise_for(response)
            handle.seek(0)
            handle.truncate()
            written = 0
            for chunk in response.iter_bytes(1 << 20):
                handle.write(chunk)
                written += len(chunk)
            return written

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        method = method.upper()
        for attempt in range(RETRIES):
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                # Only a request that surely never arrived may be sent again if it is not idempotent.
                if attempt == RETRIES - 1 or (method not in IDEMPOTENT and not isinstance(exc, httpx.ConnectError)):
                    raise self._unreachable(exc) from None
            else:
                if response.status_code < 400:
                    return response
                if response.status_code not in RETRY_STATUSES or method not in IDEMPOTENT or attempt == RETRIES - 1:
                    self._raise_for(response)
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _raise_for(self, response: httpx.Response) -> None:
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        error = error_for(response.status_code, body, response.text if body is None else "")
        if isinstance(error, AuthenticationError) and not self.token and "auth/token/" not in str(response.url):
            error.message = f"{error.message} Run `gpuportal login`, or set GPUPORTAL_TOKEN."
            error.args = (error.message,)
        raise error

    def _unreachable(self, exc: httpx.TransportError) -> PortalUnreachable:
        reason = str(exc) or type(exc).__name__
        return PortalUnreachable(f"Cannot reach the portal at {self.url}: {reason}.")
