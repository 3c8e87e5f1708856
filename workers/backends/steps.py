"""What a start is doing, step by step, as it happens (JupyterHub's ``Spawner.progress``).

The code that does a step says so where it does it: the backend as it builds the environment,
starts the processes and waits for the server to answer (``Backend.steps``), the environment build
as it waits for another build or makes its own (workers/backends/pyenv.py). A ``StartSteps``
collects them, thread-safely: a start runs in a thread of its own (apps/workloads/claims.py), and
the thread that waits for it writes what it collected onto the workload's row
(apps/workloads/progress.py), so no backend code touches the database.

A step is a plain dict, the form it is stored and served in: ``step`` (a name: ``queued``,
``environment``, ``starting``, ``answering``), ``detail`` (what it does, in words), ``started_at``
and ``ended_at`` (Unix times; ``ended_at`` None while it runs) and ``expected_s`` (how long it
usually takes, where earlier runs say; else None). Beginning a step ends the one before it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

#: The steps a start goes through, in order (a kind skips those it has not).
QUEUED = "queued"
ENVIRONMENT = "environment"
STARTING = "starting"
ANSWERING = "answering"


class StartSteps:
    """The steps of one start, in order; ``begin`` and ``finish`` may be called from any thread."""

    def __init__(self, steps: list[dict[str, Any]] | None = None) -> None:
        self._lock = threading.Lock()
        self._steps: list[dict[str, Any]] = [dict(step) for step in steps or []]
        self._version = 0

    def begin(
        self,
        step: str,
        detail: str,
        *,
        expected_s: float | None = None,
        started_at: float | None = None,
        **extra: Any,
    ) -> None:
        """A step begins now (or at ``started_at``): the one before it, if still open, ends now."""
        now = time.time()
        with self._lock:
            self._close(now)
            entry = {
                "step": step,
                "detail": detail,
                "started_at": round(started_at if started_at is not None else now, 3),
                "ended_at": None,
                "expected_s": None if expected_s is None else round(expected_s, 1),
            }
            self._steps.append({**entry, **extra})
            self._version += 1

    def reopen(self, step: str, detail: str) -> bool:
        """Go on with the last step, if it is ``step`` with ``detail`` (ended or not): the same
        wait, met again, is one step. False (nothing changed) if the last step is another."""
        with self._lock:
            if not self._steps or (self._steps[-1]["step"], self._steps[-1]["detail"]) != (step, detail):
                return False
            self._steps[-1]["ended_at"] = None
            self._version += 1
            return True

    def finish(self, at: float | None = None) -> None:
        """The start is over: the open step, if any, ends now (or at ``at``)."""
        with self._lock:
            if self._close(time.time() if at is None else at):
                self._version += 1

    def _close(self, at: float) -> bool:
        if self._steps and self._steps[-1]["ended_at"] is None:
            self._steps[-1]["ended_at"] = round(max(at, self._steps[-1]["started_at"]), 3)
            return True
        return False

    @property
    def version(self) -> int:
        """Grows with every change: a reader writes the steps out only when it moved."""
        with self._lock:
            return self._version

    def snapshot(self) -> list[dict[str, Any]]:
        """The steps so far, copied."""
        with self._lock:
            return [dict(step) for step in self._steps]


def begin(steps: StartSteps | None, step: str, detail: str, **kwargs: Any) -> None:
    """``steps.begin(...)`` where a caller collects steps; nothing where none does."""
    if steps is not None:
        steps.begin(step, detail, **kwargs)


def describe_duration(seconds: float) -> str:
    """A duration as a person says it: "40 s", "2 min 39 s", "1 h 5 min"."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, rest = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
