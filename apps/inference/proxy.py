"""An endpoint's stable URL: its own host (``ep-<name>-<id>`` under the notebook domain), served by
the portal, which passes each request to one of the endpoint's serving replicas.

Requests reach the portal as a Ray dashboard's do (apps/compute/middleware.py hands them here) and
are checked before anything reaches a server:

- **who**: ``Authorization: Bearer <token>``, a portal token of someone who may use the endpoint's
  workspace (a member, not a viewer), a token made for this endpoint alone (it opens nothing
  else), or a workload's token of the same workspace. No token: 401; one that is not genuine, is
  revoked or expired: 401 with the reason; a token of another workspace, or made for another
  endpoint: 404, as for an endpoint that does not exist; a viewer: 403;
- **what**: the OpenAI API under ``/v1/`` (``completions``, ``chat/completions``, ``models``,
  ...), nothing else of the server (its metrics, its admin paths); a body of at most
  ``PORTAL_INFERENCE_MAX_BODY_BYTES`` (413), sent with a ``Content-Length`` (411), and JSON
  where it says it is (400 otherwise).

Then it waits for a replica with a free slot (``concurrency`` requests at once, from the
endpoint's profile), the least busy first; requests that find none wait here, and what waits is
what the autoscaler scales on (apps/inference/scaling.py): each web process records its counts
(``Traffic``) about once a second. A request waits as long as the client's ``Prefer: wait=<s>``
says, else ``PORTAL_INFERENCE_WAIT_S``; past that it is answered ``503`` with ``Retry-After``. An
endpoint scaled to zero starts a replica for the first request, which waits for it. A replica
that refuses the connection (stopped a moment ago) is skipped and the request goes to another:
nothing was sent to it yet. The answer comes back streamed (server-sent events too).
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import re
import socket
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection as db_connection
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed

from apps.accounts import api_tokens, tokens
from apps.compute import hosts
from apps.inference import scaling
from apps.inference.models import LATENCY_BUCKETS_S, Endpoint, Replica, Traffic, replica_key
from apps.scheduling.trigger import request_cycle
from apps.workloads.forwarding import HOP_BY_HOP, connection_named, connection_to, release_database, streamed
from apps.workspaces.access import USE, VIEW, restrict

logger = logging.getLogger(__name__)

HOST = socket.gethostname()[:40]


def process() -> str:
    """This web process, as its ``Traffic`` rows name it: asked at each record, not at import
    (a server that loads the portal before it forks its workers would give them all one name)."""
    return f"{HOST}:{os.getpid()}"


IO_TIMEOUT_S = 600.0
# How often a web process records its counts, and how often it reads which replicas serve.
FLUSH_EVERY_S = 1.0
HEARTBEAT_S = 5.0
REPLICAS_EVERY_S = 1.0
COLD_REPLICAS_EVERY_S = 0.2
# A replica that refused a connection is passed over for this long.
REFUSED_FOR_S = 5.0
POLL_S = 0.05
# Requests one web process lets wait for an endpoint's replicas at once; more are answered 429 at
# once (a client cannot hold all of a process's threads waiting).
MAX_WAITING = 128
CREDENTIALS = frozenset({"authorization", "cookie", "x-api-key", "api-key"})
NOT_ANSWERED = frozenset({"set-cookie", "access-control-allow-credentials"})
ANSWER_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
NO_SUCH_ENDPOINT = "No such endpoint."


def _answer(status: int, message: str, **headers: str) -> HttpResponse:
    """An OpenAI-style error answer: ``{"error": {"message", "type", "code"}}``."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
            503: "unavailable"}.get(status, "error")  # fmt: skip
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}})
    response = HttpResponse(body.encode(), status=status, content_type="application/json")
    for name, value in {**ANSWER_HEADERS, **headers}.items():
        response[name] = value
    return response


def endpoint_of_label(label: str) -> Endpoint | None:
    """The live endpoint whose host has this DNS label (its id, and its name, must match)."""
    if not label.startswith("ep-"):
        return None
    pk = hosts.pk_of_label(label)
    endpoint = (
        Endpoint.objects.select_related("workspace", "profile")
        .filter(pk=pk)
        .exclude(state=Endpoint.State.DELETED)
        .first()
        if pk
        else None
    )
    return endpoint if endpoint is not None and endpoint.host_label == label else None


# -- who -----------------------------------------------------------------------------------------


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def caller(request: HttpRequest, endpoint: Endpoint) -> Any:
    """The user the request acts for, checked against the endpoint; ``Refused`` otherwise."""
    header = request.headers.get("Authorization", "") or ""
    scheme, _, key = header.strip().partition(" ")
    key = key.strip()
    if not header:
        raise Refused(401, "Send a token: Authorization: Bearer <token> (an endpoint token from the tokens page).")
    if scheme.lower() not in ("bearer", "token") or not key or " " in key:
        raise Refused(401, "Send a token: Authorization: Bearer <token>.")
    try:
        if key.startswith(api_tokens.PREFIX):
            user, token = api_tokens.authenticate_token(key)
            if token.endpoint_id is not None and token.endpoint_id != endpoint.pk:
                raise Refused(404, NO_SUCH_ENDPOINT)
        elif key.startswith(tokens.PREFIX):
            user = tokens.user_for_token(key)
            if user is None:
                raise Refused(401, "Invalid token.")
        else:
            raise Refused(401, "Invalid token.")
    except AuthenticationFailed as refused:
        raise Refused(401, str(refused.detail)) from refused
    # Who may call it may see it too: one query for the usual caller, a second only to tell a viewer
    # (403) from a stranger (404).
    if restrict(Endpoint.objects.filter(pk=endpoint.pk), user, USE).exists():
        return user
    if not restrict(Endpoint.objects.filter(pk=endpoint.pk), user, VIEW).exists():
        raise Refused(404, NO_SUCH_ENDPOINT)
    raise Refused(403, f"Viewers of {endpoint.workspace.name} can see its endpoints, not call them.")


# -- the process's view of its traffic -----------------------------------------------------------


@dataclass
class _Counts:
    in_flight: int = 0
    waiting: int = 0
    # The most in flight and waiting at once since the last record (what the record says).
    peak_in_flight: int = 0
    peak_waiting: int = 0
    waiting_since: list[float] = field(default_factory=list)
    requests: int = 0
    errors: int = 0
    latency: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_S))
    latency_sum: float = 0.0
    tokens: int = 0
    changed: bool = True
    flushed_at: float = 0.0


class _Traffic:
    """This web process's requests per endpoint and per replica; a thread records them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.endpoints: dict[int, _Counts] = {}
        self.replica_busy: dict[int, int] = {}
        self.refused_until: dict[int, float] = {}
        self.replicas: dict[int, tuple[float, list[tuple[int, str, str]]]] = {}
        self.thread: threading.Thread | None = None

    def counts(self, endpoint_id: int) -> _Counts:
        found = self.endpoints.get(endpoint_id)
        if found is None:
            found = self.endpoints[endpoint_id] = _Counts()
        return found

    def start(self) -> None:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="endpoint-traffic", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(FLUSH_EVERY_S / 2)
            try:
                self.flush()
            except Exception:  # the database went away a moment: the next round writes it
                logger.warning("could not record the endpoints' traffic", exc_info=True)
            finally:
                db_connection.close()  # a connection of this thread's own is held only while it writes

    def flush(self, only: int | None = None) -> None:
        """Record what changed (and, every HEARTBEAT_S, what did not: a row that is not kept up is a
        process that went away)."""
        now = time.monotonic()
        rows = []
        with self.lock:
            for endpoint_id, counts in self.endpoints.items():
                if only is not None and endpoint_id != only:
                    continue
                due = counts.changed or now - counts.flushed_at >= HEARTBEAT_S
                if not due:
                    continue
                counts.changed = False
                counts.flushed_at = now
                since = min(counts.waiting_since) if counts.waiting_since else None
                rows.append((endpoint_id, counts.peak_in_flight, counts.peak_waiting, since, counts.requests,
                             counts.errors, list(counts.latency), counts.latency_sum, counts.tokens))  # fmt: skip
                counts.peak_in_flight, counts.peak_waiting = counts.in_flight, counts.waiting
        if not rows:
            return
        stamp = timezone.now()
        for endpoint_id, in_flight, waiting, since, requests, errors, latency, latency_sum, tokens_total in rows:
            waiting_since = None
            if since is not None:
                waiting_since = stamp - timezone.timedelta(seconds=max(0.0, time.monotonic() - since))
            if not Endpoint.objects.filter(pk=endpoint_id).exists():  # deleted: nothing to record
                with self.lock:
                    self.endpoints.pop(endpoint_id, None)
                continue
            Traffic.objects.update_or_create(
                endpoint_id=endpoint_id,
                process=process(),
                defaults={
                    "in_flight": in_flight, "waiting": waiting, "waiting_since": waiting_since,
                    "requests": requests, "errors": errors, "latency_counts": latency,
                    "latency_sum_s": latency_sum, "completion_tokens": tokens_total, "updated_at": stamp,
                },
            )  # fmt: skip

    def serving(self, endpoint: Endpoint, max_age_s: float = REPLICAS_EVERY_S) -> list[tuple[int, str, str]]:
        """The endpoint's serving replicas (id, target, key), read at most once a ``max_age_s``."""
        now = time.monotonic()
        cached = self.replicas.get(endpoint.pk)
        if cached is not None and now - cached[0] < max_age_s:
            return cached[1]
        rows = (
            Replica.objects.filter(endpoint_id=endpoint.pk, state=Replica.State.READY)
            .exclude(proxy_target="")
            .values_list("pk", "proxy_target", "created_at")
        )
        found = [(pk, target, replica_key(pk, created_at)) for pk, target, created_at in rows]
        self.replicas[endpoint.pk] = (now, found)
        return found

    def take(
        self, endpoint: Endpoint, concurrency: int, max_age_s: float = REPLICAS_EVERY_S
    ) -> tuple[int, str, str] | None:
        """A serving replica with a free slot, the least busy first, taken (``release`` gives it back)."""
        now = time.monotonic()
        serving = self.serving(endpoint, max_age_s)
        candidates = [r for r in serving if self.refused_until.get(r[0], 0.0) <= now]
        with self.lock:
            free = [(self.replica_busy.get(pk, 0), pk, target, key) for pk, target, key in candidates]
            free = [entry for entry in free if entry[0] < concurrency]
            if not free:
                return None
            _, pk, target, key = min(free)
            self.replica_busy[pk] = self.replica_busy.get(pk, 0) + 1
            counts = self.counts(endpoint.pk)
            counts.in_flight += 1
            counts.peak_in_flight = max(counts.peak_in_flight, counts.in_flight)
            counts.changed = True
            return pk, target, key

    def release(
        self, endpoint_id: int, replica_id: int, *, latency_s: float | None, error: bool, tokens: int = 0
    ) -> None:
        with self.lock:
            self.replica_busy[replica_id] = max(0, self.replica_busy.get(replica_id, 0) - 1)
            counts = self.counts(endpoint_id)
            counts.in_flight = max(0, counts.in_flight - 1)
            counts.requests += 1
            counts.errors += int(error)
            counts.tokens += tokens
            if latency_s is not None:
                counts.latency[min(bisect_left(LATENCY_BUCKETS_S, latency_s), len(LATENCY_BUCKETS_S) - 1)] += 1
                counts.latency_sum += latency_s
            counts.changed = True

    def forget(self) -> None:
        """Forget every count (a test's end: the next test's endpoints are others)."""
        with self.lock:
            self.endpoints.clear()
            self.replica_busy.clear()
            self.refused_until.clear()
            self.replicas.clear()

    def refused(self, endpoint_id: int, replica_id: int) -> None:
        """A replica refused a connection: passed over for a while, and its endpoint's replicas are
        read again at the next look (it may have stopped since they were read)."""
        with self.lock:
            self.refused_until[replica_id] = time.monotonic() + REFUSED_FOR_S
            self.replicas.pop(endpoint_id, None)

    def answering(self, endpoint: Endpoint, max_age_s: float = REPLICAS_EVERY_S) -> int:
        """How many of the endpoint's serving replicas have not refused a connection lately."""
        now = time.monotonic()
        return sum(1 for pk, _, _ in self.serving(endpoint, max_age_s) if self.refused_until.get(pk, 0.0) <= now)

    def may_wait(self, endpoint_id: int) -> bool:
        with self.lock:
            return self.counts(endpoint_id).waiting < MAX_WAITING

    def wait(self, endpoint_id: int, started: float) -> None:
        with self.lock:
            counts = self.counts(endpoint_id)
            counts.waiting += 1
            counts.peak_waiting = max(counts.peak_waiting, counts.waiting)
            counts.waiting_since.append(started)
            counts.changed = True

    def unwait(self, endpoint_id: int, started: float, *, failed: bool) -> None:
        with self.lock:
            counts = self.counts(endpoint_id)
            counts.waiting = max(0, counts.waiting - 1)
            if started in counts.waiting_since:
                counts.waiting_since.remove(started)
            if failed:
                counts.requests += 1
                counts.errors += 1
            counts.changed = True


TRAFFIC = _Traffic()


# -- serving -------------------------------------------------------------------------------------


def serve(request: HttpRequest, endpoint: Endpoint) -> HttpResponseBase:
    """Answer one request to the endpoint's host."""
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return _answer(400, "Endpoints answer HTTP requests (the OpenAI API), not WebSockets.")
    try:
        caller(request, endpoint)
    except Refused as refused:
        extra = {"WWW-Authenticate": 'Bearer realm="gpuportal"'} if refused.status == 401 else {}
        return _answer(refused.status, refused.message, **extra)
    segments = request.path.split("/")
    if not (request.path == "/v1" or request.path.startswith("/v1/")) or "." in segments or ".." in segments:
        return _answer(404, "Endpoints answer the OpenAI API under /v1/ (POST /v1/chat/completions, ...).")
    if endpoint.state in (Endpoint.State.FAILED, Endpoint.State.DELETING):
        why = f": {endpoint.failure_reason}" if endpoint.failure_reason else ""
        return _answer(503, f"Endpoint {endpoint.name} is {endpoint.get_state_display().lower()}{why}")
    body = _body(request)
    if isinstance(body, HttpResponse):
        return body
    return _forward(request, endpoint, body)


def _body(request: HttpRequest) -> bytes | HttpResponse:
    declared = request.META.get("CONTENT_LENGTH") or ""
    if not declared and request.headers.get("Transfer-Encoding"):
        return _answer(411, "Send the body with a Content-Length.")
    try:
        length = int(declared or 0)
    except ValueError:
        return _answer(400, "Bad Content-Length.")
    limit = int(settings.PORTAL_INFERENCE_MAX_BODY_BYTES)
    if length < 0 or length > limit:
        return _answer(413, f"A request body may be {limit // 1024} KiB at most (this one is {length // 1024} KiB).")
    body = request.read(length) if length else b""
    kind = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if request.method == "POST" and (kind in ("", "application/json") or kind.endswith("+json")):
        try:
            json.loads(body or b"")
        except ValueError as exc:
            return _answer(400, f"The body is not JSON: {exc}.")
    return body


def patience_s(request: HttpRequest) -> float:
    """How long the client lets a request wait for a replica: its ``Prefer: wait=<seconds>``
    (RFC 7240), at most ten minutes, else ``PORTAL_INFERENCE_WAIT_S``."""
    for part in request.headers.get("Prefer", "").split(","):
        name, _, value = part.strip().partition("=")
        if name.strip().lower() == "wait":
            try:
                return max(0.0, min(600.0, float(value.strip())))
            except ValueError:
                break
    return float(settings.PORTAL_INFERENCE_WAIT_S)


def _headers(request: HttpRequest, length: int) -> dict[str, str]:
    named = connection_named([request.headers.get("Connection", "")])
    dropped = HOP_BY_HOP | CREDENTIALS | named | {"host", "content-length", "prefer"}
    headers = {name: value for name, value in request.headers.items() if name.lower() not in dropped}
    if length or request.method not in ("GET", "HEAD", "OPTIONS"):
        headers["Content-Length"] = str(length)
    return headers


def _forward(request: HttpRequest, endpoint: Endpoint, body: bytes) -> HttpResponseBase:
    TRAFFIC.start()
    concurrency = endpoint.profile.concurrency
    started = time.monotonic()
    deadline = started + patience_s(request)
    headers = _headers(request, len(body))
    waiting = False
    woke = False
    try:
        while True:
            # While no replica serves (a cold start), look for the first one more often.
            taken = TRAFFIC.take(endpoint, concurrency, COLD_REPLICAS_EVERY_S if woke else REPLICAS_EVERY_S)
            if taken is not None:
                if waiting:
                    TRAFFIC.unwait(endpoint.pk, started, failed=False)
                    waiting = False
                answer = _send(request, endpoint, taken, body, headers, started)
                if answer is not None:
                    return answer
                continue  # refused: another replica, or wait
            if not waiting:
                if not TRAFFIC.may_wait(endpoint.pk):
                    return _answer(
                        429, f"Endpoint {endpoint.name} has {MAX_WAITING} requests waiting already. Try again.",
                        **{"Retry-After": "5"},
                    )  # fmt: skip
                TRAFFIC.wait(endpoint.pk, started)
                TRAFFIC.flush(only=endpoint.pk)  # the autoscaler sees it at once
                waiting = True
            if not woke and not TRAFFIC.answering(endpoint):
                # A cold start: its replica is asked for now, not at the scheduler loop's next period.
                try:
                    scaling.converge_one(endpoint.pk)
                except Exception:  # the loop asks for it at its next period anyway
                    logger.warning("could not scale endpoint %s up for a waiting request", endpoint.pk, exc_info=True)
                request_cycle()
                woke = True
            if time.monotonic() >= deadline:
                TRAFFIC.unwait(endpoint.pk, started, failed=True)
                waiting = False
                return _busy(endpoint, time.monotonic() - started)
            release_database()
            time.sleep(POLL_S)
    finally:
        if waiting:
            TRAFFIC.unwait(endpoint.pk, started, failed=True)


def _busy(endpoint: Endpoint, waited: float) -> HttpResponse:
    # The replicas as this request last read them, whatever their age: what kept it waiting. (Read
    # again, they may count one that began to serve since, as a cold start that ran its cycle
    # inline, and call it busy.)
    serving = TRAFFIC.answering(endpoint, max_age_s=math.inf)
    if serving:
        why = f"all {serving} of its replicas are busy; more are being started, up to {endpoint.max_replicas}"
    else:
        why = "no replica serves yet; one is being started"
    return _answer(
        503, f"Endpoint {endpoint.name} could not take the request within {waited:.0f} s: {why}. Try again.",
        **{"Retry-After": "10"},
    )  # fmt: skip


def _send(
    request: HttpRequest,
    endpoint: Endpoint,
    taken: tuple[int, str, str],
    body: bytes,
    headers: dict[str, str],
    started: float,
) -> HttpResponseBase | None:
    """Send the request to the replica taken, with the replica's own key; None if it refused the
    connection (nothing was sent)."""
    replica_id, target, key = taken
    headers = {**headers, "Authorization": f"Bearer {key}"}
    done = False

    def finish(error: bool, latency: float | None = None, tokens: int = 0) -> None:
        nonlocal done
        if not done:
            done = True
            TRAFFIC.release(endpoint.pk, replica_id, latency_s=latency, error=error, tokens=tokens)

    try:
        connection, prefix = connection_to(target)
        connection.connect()
    except OSError:
        finish(error=False)
        TRAFFIC.refused(endpoint.pk, replica_id)
        with TRAFFIC.lock:
            counts = TRAFFIC.counts(endpoint.pk)
            counts.requests -= 1  # not a request served: it goes elsewhere
        return None
    try:
        assert connection.sock is not None
        connection.sock.settimeout(IO_TIMEOUT_S)
        connection.request(
            request.method or "GET", prefix + request.get_full_path(), body=body or None, headers=headers
        )
        upstream = connection.getresponse()
    except TimeoutError:
        connection.close()
        finish(error=True)
        return _answer(504, f"Endpoint {endpoint.name}'s replica did not answer within {IO_TIMEOUT_S:.0f} s.")
    except (OSError, http.client.HTTPException):
        connection.close()
        finish(error=True)
        return _answer(502, f"Endpoint {endpoint.name}'s replica stopped while answering. Try again.")
    error = upstream.status >= 500
    tail = _Tail()
    return streamed(
        request, upstream, connection, not_answered=NOT_ANSWERED, tap=tail.add,
        on_close=lambda: finish(error=error, latency=time.monotonic() - started, tokens=tail.tokens()),
    )  # fmt: skip


class _Tail:
    """The end of an answer's body, where the OpenAI API reports what was generated (``usage``:
    the last object of an answer, or of a stream's last event where the client asked for it)."""

    KEEP = 4096
    TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d{1,9})')

    def __init__(self) -> None:
        self.data = b""

    def add(self, chunk: bytes) -> None:
        self.data = (self.data + chunk)[-self.KEEP :]

    def tokens(self) -> int:
        found = self.TOKENS.findall(self.data)
        return int(found[-1]) if found else 0
