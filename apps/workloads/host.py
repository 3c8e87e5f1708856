"""The workload host: converges every kind of workload with its cluster's backend.

Jobs, instances and notebooks are kinds of workload (``Kind``; apps/jobs/hosting.py and
apps/compute/hosting.py), registered when their app is ready. The host owns what every kind
shares, written once:

- **converge**: what a workload's state asks of its backend, by phase: *start* it, *watch* it
  (record an exit, restart it in place where its kind does), or *stop* it;
- **starts** under a claim, never a row lock (apps/workloads/claims.py), within the kind's
  timeout, adopting what a lost start made (``Backend.adopt``); a failed start is stopped, then
  cleared; a transient failure is raised for the task to retry;
- **one reconcile loop** over every kind, with per-object backoff, which sends starts to the
  worker and converges the rest here;
- **one orphan sweep** through the backend contract (``Backend.sweep_orphans``);
- **the backend of a row**, built in one place (``backend_of``), also for reading logs.

A kind says only what is its own: its states, its spec, and the actions that record what
happened (apps/jobs/actions.py, apps/compute/actions.py): the host calls them inside its short
transaction, on the row it locked, and they write the state, the audit event and the live update.

**No backend call under a row lock.** Every call of a backend (start, poll, progress, stop, state,
logs, artifacts) and every read of what a workload left is made with no transaction open; the
locked section re-reads the row, checks that it is still as it was when the backend was asked, and
writes only what was read. The record hooks are handed what was read, never the backend.

**One pass, one query per cluster.** A reconcile pass loads the workloads it watches in bulk, asks
each cluster's backend about all of them at once where it can (``Backend.polling``: one ``squeue``
and one ``sacct`` per Slurm cluster), and takes a row's lock only where something is to be written
(an exit, progress that moved): a running workload that did not change costs no transaction.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, ClassVar

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from apps.scheduling.backoff import RECONCILE
from apps.scheduling.trigger import request_workload
from apps.workloads import claims, progress
from workers.backends.base import Backend, BackendError, Endpoint, Keep, PolicyRefusal, Progress, Spec, Status
from workers.backends.registry import backend_for

logger = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
SWEEP_EVERY_S = 30.0
LOAD_CHUNK = 1000


class Phase(StrEnum):
    START = "start"
    WATCH = "watch"
    STOP = "stop"


class Kind:
    """One kind of workload as the host sees it. Subclasses set the class attributes and the
    methods without a default; the hooks with one are for kinds that need them."""

    name: ClassVar[str]  # "job": also the prefix of its backend key and its tasks' argument
    model: ClassVar[type[Any]]
    cluster_field: ClassVar[str] = "cluster"  # the lookup from a row to its Cluster
    start_states: ClassVar[tuple[str, ...]]  # what a start may claim
    live_states: ClassVar[tuple[str, ...]]  # whose recorded backend state the orphan sweep keeps
    restarts_in_place: ClassVar[bool] = False  # dead processes are started again, up to a limit
    keeps_state_after_stop: ClassVar[bool] = False  # its logs stay readable once it stopped
    start_errors: ClassVar[tuple[type[Exception], ...]] = ()  # what `connect` may raise

    # -- reading
    def rows(self) -> models.QuerySet[Any]:
        """Its rows with what the host and the kind's hooks read of them joined in (one query)."""
        return self.model.objects.select_related("workspace", self.cluster_field)

    def load(self, pk: int) -> Any | None:
        return self.rows().filter(pk=pk).first()

    def load_many(self, pks: list[int]) -> dict[int, Any]:
        """Rows by id as a reconcile pass reads thousands of them to ask their backends: with their
        cluster (one object per cluster, not one per row) and nothing else joined; what records a
        change loads its row again, locked. In queries of ``LOAD_CHUNK`` ids."""
        rows = self.model.objects.prefetch_related(self.cluster_field)
        found: dict[int, Any] = {}
        for at in range(0, len(pks), LOAD_CHUNK):
            found.update(rows.in_bulk(pks[at : at + LOAD_CHUNK]))
        return found

    def cluster(self, row: Any) -> Any:
        owner = row
        for part in self.cluster_field.split("__"):
            owner = getattr(owner, part)
        return owner

    def phase(self, row: Any) -> Phase | None:
        raise NotImplementedError

    def due(self, lost_before: datetime) -> Iterable[int]:
        """The ids reconcile converges: those that run, stop, or wait for a start since before
        `lost_before` (a start asked for earlier is under way, or was lost)."""
        raise NotImplementedError

    def spec(self, row: Any) -> Spec:
        raise NotImplementedError

    def key(self, pk: int) -> str:
        return f"{self.name}-{pk}"

    def start_timeout_s(self) -> float:
        raise NotImplementedError

    def claim_timeout_s(self) -> float:
        """How long a start may hold its claim before another may take it over."""
        return self.start_timeout_s()

    def grace_s(self, row: Any) -> float:
        return STOP_GRACE_S

    def start_wait(self, row: Any) -> str:
        """What it waits for before its start is taken up, in words (shown while nothing else is)."""
        return progress.WAITING

    def start_waits(self, row: Any) -> list[tuple[float, str]]:
        """What its start waited for before it was taken up, in order: (since when, what). Default:
        a worker, since its admission."""
        return [(progress.waiting_since(row).timestamp(), progress.WAITING)]

    # -- hooks around a start
    def prepare_start(self, row: Any, backend: Backend) -> bool:
        """Before the backend starts it (the claim held): False to give the claim back and not
        start now (a notebook's environment is built first, by a task of its own)."""
        return True

    def connect(self, row: Any, endpoint: Endpoint) -> None:
        """After the backend started it: make it reachable (a notebook's proxy route)."""

    def disconnect(self, row: Any) -> None:
        """Undo `connect` (a start that is not recorded, a stop)."""

    # -- the actions that record what happened (on the locked row, inside the host's transaction)
    def record_start(self, row: Any, endpoint: Endpoint, *, restarted: bool) -> None:
        raise NotImplementedError

    def record_start_failure(self, row: Any, reason: str, *, timed_out: bool) -> None:
        raise NotImplementedError

    def record_progress(self, row: Any, progress: Progress | None) -> None:
        """It still runs (jobs record how far they are)."""

    def changes(self, row: Any, progress: Progress | None, observed: Any) -> bool:
        """Whether recording what was read of it while it runs (``record_progress``,
        ``record_observed``) would change its row, as loaded: False lets the host take no lock and
        open no transaction for it. Default: True, always recorded."""
        return True

    def observe(self, row: Any, backend: Backend) -> Any:
        """While it runs, what the kind reads of it from its backend beyond ``poll()`` (a Ray
        cluster's nodes), with no row locked; handed to ``record_observed``. Default: nothing."""
        return None

    def record_observed(self, row: Any, observed: Any) -> None:
        """Record what ``observe`` read (on the locked row, while it runs)."""

    def record_exit(self, row: Any, status: Status, progress: Progress | None) -> None:
        """It ended by itself, for good (a kind that does not restart in place): ``status`` and
        ``progress`` as its backend said them, read before the row was locked."""
        raise NotImplementedError

    def mark_restarting(self, row: Any) -> None:
        """Its processes died and it is about to be started again in place."""

    def before_stop(self, row: Any) -> None:
        """Before its backend stops it (an instance stops its notebooks first)."""

    def record_stop(self, row: Any, ran: bool) -> None:
        """It was stopped: ``ran`` if its backend held it and was asked to stop it (else its start
        was never recorded, or its backend had stopped it already)."""
        raise NotImplementedError

    def ended(self, row: Any) -> None:
        """After its exit or stop was recorded and committed, in the process that recorded it, with
        no transaction of the host's open: what may take long and reads what the workload left (a
        job's artifacts) is done here or handed to a task, never under the row's lock."""

    def record_host_stop(self, row: Any) -> None:
        """The embedded portal stopped its processes on this machine on its way down."""
        raise NotImplementedError


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> None:
    """Called by each kind's app when it is ready (AppConfig.ready)."""
    KINDS[kind.name] = kind


def kind_of(name: str) -> Kind:
    return KINDS[name]


def backend_of(kind: Kind, row: Any) -> Backend:
    """The backend that holds the workload: its cluster's, with what it recorded of it."""
    return backend_for(kind.cluster(row), row.backend_state or {})


def logs(kind_name: str, row: Any, replica: int = 0, offset: int = 0) -> tuple[bytes, int]:
    """A workload's log from `offset` on, while it runs and after it ended."""
    if row.backend_state is None:
        return b"", offset
    return backend_of(KINDS[kind_name], row).logs(replica, offset)


def _locked(kind: Kind, pk: int) -> Any:
    return kind.model.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=pk)


# -- converge ---------------------------------------------------------------------------------------


def converge(kind_name: str, pk: int) -> Any | None:
    """Do what the workload's state asks of its backend. Safe to call twice, or concurrently."""
    kind = KINDS[kind_name]
    row = kind.load(pk)
    if row is None:
        return None
    phase = kind.phase(row)
    if phase is Phase.START:
        return start(kind, pk)
    if phase is Phase.WATCH:
        return _watch(kind, pk, row)
    if phase is Phase.STOP:
        return stop(kind, pk)
    return row


def start(kind: Kind, pk: int, *, states: tuple[str, ...] | None = None) -> Any | None:
    """Start the workload on its backend under a claim (apps/workloads/claims.py).

    A refusal or a permanent error is stopped, cleared and recorded as the kind's start failure,
    as is a start that overran the kind's timeout (``timed_out``: a job goes back in line, an
    instance fails); a transient error is stopped, cleared and raised for the task to retry. A
    start whose workload was cancelled, deleted or taken over meanwhile is stopped and cleared
    once the lock that found it so is released.
    """
    states = states or kind.start_states
    held = claims.claim(kind.model, pk, states, kind.claim_timeout_s())
    if held is None:
        return kind.model.objects.filter(pk=pk).first()  # not to start, or being started
    row = kind.load(pk)
    backend = backend_for(kind.cluster(row))
    # What this start does, step by step, written onto the row as it happens (progress.py).
    steps = backend.steps = progress.begin_start(row, restart=states != kind.start_states, waits=kind.start_waits(row))
    write_steps = progress.Writer(row, kind.name, held.token, steps)
    if not kind.prepare_start(row, backend):
        write_steps()  # it handed its start on, saying to what
        claims.release(kind.model, pk, held.token)
        return row
    spec = kind.spec(row)
    try:
        endpoint = (held.took_over and backend.adopt(spec)) or claims.start_within(
            backend, spec, kind.start_timeout_s(), on_wait=write_steps
        )
        kind.connect(row, endpoint)
    except (PolicyRefusal, BackendError, claims.StartTimedOut, *kind.start_errors) as exc:
        claims.stop_and_clear(backend, kind.key(pk), STOP_GRACE_S)
        timed_out = isinstance(exc, claims.StartTimedOut)
        if not timed_out and not isinstance(exc, PolicyRefusal) and not getattr(exc, "permanent", False):
            progress.hand_on(steps, f"waiting to try again: {exc}")
            write_steps()
            claims.release(kind.model, pk, held.token)
            raise
        reason = str(exc) if isinstance(exc, PolicyRefusal | claims.StartTimedOut) else f"could not start: {exc}"
        steps.finish()
        with transaction.atomic():
            row = _locked(kind, pk)
            if claims.holds(row, held.token) and row.state in states:
                row.start_claim = None
                row.start_progress = steps.snapshot()
                kind.record_start_failure(row, reason, timed_out=timed_out)
        return row
    started = backend.get_state()
    steps.finish()
    with transaction.atomic():
        row = _locked(kind, pk)
        abandoned = not claims.holds(row, held.token) or row.state not in states
        if abandoned:
            # Cancelled, deleted or taken over while it started. Another start of it may have
            # connected it and recorded that; its route (not a backend's) is removed only if not.
            if kind.phase(row) is not Phase.WATCH:
                kind.disconnect(row)
        else:
            row.start_claim = None
            row.backend_state = started
            row.backend_stopped = False
            row.start_progress = steps.snapshot()
            kind.record_start(row, endpoint, restarted=states != kind.start_states)  # again in place
    if abandoned:  # what this start made is stopped, the row's lock released
        claims.stop_and_clear(backend, kind.key(pk), STOP_GRACE_S)
    return row


@dataclass(frozen=True)
class Seen:
    """What the host read of a workload that runs, with no row locked: the backend state it was
    read with (the row is written only if it still holds that one), the backend's answer, and,
    once it ended, the backend's state to record."""

    state: dict[str, Any] | None
    status: Status | None  # None: nothing recorded to ask about
    progress: Progress | None = None
    observed: Any = None
    after: dict[str, Any] | None = None


def _look(kind: Kind, row: Any) -> Seen:
    """Ask the workload's backend how it does: ``poll()``, its progress, what its kind observes
    and, once it ended, its state. No transaction may be open (checked by the tests)."""
    state = row.backend_state
    if state is None:
        return Seen(None, None)
    backend = backend_of(kind, row)
    status = backend.poll()
    progress = backend.progress() if status.running or not kind.restarts_in_place else None
    observed = kind.observe(row, backend) if status.running else None
    return Seen(state, status, progress, observed, None if status.running else backend.get_state())


def _watch(kind: Kind, pk: int, row: Any | None = None) -> Any | None:
    """Ask the backend how the workload does, with no row locked (``row``: as loaded, if it was);
    record an exit (or, for a kind that restarts in place, start it again), or what moved while it
    runs, if the row is still as it was."""
    row = row if row is not None else kind.load(pk)
    if row is None:
        return None
    seen = _look(kind, row)
    if kind.restarts_in_place:
        if seen.status is not None and seen.status.running:
            return row
        return _restart(kind, pk, seen.state, seen.status.message if seen.status is not None else "")
    if seen.status is None:
        return row
    if seen.status.running and not kind.changes(row, seen.progress, seen.observed):
        return row  # nothing to write: no lock
    with transaction.atomic():
        row = _locked(kind, pk)
        if kind.phase(row) is not Phase.WATCH or row.backend_state != seen.state:
            return row  # changed meanwhile: the next converge looks again
        if seen.status.running:
            kind.record_progress(row, seen.progress)
            kind.record_observed(row, seen.observed)
            return row
        row.backend_stopped = True
        row.backend_state = seen.after
        kind.record_exit(row, seen.status, seen.progress)
    kind.ended(row)
    return row


def _restart(kind: Kind, pk: int, state: dict[str, Any] | None, last: str = "") -> Any | None:
    """Its processes died (or stopped with the embedded portal, when `state` is None): start it
    again in place; after ``PORTAL_RESTART_LIMIT`` deaths it fails, saying how the last one ended
    (``last``: the backend's word, such as "killed: out of memory (limit 4 GiB)")."""
    with transaction.atomic():
        row = _locked(kind, pk)
        if kind.phase(row) is not Phase.WATCH or row.backend_state != state:
            return row
        restarts = row.restarts + (1 if state is not None else 0)
        if restarts > settings.PORTAL_RESTART_LIMIT:
            kind.disconnect(row)
            row.backend_state = None
            ended = f"its processes ended {restarts} times" + (f", the last time {last}" if last else "")
            kind.record_start_failure(row, ended, timed_out=False)
            return row
        row.backend_state = None
        row.restarts = restarts
        kind.mark_restarting(row)
        row.save()
    return start(kind, pk, states=(row.state,))


def stop(kind: Kind, pk: int) -> Any:
    """Stop the workload on its backend with no row locked (a stop may wait out a grace period),
    then record it stopped. One started again meanwhile is stopped too."""
    for _ in range(3):
        row = kind.load(pk)
        if row is None or kind.phase(row) is not Phase.STOP:
            return row
        kind.before_stop(row)
        state = row.backend_state
        ran = state is not None and not row.backend_stopped
        after = None
        if ran:
            backend = backend_of(kind, row)
            backend.stop(kind.grace_s(row))  # raises if something survived: reconcile tries again
            if kind.keeps_state_after_stop:
                after = backend.get_state()
            else:
                backend.clear_state()
        with transaction.atomic():
            row = _locked(kind, pk)
            if kind.phase(row) is not Phase.STOP:
                return row
            if row.backend_state not in (None, state):
                continue  # started again while it was being stopped
            row.start_claim = None
            if ran:
                row.backend_state = after
                row.backend_stopped = kind.keeps_state_after_stop
            kind.record_stop(row, ran)
        kind.ended(row)
        return row
    raise BackendError(f"{kind.key(pk)} was started again while it was being stopped", permanent=False)


# -- reconcile --------------------------------------------------------------------------------------


def reconcile(*, sweep: bool = True) -> dict[str, int]:
    """Converge every workload a backend may hold, or that waits for a lost start, of every kind;
    then the kinds' own upkeep and, if `sweep`, the orphan sweep. One workload that fails is logged
    and retried with backoff, so that it never wedges the loop.

    The workloads that run are loaded in bulk and their clusters asked about them all at once
    (``polling``), before any is converged; those that start or stop are loaded one at a time."""
    counts = {"converged": 0, "sent": 0, "failed": 0, "orphans_stopped": 0}
    lost = timezone.now() - timedelta(seconds=settings.PORTAL_START_LOST_AFTER_S)
    due = {name: [pk for pk in kind.due(lost) if RECONCILE.due(name, pk)] for name, kind in KINDS.items()}
    watched = {name: _watched(kind, due[name]) for name, kind in KINDS.items()}
    with polling(watched):
        for name, kind in KINDS.items():
            for pk in due[name]:
                try:
                    row = watched[name].get(pk)
                    sent = False
                    if row is not None:
                        _watch(kind, pk, row)
                    else:
                        sent = _converge_or_send(kind, pk)
                    counts["sent" if sent else "converged"] += 1
                    RECONCILE.succeeded(name, pk)
                except kind.model.DoesNotExist:  # deleted since the pass loaded it: nothing to converge
                    RECONCILE.succeeded(name, pk)
                except Exception:  # per object, with backoff
                    counts["failed"] += 1
                    delay = RECONCILE.failed(name, pk)
                    logger.exception("reconcile of %s failed; retrying in %.0f s", kind.key(pk), delay)
            upkeep = getattr(kind, "upkeep", None)
            if upkeep is not None:
                counts.update(upkeep())
    if sweep:  # reads /proc and squeue: the scheduler loop asks for it every SWEEP_EVERY_S
        counts["orphans_stopped"] = sweep_orphans()
    return counts


def _watched(kind: Kind, pks: list[int]) -> dict[int, Any]:
    """Of `pks`, the rows that run (their phase is WATCH), loaded in bulk."""
    return {pk: row for pk, row in kind.load_many(pks).items() if kind.phase(row) is Phase.WATCH}


@contextlib.contextmanager
def polling(watched: dict[str, dict[int, Any]]) -> Iterator[None]:
    """Within it, the backends of the clusters that run the `watched` rows (by kind, then id)
    answer ``poll()`` from one query each made on entry, where they can (``Backend.polling``:
    Slurm's squeue and sacct); the others ask as they would alone. A cluster that cannot be asked
    now is logged, and its workloads asked one at a time."""
    by_cluster: dict[int, tuple[Any, list[dict[str, Any]]]] = {}
    for name, rows in watched.items():
        for row in rows.values():
            cluster = KINDS[name].cluster(row)
            if row.backend_state is not None and cluster is not None:
                by_cluster.setdefault(cluster.pk, (cluster, []))[1].append(row.backend_state)
    with contextlib.ExitStack() as stack:
        for cluster, states in by_cluster.values():
            try:
                stack.enter_context(backend_for(cluster).polling(states))
            except Exception:  # each workload is then asked alone, as without it
                logger.warning("could not ask cluster %s about its workloads at once", cluster.name, exc_info=True)
        yield


# The kinds whose starts this loop makes itself once no worker has taken them within
# `PORTAL_START_UNTAKEN_S` of their admission: a job's start is quick, and a worker may have stopped
# taking work (its broker restarted under it) while it still runs. An instance's or a notebook's
# start may wait rightly behind a long environment build on the provisioning worker: those stay
# the workers'.
TAKEN_OVER = frozenset({"job"})


def _converge_or_send(kind: Kind, pk: int) -> bool:
    """Starts can be slow (a Slurm batch job to run, an environment to build): with a worker they
    go to it, unless one is under way; watching and stopping are done here. True if sent."""
    row = kind.load(pk)
    if row is None:
        return False
    if kind.phase(row) is Phase.START and settings.PORTAL_WORKLOAD_TRIGGER == "task":
        if claims.claim_live(row.start_claim, kind.claim_timeout_s()):
            return True
        waited = _untaken_for(kind, row)
        if waited is None or waited < settings.PORTAL_START_UNTAKEN_S:
            request_workload(kind.name, pk)
            return True
        logger.warning("no worker took the start of %s in %.0f s: starting it here", kind.key(pk), waited)
    converge(kind.name, pk)
    return False


def _untaken_for(kind: Kind, row: Any) -> float | None:
    """How long a start this loop may take over has waited since its admission; None for the others."""
    admitted = getattr(row, "admitted_at", None)
    if kind.name not in TAKEN_OVER or admitted is None:
        return None
    return (timezone.now() - admitted).total_seconds()


def sweep_orphans() -> int:
    """Stop what a worker killed between starting a workload and recording it left behind, on every
    cluster that is enabled or holds a live workload: its backend's ``sweep_orphans()`` keeps what
    live workloads recorded and every workload waiting to start (a lost start of it is adopted).
    Returns how many were stopped."""
    from apps.inventory.models import Cluster

    recorded: dict[int, list[dict[str, Any]]] = {}
    starting: set[str] = set()
    for kind in KINDS.values():
        rows = kind.model.objects.filter(state__in=kind.live_states)
        for pk, state, run, cluster_id in rows.values_list("pk", "state", "backend_state", kind.cluster_field):
            if run is not None and cluster_id is not None:
                recorded.setdefault(cluster_id, []).append(run)
            if state in kind.start_states:
                starting.add(kind.key(pk))
    clusters = list(Cluster.objects.filter(models.Q(enabled=True) | models.Q(pk__in=recorded)).order_by("pk"))
    # Clusters of one kind may see each other's workloads (this machine's processes, the jobs one
    # Slurm controller lists): each keeps what any of them recorded.
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for cluster in clusters:
        by_kind.setdefault(cluster.kind, []).extend(recorded.get(cluster.pk, []))
    stopped = 0
    for cluster in clusters:
        keep = Keep(tuple(by_kind[cluster.kind]), frozenset(starting))
        try:
            stopped += len(backend_for(cluster).sweep_orphans(str(settings.PORTAL_WORK_DIR), keep))
        except BackendError:
            logger.warning("could not look for orphaned workloads on cluster %s", cluster.name, exc_info=True)
    return stopped


def stop_on_this_machine() -> int:
    """Stop every workload that runs on this machine (the embedded portal's shutdown: it leaves no
    process behind); each kind records it (jobs go back in line, instances and notebooks start
    again at the next start). Returns how many were stopped."""
    stopped = 0
    for kind in KINDS.values():
        rows = kind.model.objects.filter(
            **{f"{kind.cluster_field}__kind": "local", "backend_state__isnull": False, "backend_stopped": False}
        )
        for pk in rows.values_list("pk", flat=True):
            row = kind.load(pk)
            try:
                backend_of(kind, row).stop(STOP_GRACE_S)
            except BackendError:
                logger.warning("stopping %s left something running", kind.key(pk), exc_info=True)
            with transaction.atomic():
                row = _locked(kind, pk)
                row.start_claim = None
                if kind.keeps_state_after_stop:
                    row.backend_stopped = True  # its logs stay readable
                else:
                    row.backend_state = None
                kind.record_host_stop(row)
            stopped += 1
    return stopped
