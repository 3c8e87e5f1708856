"""A Kubernetes API emulator for the Kubernetes backend's tests: kmock's ``KubernetesEmulator`` over real HTTP.

The official client is synchronous, so the emulator's aiohttp server runs on an event loop of its own in a
thread and the tests stay plain functions. kmock 0.8 reads ``/api/v1/namespaces`` and
``/api/v1/namespaces/<name>`` as a namespace scope without a resource (the first one raises), so
``namespaces_as_a_resource`` reads those two paths as the ``namespaces`` resource and hands every other path
to kmock's own parser. The rest is kmock's behaviour: create, read, merge-patch, delete, 409 on a second
create, 404 for what is not there; no label selectors, controllers, admission or quota. ``Emulator`` talks
to it over HTTP as the cluster's controllers would (writing ``status``, creating pods).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kmock
import requests
from kmock._internal import parsing

_kmock_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
        return parsing.ParsedPath(group="", version="v1", plural="namespaces", name=parts[3] if parts[3:] else None)
    return _kmock_parse_path(path)


@contextlib.contextmanager
def namespaces_as_a_resource() -> Iterator[None]:
    parsing.parse_path = _parse_path
    try:
        yield
    finally:
        parsing.parse_path = _kmock_parse_path


class Emulator:
    """The running emulator: its base ``url``, the kmock handler, and HTTP helpers that act as a controller."""

    def __init__(self, handler: kmock.KubernetesEmulator, url: str) -> None:
        self.handler = handler
        self.url = url.rstrip("/")
        self.http = requests.Session()

    def get(self, path: str) -> dict[str, Any] | None:
        response = self.http.get(self.url + path, timeout=5)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        found: dict[str, Any] = response.json()
        return found

    def post(self, collection: str, obj: dict[str, Any]) -> None:
        self.http.post(self.url + collection, json=obj, timeout=5).raise_for_status()

    def patch(self, path: str, body: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/merge-patch+json"}
        self.http.patch(self.url + path, data=json.dumps(body), headers=headers, timeout=5).raise_for_status()

    def set_status(self, path: str, status: dict[str, Any]) -> None:
        """Write an object's status through its ``/status`` subresource, as its controller does."""
        self.patch(f"{path}/status", {"status": status})

    def delete(self, path: str) -> None:
        self.http.delete(self.url + path, timeout=5).raise_for_status()

    def respond(self, request: str, *payload: Any) -> None:
        """Answer requests like ``"post /api/v1/namespaces/x/services"`` with ``payload`` (a status, a body)."""
        reaction = self.handler[request]
        for item in payload:
            reaction = reaction << item

    def bodies(self, method: str, path: str) -> list[Any]:
        """The decoded bodies of the requests of ``method`` that reached ``path``, in order."""
        return [r.data for r in list(self.handler) if r.method.value == method.upper() and r.url.path == path]

    def requests_to(self, method: str, path: str) -> int:
        """How many requests of ``method`` reached ``path``."""
        return len(self.bodies(method, path))

    def when(self, path: str, ready: Callable[[dict[str, Any]], bool], then: Callable[[], None]) -> threading.Thread:
        """In a thread: once the object at ``path`` exists and ``ready(obj)``, call ``then`` (a controller's step)."""

        def watch() -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                obj = self.get(path)
                if obj is not None and ready(obj):
                    then()
                    return
                time.sleep(0.01)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        return thread


@contextlib.contextmanager
def running_emulator(emulator_class: type[kmock.KubernetesEmulator] = kmock.KubernetesEmulator) -> Iterator[Emulator]:
    """Start a fresh emulator on 127.0.0.1 (a free port) and stop it afterwards; ``emulator_class``: kmock's, or a
    test's subclass that emulates more of the API server."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    handler = emulator_class()
    # Listing a resource kmock has no object of yet is a 404 there, an empty list on an API server.
    for resource in ("v1/pods", "v1/nodes"):
        handler.resources[resource] = {}
    server = kmock.Server(handler)

    async def enter() -> None:
        await handler.__aenter__()
        await server.__aenter__()

    async def leave() -> None:
        await server.__aexit__(None, None, None)
        await handler.__aexit__(None, None, None)

    with namespaces_as_a_resource():
        asyncio.run_coroutine_threadsafe(enter(), loop).result(timeout=10)
        emulator = Emulator(handler, str(server.url))
        try:
            yield emulator
        finally:
            emulator.http.close()
            asyncio.run_coroutine_threadsafe(leave(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()
