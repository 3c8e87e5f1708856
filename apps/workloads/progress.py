"""A start's steps on its workload's row (``Workload.start_progress``), as they happen.

The code that does a step reports it to the start's ``StartSteps`` (workers/backends/steps.py): the
host as it takes the start from the queue, the backend as it builds the environment, starts the
processes and waits for an answer, a notebook's environment build. The host's thread that waits
for the start writes what was collected here, whenever it moved, onto the row whose start it
claimed (a conditional update: a start that lost its claim writes nothing), and pushes it to the
workload's pages over the live channel.

A start that hands its work on (a notebook's environment build, a retry after a transient error)
leaves its last step open; the next start of the same workload takes the steps over from there.
A start that ended (its workload runs, or it failed) has every step closed; the next start begins
a new list.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.db import DatabaseError

from apps.workloads.models import Workload
from apps.workspaces.live import notify
from workers.backends.steps import QUEUED, StartSteps

logger = logging.getLogger(__name__)
T = TypeVar("T")

WAITING = "waiting for a worker to take the start"
#: How often the thread that waits for a start writes its new steps (seconds).
WRITE_EVERY_S = 0.5


def waiting_since(row: Workload) -> datetime:
    """Since when the workload has waited for its start: its admission, else its creation."""
    return row.admitted_at or row.created_at


def _stale(steps: list[dict[str, Any]], row: Workload) -> bool:
    """Whether ``steps`` are those of an earlier start that ended (every step closed, begun before
    the workload last waited to start): a job admitted again after a preemption, say."""
    closed = all(step.get("ended_at") is not None for step in steps)
    return closed and float(steps[0].get("started_at") or 0) < waiting_since(row).timestamp() - 1


def steps_of(
    row: Workload, start_states: tuple[str, ...], waiting: Callable[[], str] = lambda: WAITING
) -> list[dict[str, Any]]:
    """What the workload's page, the API and the CLI show of its start: the recorded steps, or,
    while it waits for its start to be taken up and none are recorded for this start, that wait,
    open (``waiting()``: what it waits for, a worker or its instance; asked only then).
    ``start_states``: its kind's start states."""
    steps = list(row.start_progress or [])
    if row.state in start_states and (not steps or _stale(steps, row)):
        return [_queued(waiting_since(row).timestamp(), waiting())]
    return steps


def _queued(since: float, detail: str = WAITING) -> dict[str, Any]:
    return {"step": QUEUED, "detail": detail, "started_at": round(since, 3), "ended_at": None, "expected_s": None}


def waiting() -> list[dict[str, Any]]:
    """The steps of a start asked for now and not yet taken up (a stopped notebook started again):
    its wait for a worker, open, which the start that takes it up carries on from."""
    return [_queued(time.time())]


def begin_start(row: Workload, *, restart: bool = False, waits: list[tuple[float, str]] | None = None) -> StartSteps:
    """The steps of a start that just claimed ``row``: those of a start handed on to this one,
    else what it waited for (``waits``: since when, and what, in order; by default a worker, since
    the workload's admission; now, for a restart in place). The last wait ends now."""
    stored = list(row.start_progress or [])
    if stored and stored[-1].get("ended_at") is None:
        steps = StartSteps(stored)  # handed on: carry on from its open step
    elif restart:
        steps = StartSteps([_queued(time.time(), "its processes ended: starting it again in place")])
    else:
        waits = waits or [(waiting_since(row).timestamp(), WAITING)]
        ends: list[float | None] = [since for since, _ in waits[1:]] + [None]
        steps = StartSteps(
            [
                {**_queued(since, detail), "ended_at": None if end is None else round(end, 3)}
                for (since, detail), end in zip(waits, ends, strict=True)
            ]
        )
    steps.finish()
    return steps


def hand_on(steps: StartSteps, detail: str) -> None:
    """The start stops here and another takes it over (a task, a retry): what it waits for, open.
    The same wait handed on again (a start asked for twice) goes on as one step."""
    if not steps.reopen(QUEUED, detail):
        steps.begin(QUEUED, detail)


def write(row: Workload, kind: str, token: str, steps: StartSteps) -> bool:
    """Write ``steps`` onto the workload, if the start that holds claim ``token`` still holds it,
    and tell its pages. No transaction needed: one conditional update. True if written."""
    snapshot = steps.snapshot()
    written = type(row).objects.filter(pk=row.pk, start_claim__token=token).update(start_progress=snapshot)
    if written:
        announce(row, kind)
    return bool(written)


def announce(row: Workload, kind: str) -> None:
    """Tell the workload's pages that its start moved (they render it again from the row)."""
    instance_id = getattr(row, "instance_id", None)
    notify(row.workspace_id, kind, {"id": row.pk, "state": row.state, "start_progress": True}, instance_id=instance_id)


def while_writing(work: Callable[[], T], writer: Writer) -> T:
    """Run ``work`` in a thread of its own and return what it returns (or raise what it raised),
    calling ``writer`` every ``WRITE_EVERY_S`` meanwhile and once at the end: the steps ``work``
    reports reach the row as they happen."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="start-steps", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(WRITE_EVERY_S)
        writer()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


class Writer:
    """Writes a start's steps whenever they moved: called every ``WRITE_EVERY_S`` by the thread
    that waits for the start (``claims.start_within``) and once more at its end."""

    def __init__(self, row: Workload, kind: str, token: str, steps: StartSteps) -> None:
        self.row, self.kind, self.token, self.steps = row, kind, token, steps
        self._written = -1

    def __call__(self) -> None:
        version = self.steps.version
        if version == self._written:
            return
        self._written = version
        try:
            write(self.row, self.kind, self.token, self.steps)
        except DatabaseError:  # what a start shows is best effort: the start goes on
            logger.warning("could not write the start steps of %s %s", self.kind, self.row.pk, exc_info=True)
