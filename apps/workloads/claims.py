"""Starting a workload without holding its row: the claim protocol.

A backend's start can take a while (a server to answer, a batch job to run, pods to schedule), and
no row lock may be held across it: a lock held there would make every action on the workload, and
the scheduling cycle that wants to requeue it, wait on the backend. So a start

1. *claims* the workload in a short transaction: a token in its ``start_claim``, unless another
   live claim holds it;
2. calls the backend with no transaction open, within the portal's own timeout (``start_within``);
3. commits the outcome in a second short transaction, only if its claim still holds and the
   workload still wants to be started; otherwise it stops what it started.

A claim older than its timeout, or made by a process of this host that died, is stale and may be
taken over. A start that takes one over first asks the backend to adopt what the lost start may
have made (``Backend.adopt``), so that a workload's body never runs twice; whatever else a dead or
timed-out start left running is found by its key and stopped by the orphan sweep
(``Backend.sweep_orphans``), which spares the workloads waiting to start.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.db import models, transaction

from workers.backends.base import Backend, BackendError, Endpoint, Spec

logger = logging.getLogger(__name__)

#: How often ``start_within`` calls its ``on_wait`` while a start runs (seconds).
WAIT_TICK_S = 0.5


class Claimable(Protocol):
    pk: Any
    state: Any
    start_claim: dict[str, Any] | None


@dataclass(frozen=True)
class Claim:
    token: str
    took_over: bool  # from a start that was lost (its process died, or it overran its timeout)


class StartTimedOut(Exception):
    """The backend did not start the workload within the portal's timeout."""


def claim(model: type[models.Model], pk: int, states: tuple[str, ...], timeout_s: float) -> Claim | None:
    """Mark the workload as being started by this process, unless it is not in one of `states`
    or a live claim of another start holds it. Returns the claim, or None."""
    with transaction.atomic():
        row: Any = model._default_manager.select_for_update().filter(pk=pk, state__in=states).first()
        if row is None or claim_live(row.start_claim, timeout_s):
            return None
        token = secrets.token_hex(8)
        took_over = bool(row.start_claim) and row.backend_state is None
        row.start_claim = {"token": token, "at": time.time(), "host": socket.gethostname(), "pid": os.getpid()}
        row.save(update_fields=["start_claim"])
        return Claim(token, took_over)


def claim_live(stamp: dict[str, Any] | None, timeout_s: float) -> bool:
    """Whether another start is under way: claimed recently by a process that still lives."""
    if not stamp or time.time() - float(stamp["at"]) >= timeout_s:
        return False
    if stamp.get("host") == socket.gethostname() and stamp.get("pid") != os.getpid():
        try:
            os.kill(int(stamp["pid"]), 0)
        except ProcessLookupError:
            return False  # the process that claimed it died
        except PermissionError:
            pass
    return True


def holds(row: Claimable, token: str) -> bool:
    return bool((row.start_claim or {}).get("token") == token)


def release(model: type[models.Model], pk: int, token: str) -> None:
    """Give the claim up (the start is to be tried again, by a retry or by reconcile)."""
    with transaction.atomic():
        row: Any = model._default_manager.select_for_update().filter(pk=pk).first()
        if row is not None and holds(row, token):
            row.start_claim = None
            row.save(update_fields=["start_claim"])


def start_within(backend: Backend, spec: Spec, timeout_s: float, on_wait: Callable[[], None] | None = None) -> Endpoint:
    """`backend.start(spec)`, raising StartTimedOut if it has not returned after `timeout_s`.

    The start runs in a thread of its own; one that overruns is left to finish, its result
    ignored: the caller stops the workload (``stop_and_clear``) and the orphan sweep stops whatever
    the late start still makes. ``on_wait`` is called in the caller's thread every
    ``WAIT_TICK_S`` while it waits (to write the steps the start reports, apps/workloads/progress.py).
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["endpoint"] = backend.start(spec)
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"start-{spec.key}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(min(WAIT_TICK_S, max(0.0, deadline - time.monotonic())) if on_wait else timeout_s)
        if on_wait is not None:
            on_wait()
    if thread.is_alive():
        raise StartTimedOut(f"it did not start within {timeout_s:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["endpoint"]  # type: ignore[no-any-return]


def stop_and_clear(backend: Backend, what: str, grace_s: float) -> None:
    """After a failed start: stop whatever of it runs, then forget its state (the contract)."""
    try:
        backend.stop(grace_s)
        backend.clear_state()
    except BackendError:
        logger.warning("stopping %s after a failed start left something running; the sweep will", what, exc_info=True)
