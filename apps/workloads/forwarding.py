"""Forwarding a request through the portal to a workload's server, and streaming its answer back:
shared by the proxies of Ray dashboards (apps/rayclusters/proxy.py) and inference endpoints
(apps/inference/proxy.py). A target is ``http+unix://<percent-encoded socket path>`` (the local
backend's servers) or ``http://host:port``."""

from __future__ import annotations

import http.client
import socket
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import connection as database
from django.http import HttpRequest, StreamingHttpResponse

CONNECT_TIMEOUT_S = 10.0
CHUNK_BYTES = 64 * 1024
UNIX_SCHEME = "http+unix"
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
     "trailer", "trailers", "transfer-encoding", "upgrade"}
)  # fmt: skip


class UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (the local backend's servers); the Host header says ``localhost``."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=CONNECT_TIMEOUT_S, blocksize=CHUNK_BYTES)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def connection_to(target: str) -> tuple[http.client.HTTPConnection, str]:
    """A connection to the server at ``target``, and the path prefix of that target."""
    parts = urllib.parse.urlsplit(target)
    if parts.scheme == UNIX_SCHEME and parts.netloc:
        return UnixConnection(urllib.parse.unquote(parts.netloc)), parts.path.rstrip("/")
    if parts.scheme == "http" and parts.hostname:
        connection = http.client.HTTPConnection(
            parts.hostname, parts.port, timeout=CONNECT_TIMEOUT_S, blocksize=CHUNK_BYTES
        )
        return connection, parts.path.rstrip("/")
    raise OSError(f"not an http or {UNIX_SCHEME} target: {target!r}")


def connection_named(headers: Any) -> set[str]:
    """The headers a ``Connection`` header names: hop-by-hop too (RFC 9110, 7.6.1)."""
    return {name.strip().lower() for value in headers for name in value.split(",") if name.strip()}


def release_database() -> None:
    """A proxied request may last minutes (a package upload, a slow answer of Ray's) and needs the
    database no more: its connection goes back now, not at the request's end (a process's pool
    holds few, and the portal's other requests wait for them)."""
    if not database.in_atomic_block:
        database.close()


def streamed(
    request: HttpRequest,
    upstream: http.client.HTTPResponse,
    connection: http.client.HTTPConnection,
    *,
    not_answered: frozenset[str] = frozenset(),
    on_close: Callable[[], None] | None = None,
    tap: Callable[[bytes], None] | None = None,
) -> StreamingHttpResponse:
    """The upstream's answer as the client's: streamed, without its hop-by-hop headers and those
    named in ``not_answered``; ``on_close`` is called once the answer was sent or given up, ``tap``
    with each piece of the body as it passes."""
    # Under ASGI an answer is streamed only from an asynchronous iterator (Django reads a
    # synchronous one whole first); under WSGI only from a synchronous one.
    body = (AsyncBody if isinstance(request, ASGIRequest) else Body)(upstream, connection, on_close, tap)
    response = StreamingHttpResponse(body, status=upstream.status, reason=upstream.reason or None)
    del response["Content-Type"]
    named = connection_named(upstream.headers.get_all("Connection") or [])
    kept: dict[str, list[str]] = {}
    for name, value in upstream.getheaders():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in named or lower in not_answered:
            continue
        kept.setdefault(name, []).append(value)
    for name, values in kept.items():
        response[name] = ", ".join(values)
    return response


class Upstream:
    """The upstream's answer's body, read as it comes, and the connection it comes on: closed by Django
    once the answer is sent or given up (its ``close()``)."""

    def __init__(
        self,
        upstream: http.client.HTTPResponse,
        connection: http.client.HTTPConnection,
        on_close: Callable[[], None] | None = None,
        tap: Callable[[bytes], None] | None = None,
    ) -> None:
        self.upstream = upstream
        self.connection = connection
        self.on_close = on_close
        self.tap = tap

    def close(self) -> None:
        self.upstream.close()
        self.connection.close()
        if self.on_close is not None:
            on_close, self.on_close = self.on_close, None
            on_close()


class Body(Upstream):
    def __iter__(self) -> Iterator[bytes]:
        try:
            while chunk := self.upstream.read1(CHUNK_BYTES):
                if self.tap is not None:
                    self.tap(chunk)
                yield chunk
        except (OSError, http.client.HTTPException):
            return  # the server went away mid-answer: the client sees it cut short


class AsyncBody(Upstream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = sync_to_async(self.upstream.read1, thread_sensitive=False)
        try:
            while chunk := await read(CHUNK_BYTES):
                if self.tap is not None:
                    self.tap(chunk)
                yield chunk
        except (OSError, http.client.HTTPException):
            return
