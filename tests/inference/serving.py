"""Driving endpoints for real in tests: the portal's loop (autoscaler, scheduler, workload host)
turned by hand, and clients calling the endpoint through the notebook proxy in front of the live
portal, as an OpenAI client would."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from apps.inference import scaling
from apps.inference.models import Endpoint, Replica
from apps.scheduling.adapter import run_cycle
from apps.workloads.host import converge

TO_CONVERGE = (Replica.State.ADMITTED, Replica.State.STOPPING, Replica.State.PREEMPTED, Replica.State.READY)


def turn() -> None:
    """One turn of the portal's loop: scale, admit, start or stop what is due."""
    scaling.upkeep()
    run_cycle()
    for pk in Replica.objects.filter(state__in=TO_CONVERGE).values_list("pk", flat=True):
        converge("replica", pk)
    scaling.upkeep()


def turn_until(check: Callable[[], Any], timeout_s: float = 120.0, step_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        turn()
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(step_s)


def serving(endpoint: Endpoint) -> list[Replica]:
    return list(Replica.objects.filter(endpoint=endpoint, state=Replica.State.READY))


def client(endpoint: Endpoint, token: str, proxy_url: str, timeout_s: float = 120.0) -> httpx.Client:
    """A client of the endpoint's own host through the proxy: the proxy's port, the endpoint's name."""
    port = urlsplit(proxy_url).port
    return httpx.Client(
        base_url=f"http://127.0.0.1:{port}/v1",
        headers={"Authorization": f"Bearer {token}", "Host": f"{endpoint.host}:{port}"},
        timeout=timeout_s,
    )


def chat(http: httpx.Client, endpoint: Endpoint, text: str = "Hello", max_tokens: int = 8, **extra: Any) -> Any:
    return http.post(
        "/chat/completions",
        json={"model": endpoint.name, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens},
        **extra,
    )
