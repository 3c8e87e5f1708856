"""How much an attacking workload slows another tenant down: the p95 latency of that tenant's API.

An attack test measures a bystander, a user of another workspace listing something of their own
over HTTP against a live portal, while nothing runs (``idle``) and during the attack, and asserts
that the attack's p95 stays within :func:`allowed`. Shared by the resource attacks (CPU, memory,
processes) and any other a test brings (a disk filled, a log flood)::

    bystander = Bystander(live_server.url, "/api/v1/jobs/?workspace=team-b", token)
    idle = bystander.measure()
    ... start the attack ...
    attacked = bystander.measure()
    assert_within_budget(idle, attacked)
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

import requests

#: Requests per measurement: enough for a p95 that one slow answer does not decide alone.
REQUESTS = 40
#: The slack over the idle p95 that no attack needs to exceed (see :func:`allowed`).
FLOOR_S = 0.05


def p95(samples: list[float]) -> float:
    """The 95th percentile (nearest rank) of ``samples``."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def allowed(idle_p95: float) -> float:
    """The most an attack may bring the bystander's p95 to: twice its idle value, and never less
    than 50 ms over it. The floor keeps a 2-core CI machine's own noise (another test process, a
    garbage collection) from failing a test whose idle p95 is a few milliseconds: twice 8 ms is
    well within that noise, while an attack that starves the portal costs it far more."""
    return max(2 * idle_p95, idle_p95 + FLOOR_S)


@dataclass(frozen=True)
class Latencies:
    """One measurement: each request's latency in seconds."""

    samples: list[float]

    @property
    def p95(self) -> float:
        return p95(self.samples)


@dataclass
class Bystander:
    """A tenant uninvolved in the attack: GETs ``path`` on the portal at ``url`` with its API token."""

    url: str
    path: str
    token: str
    session: requests.Session = field(default_factory=requests.Session)

    def measure(self, count: int = REQUESTS) -> Latencies:
        """``count`` requests one after another (after one that warms the connection), each
        answered 200; their latencies."""
        headers = {"Authorization": f"Token {self.token}"}
        self._get(headers)
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            self._get(headers)
            samples.append(time.perf_counter() - started)
        return Latencies(samples)

    def measure_while(self, busy: threading.Event, *, at_least: int = REQUESTS, timeout_s: float = 60) -> Latencies:
        """Requests one after another for as long as ``busy`` is set (and at least ``at_least``), for
        an attack that runs its course meanwhile in another thread."""
        headers = {"Authorization": f"Token {self.token}"}
        self._get(headers)
        samples: list[float] = []
        deadline = time.monotonic() + timeout_s
        while (busy.is_set() or len(samples) < at_least) and time.monotonic() < deadline:
            started = time.perf_counter()
            self._get(headers)
            samples.append(time.perf_counter() - started)
        return Latencies(samples)

    def _get(self, headers: dict[str, str]) -> None:
        response = self.session.get(f"{self.url}{self.path}", headers=headers, timeout=30)
        assert response.status_code == 200, (response.status_code, response.text[:300])


def assert_within_budget(idle: Latencies, attacked: Latencies) -> None:
    """The attack's p95 is within :func:`allowed` of the idle one (the figures are printed: the
    attack tests run with ``-s`` in deploy/test.sh, so CI's log shows them)."""
    limit = allowed(idle.p95)
    print(
        f"\nanother tenant's API p95: {idle.p95 * 1000:.1f} ms idle, {attacked.p95 * 1000:.1f} ms during the attack "
        f"(allowed {limit * 1000:.1f} ms; {len(attacked.samples)} requests)"
    )
    assert attacked.p95 <= limit, (
        f"another tenant's p95 went from {idle.p95 * 1000:.1f} ms idle to {attacked.p95 * 1000:.1f} ms during "
        f"the attack (allowed: {limit * 1000:.1f} ms)"
    )
