"""Per-object backoff for the reconcile loop: one workload whose backend keeps failing is retried
less and less often (2 s, 4 s, ... up to 5 minutes), so it cannot wedge or flood the loop, while
every other workload is still converged each cycle. Kept in the loop's memory: a restart retries
everything at once, which is what a restart is for."""

from __future__ import annotations

import time

BASE_S = 2.0
MAX_S = 300.0


class Backoff:
    def __init__(self, base_s: float = BASE_S, max_s: float = MAX_S) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self._failures: dict[tuple[str, int], tuple[int, float]] = {}

    def due(self, kind: str, pk: int, now: float | None = None) -> bool:
        """Whether the object may be tried now."""
        entry = self._failures.get((kind, pk))
        return entry is None or (now if now is not None else time.monotonic()) >= entry[1]

    def failed(self, kind: str, pk: int, now: float | None = None) -> float:
        """Record a failure; returns the delay before the next try."""
        count = self._failures.get((kind, pk), (0, 0.0))[0] + 1
        delay = min(self.base_s * 2 ** (count - 1), self.max_s)
        self._failures[kind, pk] = (count, (now if now is not None else time.monotonic()) + delay)
        return delay

    def succeeded(self, kind: str, pk: int) -> None:
        self._failures.pop((kind, pk), None)

    def reset(self) -> None:
        self._failures.clear()


#: The reconcile loop's, shared by jobs, instances and notebooks.
RECONCILE = Backoff()
