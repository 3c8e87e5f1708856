"""Replay a job trace through the scheduling engine in simulated time.

Part of the pure scheduling core: no Django. The engine is fed submissions and completions as
they happen on the trace's clock (nothing sleeps). As in the portal, a cycle runs when work
arrives or ends and then every `--interval-s` while work is pending; a periodic cycle in which
nothing arrived, ended or reached a rule of time (a victim's `min_runtime_s`, a gang's
`starvation_s`) would decide exactly as the one before it, so it is skipped, unless the one before
ran out of preemption searches (`max_preemption_tries`): then the next periodic cycle runs. The replay keeps its
own books, independently of the engine, to count quota violations and partial gangs.

    python -m apps.scheduling.replay --trace jobs.csv --quotas quotas.csv \\
        --gpus-per-node 8 --policy portal --json out.json [--reservations reservations.csv]

Reservations (`--reservations`, optional): a CSV file with columns
workspace,gpus,start_time_s,duration_s[,gpu_type], one row per reservation of `gpus` whole devices
held for a team (`workspace`) from `start_time_s` for `duration_s` (`gpu_type`, if given, must be
the replay's one type, "gpu"). The replay places each, in order of start, with the capacity
calendar (`apps.scheduling.calendar.earliest_start`) from its start on, over the replay's nodes and
the reservations placed before it (no running work blocks one: trace jobs are preemptible), hands
all of them to the engine before every cycle (`Engine.set_reservations`), and runs a cycle at the
first period from `grace_s` before each start, from each start and from each end, as the portal's
loop would. The metrics then gain "reservations": per reservation, where and when it was placed,
how long after its start (or after the first of its holder's work that it can hold began to wait,
if later) the largest job of its holder then waiting started, when its holder's work was first
admitted on it, how many of its devices the holder's own ordinary work still held at its start
(the engine leaves a holder's work where it is), the GPU-hours it held and those its holder used on
its devices within it, the jobs evicted for it, and the other teams' runs that held one of its
devices at a moment within it (`overlaps`, which must be empty), from the replay's own books.
Without reservations the replay and its output are as before.

See docs/scheduler.md for the policies, how preempted jobs resume and what each metric means.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import math
import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from pathlib import Path
from statistics import median
from typing import Any

from apps.scheduling.calendar import earliest_start
from apps.scheduling.engine import Engine
from apps.scheduling.types import (
    OBSERVED_RUNS,
    OBSERVED_WITHIN_S,
    UNIT,
    Admit,
    Decisions,
    Device,
    NodeInfo,
    Policy,
    Quota,
    Reservation,
    Workload,
    WorkspaceInfo,
    units_of,
)

GPU_TYPE = "gpu"
CLUSTER = "trace"
COHORT = "all"
THOUSANDTH = Decimal("0.001")
TRACE_COLUMNS = ("job_id", "submit_time_s", "duration_s", "num_gpus", "team")
QUOTA_COLUMNS = ("team", "gpus")  # and optionally "cohort": teams lend to and borrow from their cohort
RESERVATION_COLUMNS = ("workspace", "gpus", "start_time_s", "duration_s")  # and optionally "gpu_type"
METRIC_KEYS = (
    "jobs", "avg_jct_s", "avg_duration_s", "p50_wait_s", "p95_wait_s", "p99_wait_s", "gpu_utilization",
    "makespan_s", "jain_fairness_across_teams", "quota_violations", "partial_gangs", "preemptions", "rejected",
    "decisions", "engine_cpu_s", "admissions_per_s", "estimated_starts", "unknown_starts", "p50_estimate_error_s",
    "p90_estimate_error_s", "estimate_cpu_s", "per_workspace",
)  # fmt: skip
ESTIMATE_KEYS = METRIC_KEYS[-6:-1]  # null unless --estimates


class TraceError(Exception):
    """Bad input: reported as one line, without a traceback."""


# --- Input ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    job_id: str
    submit_s: float
    duration_s: float
    num_gpus: Decimal
    team: str
    seq: int  # order in the trace file: ties at one submit time keep it


@dataclass(frozen=True)
class ReservationRequest:
    """A reservation the trace asks for: `gpus` whole devices for `workspace` over `duration_s` from
    `start_s` (the replay places it, see `place_reservations`)."""

    workspace: str
    gpus: int
    start_s: float
    duration_s: float
    seq: int = 0  # order in the reservations file: its key is "reservation:<seq + 1>"


@dataclass(frozen=True)
class Options:
    gpus_per_node: int = 8
    policy: Policy = field(default_factory=Policy)
    checkpoint_interval_s: float = 1800.0  # 0: no checkpoints, a preempted job starts over
    restart_cost_s: float = 120.0  # added to every resumed run
    estimates: bool = False  # record estimated starts and check them against the actual ones
    interval_s: float = 2.0  # the portal's PORTAL_SCHEDULER_INTERVAL_S
    cohorts: dict[str, str | None] | None = None  # per team, from the quotas file; None: one cohort of all
    cluster_gpus: int | None = None  # GPUs in the cluster; None: the sum of the quotas
    reservations: tuple[ReservationRequest, ...] = ()  # see the module's docstring


def _number(row: dict[str, str], column: str, where: str, *, positive: bool = False) -> Decimal:
    raw = (row.get(column) or "").strip()
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise TraceError(f"{where}: {column} must be a number, got {raw!r}") from None
    if not value.is_finite():
        raise TraceError(f"{where}: {column} must be a finite number, got {raw!r}")
    if value < 0 or (positive and value == 0):
        raise TraceError(f"{where}: {column} must be {'above' if positive else 'at least'} 0, got {raw!r}")
    return value


def _rows(path: Path, columns: Sequence[str]) -> list[tuple[str, dict[str, str]]]:
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)} (expected {','.join(columns)})")
            return [(f"{path} line {reader.line_num}", row) for row in reader]
    except OSError as error:
        raise TraceError(f"{path}: {error.strerror or error}") from None
    except (csv.Error, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: not a readable CSV file ({error})") from None


def read_trace(path: Path) -> list[Job]:
    """Jobs in submission order; columns job_id,submit_time_s,duration_s,num_gpus,team[,status]."""
    jobs: list[Job] = []
    seen: set[str] = set()
    for seq, (where, row) in enumerate(_rows(path, TRACE_COLUMNS)):
        job_id, team = (row.get("job_id") or "").strip(), (row.get("team") or "").strip()
        if not job_id or not team:
            raise TraceError(f"{where}: job_id and team must not be empty")
        if job_id in seen:
            raise TraceError(f"{where}: job_id {job_id!r} appears twice")
        seen.add(job_id)
        submit = float(_number(row, "submit_time_s", where))
        duration = float(_number(row, "duration_s", where))
        gpus = _number(row, "num_gpus", where, positive=True)
        jobs.append(Job(job_id, submit, duration, gpus, team, seq))
    jobs.sort(key=lambda j: (j.submit_s, j.seq))
    return jobs


def read_reservations(path: Path) -> tuple[ReservationRequest, ...]:
    """Reservations in the file's order; columns workspace,gpus,start_time_s,duration_s[,gpu_type]."""
    requests = []
    for seq, (where, row) in enumerate(_rows(path, RESERVATION_COLUMNS)):
        workspace = (row.get("workspace") or "").strip()
        if not workspace:
            raise TraceError(f"{where}: workspace must not be empty")
        gpu_type = (row.get("gpu_type") or "").strip() or GPU_TYPE
        if gpu_type != GPU_TYPE:
            raise TraceError(f"{where}: gpu_type must be {GPU_TYPE!r}, the replay's one type, got {gpu_type!r}")
        gpus = _number(row, "gpus", where, positive=True)
        if gpus != gpus.to_integral_value():
            raise TraceError(f"{where}: gpus must be a whole number of devices, got {row['gpus'].strip()!r}")
        start = float(_number(row, "start_time_s", where))
        duration = float(_number(row, "duration_s", where, positive=True))
        requests.append(ReservationRequest(workspace, int(gpus), start, duration, seq))
    return tuple(requests)


def read_cohorts(path: Path) -> dict[str, str | None] | None:
    """Each team's cohort from the quotas file's optional cohort column (empty: none, so it neither
    lends nor borrows); None if the file has no such column (all teams in one cohort)."""
    rows = _rows(path, QUOTA_COLUMNS)
    if not rows or "cohort" not in rows[0][1]:
        return None
    return {(row.get("team") or "").strip(): (row.get("cohort") or "").strip() or None for _, row in rows}


def read_quotas(path: Path) -> dict[str, int]:
    """Whole GPUs per team; columns team,gpus[,cohort]."""
    quotas: dict[str, int] = {}
    for where, row in _rows(path, QUOTA_COLUMNS):
        team = (row.get("team") or "").strip()
        gpus = _number(row, "gpus", where)
        if not team:
            raise TraceError(f"{where}: team must not be empty")
        if gpus != gpus.to_integral_value():
            raise TraceError(f"{where}: gpus must be a whole number, got {row['gpus'].strip()!r}")
        if team in quotas:
            raise TraceError(f"{where}: team {team!r} appears twice")
        quotas[team] = int(gpus)
    if sum(quotas.values()) == 0:
        raise TraceError(f"{path}: the quotas add up to no GPUs, so the cluster would be empty")
    return quotas


# --- The simulated cluster ------------------------------------------------------------------------


def gang_shape(num_gpus: Decimal, gpus_per_node: int) -> tuple[int, Decimal]:
    """(replicas R, GPUs per replica G) for a job asking for `num_gpus`.

    Below one GPU: one replica with that share, to the nearest thousandth (a third, 0.3333, is 0.333:
    three share a device), at least one thousandth. Otherwise whole GPUs
    (a fractional count above one is rounded up); up to a node's worth runs as one replica, more
    as a gang of R = ceil(num / N) replicas of G = ceil(num / R) GPUs, the most even split that
    never spans a node (R x G may then exceed num by less than R GPUs).
    """
    if num_gpus < 1:
        return 1, max(THOUSANDTH, num_gpus.quantize(THOUSANDTH, rounding=ROUND_HALF_EVEN))
    whole = math.ceil(num_gpus)
    replicas = math.ceil(whole / gpus_per_node)
    return replicas, Decimal(math.ceil(whole / replicas))


def build_nodes(total_gpus: int, gpus_per_node: int) -> tuple[NodeInfo, ...]:
    """ceil(total / N) nodes of N GPUs of one type; the last one smaller if N does not divide total."""
    nodes = []
    for number, first in enumerate(range(0, total_gpus, gpus_per_node)):
        size = min(gpus_per_node, total_gpus - first)
        devices = tuple(Device(i, Decimal(1)) for i in range(size))
        nodes.append(NodeInfo(f"node-{number:04d}", CLUSTER, GPU_TYPE, devices))
    return tuple(nodes)


def build_workspaces(
    quotas: dict[str, int], teams: set[str], policy: Policy, cohorts: dict[str, str | None] | None = None
) -> tuple[WorkspaceInfo, ...]:
    """One workspace per team. Under portal each team is in its cohort (all in one unless the quotas
    file says otherwise) and may borrow the cohort's idle quota."""
    portal = policy.name == "portal"
    workspaces = []
    for team in sorted(set(quotas) | teams):
        cohort = cohort_of(team, cohorts) if portal else None
        quota = (Quota(GPU_TYPE, Decimal(quotas[team])),) if team in quotas else ()
        workspaces.append(WorkspaceInfo(team, quota, cohort=cohort, can_borrow=cohort is not None))
    return tuple(workspaces)


def place_reservations(
    requests: Sequence[ReservationRequest], nodes: Sequence[NodeInfo], teams: set[str]
) -> tuple[Reservation, ...]:
    """Each request placed by the capacity calendar at its start or the earliest moment after it
    that its devices are free of the reservations placed before it (in order of start, then of the
    file); TraceError for a team the replay does not know or more GPUs than the cluster has."""
    placed: list[Reservation] = []
    for request in sorted(requests, key=lambda r: (r.start_s, r.seq)):
        key = f"reservation:{request.seq + 1}"
        if request.workspace not in teams:
            raise TraceError(f"{key}: workspace {request.workspace!r} has no quota and no jobs in the trace")
        slot = earliest_start(
            gpus=request.gpus, gpu_type=GPU_TYPE, cluster=CLUSTER, duration_s=request.duration_s,
            not_before=request.start_s, nodes=nodes, reservations=placed, running=(),
        )  # fmt: skip
        if slot is None:
            total = sum(len(node.devices) for node in nodes)
            raise TraceError(f"{key}: asks for {request.gpus} GPUs, the cluster has {total}")
        label = f"{request.workspace}'s reservation {key}"
        placed.append(
            Reservation(key, request.workspace, slot.cluster, GPU_TYPE, slot.devices, slot.start, slot.end, label)
        )
    return tuple(placed)


def cohort_of(team: str, cohorts: dict[str, str | None] | None) -> str | None:
    """A team's cohort: one cohort of all without a cohort column; else its own (a team that is not in
    the quotas file has none)."""
    return COHORT if cohorts is None else cohorts.get(team)


# --- The replay's own books -----------------------------------------------------------------------


class Audit:
    """What the engine admitted, checked without trusting it: quota use and device allocation. Work
    admitted on a reservation is not counted against its team's quota until the reservation ends."""

    def __init__(
        self,
        quotas: dict[str, int],
        nodes: tuple[NodeInfo, ...],
        borrowing: bool,
        cohorts: dict[str, str | None] | None = None,
        enforced: bool = True,
    ):
        self.nominal = {team: gpus * UNIT for team, gpus in quotas.items()}
        self.borrowing = borrowing
        self.cohorts = cohorts
        self.enforced = enforced  # the shared policy has no quotas: nothing to violate
        self.used: dict[str, int] = defaultdict(int)
        self.devices = {n.name: [UNIT] * len(n.devices) for n in nodes}  # free thousandths per device
        self.quota_violations = 0
        self.partial_gangs = 0
        self.uncounted: dict[str, tuple[str, Workload]] = {}  # running on a reservation: (its key, the work)

    def admit(self, admit: Admit, workload: Workload) -> None:
        if not self._placement_ok(admit, workload):
            self.partial_gangs += 1
        if admit.reservation is not None:
            self.uncounted[workload.key] = (admit.reservation, workload)
            return
        self.used[workload.workspace] += units_of(workload.total_gpus)
        if not self._quota_ok(workload.workspace):
            self.quota_violations += 1

    def reservation_ended(self, key: str) -> None:
        """Reservation `key` ended: the work still running on it counts against quota from now on
        (it may leave its team above quota, as the engine does: that is no admission beyond it)."""
        for workload_key, (reservation, workload) in list(self.uncounted.items()):
            if reservation == key:
                del self.uncounted[workload_key]
                self.used[workload.workspace] += units_of(workload.total_gpus)

    def release(self, admit: Admit, workload: Workload) -> None:
        if self.uncounted.pop(workload.key, None) is None:
            self.used[workload.workspace] -= units_of(workload.total_gpus)
        for replica in admit.placement:
            free = self.devices.get(replica.node)
            for index, share in replica.devices:
                if free is not None and 0 <= index < len(free):
                    free[index] += units_of(share)

    def _quota_ok(self, team: str) -> bool:
        """Without borrowing nobody exceeds its quota; with it (no limits) what a cohort's teams use
        above their quotas must be covered by what the cohort's other teams leave idle of theirs, and
        a team without a cohort never exceeds its quota."""
        if not self.enforced:
            return True
        over = self.used[team] - self.nominal.get(team, 0)
        if over <= 0:
            return True
        cohort = cohort_of(team, self.cohorts)
        if not self.borrowing or cohort is None:
            return False
        borrowed = idle = 0
        for name in self.nominal.keys() | self.used.keys():
            if cohort_of(name, self.cohorts) != cohort:
                continue
            balance = self.used.get(name, 0) - self.nominal.get(name, 0)
            if balance > 0:
                borrowed += balance
            else:
                idle -= balance
        return borrowed <= idle

    def _placement_ok(self, admit: Admit, workload: Workload) -> bool:
        """R replicas, each on one node, each with shares adding up to G, no device over-allocated."""
        share = units_of(workload.gpus_per_replica)
        ok = len(admit.placement) == workload.replicas
        for replica in admit.placement:
            free = self.devices.get(replica.node)
            indexes = [index for index, _ in replica.devices]
            if free is None or len(set(indexes)) != len(indexes):
                ok = False
                continue
            if sum(units_of(s) for _, s in replica.devices) != share:
                ok = False
            for index, portion in replica.devices:
                if not 0 <= index < len(free) or units_of(portion) <= 0:
                    ok = False
                    continue
                free[index] -= units_of(portion)
                ok = ok and free[index] >= 0
        return ok


# --- The replay -----------------------------------------------------------------------------------


@dataclass
class _Progress:
    job: Job
    replicas: int
    gpus_per_replica: Decimal
    saved_s: float = 0.0  # work kept by checkpoints across preemptions
    run_started_at: float = 0.0
    restart_s: float = 0.0  # overhead at the start of the current run
    end_at: float = 0.0  # when the current run ends unless preempted
    admit: Admit | None = None
    workload: Workload | None = None
    finished_at: float | None = None
    queued_at: float = 0.0  # when it was last submitted or requeued


@dataclass
class _Held:
    """One reservation's books, kept by the replay apart from the engine (see reservation_metrics)."""

    reservation: Reservation
    requested_start_s: float
    devices: frozenset[tuple[str, int]]
    # From its start: when work of its holder that it can hold first waited, the largest such job
    # then (the first queued among equals), and when that job next started, here or elsewhere.
    waited_at: float | None = None
    waiting_job: str | None = None
    waiting_job_started_at: float | None = None
    first_admitted_at: float | None = None  # the first admission of its holder's work on it
    admissions: int = 0
    evicted: int = 0  # preemptions the engine made for it
    used_gpu_s: float = 0.0  # its holder's runs on its devices within it
    overlaps: list[str] = field(default_factory=list)  # other teams' jobs that ran on its devices within it
    # Its devices that its holder's ordinary work (admitted before it began, counted against quota)
    # held at its first cycle from its start: the engine leaves them to the holder, so they are not
    # free for the holder's work on the reservation until that work ends.
    holder_ordinary_gpus: int | None = None
    ended: bool = False


class Replay:
    """Feeds the engine the trace's submissions and completions in time order."""

    def __init__(self, jobs: list[Job], quotas: dict[str, int], options: Options):
        self.options = options
        total = sum(quotas.values()) if options.cluster_gpus is None else options.cluster_gpus
        self.nodes = build_nodes(total, options.gpus_per_node)
        workspaces = build_workspaces(quotas, {j.team for j in jobs}, options.policy, options.cohorts)
        self.engine = Engine(workspaces, self.nodes, options.policy)
        portal = options.policy.name == "portal"
        self.audit = Audit(quotas, self.nodes, portal, options.cohorts, enforced=options.policy.name != "shared")
        self.jobs = jobs
        # Each team's queue follows submit time (ties: the file's order), as the portal's does.
        by_submit = sorted(jobs, key=lambda j: (j.submit_s, j.seq))
        self.queue_order = {job.job_id: n for n, job in enumerate(by_submit)}
        self.progress: dict[str, _Progress] = {}
        for job in jobs:
            replicas, per_replica = gang_shape(job.num_gpus, options.gpus_per_node)
            self.progress[job.job_id] = _Progress(job, replicas, per_replica)
        self.ends: list[tuple[float, int, str]] = []  # (finish time, seq, job_id) of running jobs
        self.wakeups: list[float] = []  # when a rule of time may change a decision (see _wake_at)
        self.engine_cpu_s = 0.0
        self.counts = {"admitted": 0, "preempted": 0, "rejected": 0, "cycles": 0}
        # Estimated starts, checked against what happened (see _record_estimates).
        self.runs: dict[str, deque[tuple[float, float]]] = defaultdict(lambda: deque(maxlen=OBSERVED_RUNS))
        self.estimated: dict[str, float] = {}  # job id: the first estimate it had while it waited
        self.first_start: dict[str, float] = {}
        self.unestimated: set[str] = set()  # submitted, not started yet, no estimate yet
        self.waited_unknown: set[str] = set()  # waited at least one cycle with no estimate
        self.estimate_cpu_s = 0.0
        # Reservations: placed once, handed to the engine before every cycle, a cycle forced at the
        # first period from their moments (see _force_at); none without --reservations.
        teams = set(quotas) | {job.team for job in jobs}
        self.reservations = place_reservations(options.reservations, self.nodes, teams)
        requested = {f"reservation:{r.seq + 1}": r.start_s for r in options.reservations}
        self.held = {r.key: _Held(r, requested[r.key], frozenset(r.devices)) for r in self.reservations}
        self.forced: set[float] = set()
        if self.reservations:
            self.engine.set_reservations(self.reservations)  # before any submit: see its docstring
            for reservation in self.reservations:
                for moment in (reservation.start - options.policy.grace_s, reservation.start, reservation.end):
                    self._force_at(moment)

    def _timed(self, call: Callable[[], Any]) -> Any:
        started = time.process_time()
        try:
            return call()
        finally:
            self.engine_cpu_s += time.process_time() - started

    def run(self) -> dict[str, Any]:
        """One cycle at every timestamp where jobs end or arrive, or a rule of time expires while
        work is pending; all ends first, then all arrivals."""
        jobs, next_job = self.jobs, 0
        # With reservations, waiting work may also wait for one to end: its forced cycle comes as a wakeup.
        while next_job < len(jobs) or self.ends or (self.forced and self.engine.pending and self.wakeups):
            now = min(
                jobs[next_job].submit_s if next_job < len(jobs) else math.inf,
                self.ends[0][0] if self.ends else math.inf,
                self.wakeups[0] if self.wakeups else math.inf,
            )
            happened = False
            while self.wakeups and self.wakeups[0] <= now:
                if heapq.heappop(self.wakeups) in self.forced:
                    happened = True
            while self.ends and self.ends[0][0] <= now:
                self._finish(heapq.heappop(self.ends)[2], now)
                happened = True
            while next_job < len(jobs) and jobs[next_job].submit_s <= now:
                self._submit(self.progress[jobs[next_job].job_id], now)
                next_job, happened = next_job + 1, True
            if happened or self.engine.pending:
                self._cycle(now)
        stuck = sorted(self.engine.pending)
        if stuck:
            raise RuntimeError(f"{len(stuck)} job(s) never started, e.g. {stuck[0]}: the engine stalled")
        return self.metrics()

    def _workload(self, progress: _Progress, expected_runtime_s: float | None = None) -> Workload:
        job = progress.job
        return Workload(
            job.job_id, job.team, GPU_TYPE, progress.gpus_per_replica, progress.replicas,
            seq=self.queue_order[job.job_id],
            submitted_at=job.submit_s, expected_runtime_s=expected_runtime_s,
        )  # fmt: skip

    def _observed(self, team: str, now: float) -> float | None:
        """What the portal would expect of a job's run: the median length of its team's last runs that
        ended recently (the trace declares no limit to cap it with); None before any."""
        recent = [length for ended, length in self.runs[team] if ended >= now - OBSERVED_WITHIN_S]
        return median(recent) if recent else None

    def _submit(self, progress: _Progress, now: float) -> None:
        progress.queued_at = now
        workload = self._workload(progress, self._observed(progress.job.team, now))
        if self.options.estimates and progress.job.job_id not in self.first_start:
            self.unestimated.add(progress.job.job_id)
        self._timed(lambda: self.engine.submit(workload))
        if workload.replicas > 1 or workload.gpus_per_replica > 1:  # a gang: may starve, then get nodes held
            self._wake_at(progress.job.submit_s + self.options.policy.starvation_s, now)

    def _wake_at(self, moment: float, now: float) -> None:
        """A cycle at the portal loop's first periodic cycle from `moment`, when a rule of time (a
        victim's min_runtime_s, a gang's starvation_s) expires, even if no job arrives or ends."""
        if self.options.policy.name == "fifo" or moment <= now:
            return
        interval = self.options.interval_s
        if interval > 0:
            moment = math.ceil(moment / interval) * interval
        heapq.heappush(self.wakeups, moment)

    def _force_at(self, moment: float) -> None:
        """A cycle at the portal loop's first periodic cycle from `moment` (a reservation's eviction,
        start or end), whether or not work waits then, under every policy."""
        interval = self.options.interval_s
        moment = max(0.0, math.ceil(moment / interval) * interval if interval > 0 else moment)
        self.forced.add(moment)
        heapq.heappush(self.wakeups, moment)

    def _finish(self, job_id: str, now: float) -> None:
        progress = self.progress[job_id]
        self._timed(lambda: self.engine.finish(job_id, now))
        assert progress.admit is not None and progress.workload is not None
        self.audit.release(progress.admit, progress.workload)
        if self.reservations:
            self._ran(progress, now)
        progress.finished_at = now
        self.runs[progress.job.team].append((now, now - progress.run_started_at))
        progress.admit = progress.workload = None

    def _cycle(self, now: float) -> None:
        if self.reservations:
            self._before_cycle(now)
        decisions: Decisions = self._timed(lambda: self.engine.cycle(now, explain=False))
        if self.reservations:
            self._count_for_reservations(decisions, now)
        self.counts["cycles"] += 1
        self.counts["rejected"] += len(decisions.rejected)
        self.unestimated.difference_update(reject.key for reject in decisions.rejected)
        admitted = {admit.key: admit for admit in decisions.admitted}
        for preempt in decisions.preempted:
            progress = self.progress[preempt.key]
            if preempt.key in admitted:  # admitted earlier in this same cycle: checked, but it never ran
                self.counts["preempted"] += 1
                self.counts["admitted"] += 1
                workload, admit = self._workload(progress), admitted.pop(preempt.key)
                self.audit.admit(admit, workload)
                self.audit.release(admit, workload)
            else:
                self._preempted(progress, now)
        for admit in admitted.values():
            self._admitted(self.progress[admit.key], admit, now)
        if decisions.preempted:
            # Victims go back in line at once, keeping their original place (seq, submit time).
            for preempt in decisions.preempted:
                self._submit(self.progress[preempt.key], now)
        if self.engine.cut_short:
            # Its preemption searches ran out before all work that may preempt had one: the portal's
            # next periodic cycle searches again, so it is not one that would decide as this one did.
            self._wake_at(now + self.options.interval_s, now)
        if self.unestimated:
            self._record_estimates(now)

    def _record_estimates(self, now: float) -> None:
        """Each waiting job's first estimated start, as the portal's cycle at this moment would show it,
        timed apart from the engine's scheduling (the replay's cycles do not explain)."""
        started = time.process_time()
        estimates = self.engine.estimates(now, self.unestimated)
        for job_id in list(self.unestimated):
            if job_id in estimates:
                self.estimated[job_id] = estimates[job_id]
                self.unestimated.discard(job_id)
            else:
                self.waited_unknown.add(job_id)
        self.estimate_cpu_s += time.process_time() - started

    def _admitted(self, progress: _Progress, admit: Admit, now: float) -> None:
        workload = self._workload(progress)
        self.audit.admit(admit, workload)
        self.counts["admitted"] += 1
        progress.admit, progress.workload, progress.run_started_at = admit, workload, now
        if progress.job.job_id not in self.first_start:
            self.first_start[progress.job.job_id] = now
            self.unestimated.discard(progress.job.job_id)
        progress.end_at = now + progress.restart_s + progress.job.duration_s - progress.saved_s
        heapq.heappush(self.ends, (progress.end_at, progress.job.seq, progress.job.job_id))
        if self.options.policy.preemption:
            self._wake_at(now + self.options.policy.min_runtime_s, now)  # it may be a victim from then on

    def _preempted(self, progress: _Progress, now: float) -> None:
        """Back to the last checkpoint: only whole checkpoint intervals of this run's work are kept."""
        self.counts["preempted"] += 1
        assert progress.admit is not None and progress.workload is not None
        self.audit.release(progress.admit, progress.workload)
        self.ends.remove((progress.end_at, progress.job.seq, progress.job.job_id))
        heapq.heapify(self.ends)
        if self.reservations:
            self._ran(progress, now)
        worked = max(0.0, now - progress.run_started_at - progress.restart_s)
        interval = self.options.checkpoint_interval_s
        if interval > 0:
            progress.saved_s += min(
                interval * math.floor(worked / interval), progress.job.duration_s - progress.saved_s
            )
        progress.restart_s = self.options.restart_cost_s
        progress.admit = progress.workload = None

    def metrics(self) -> dict[str, Any]:
        return compute_metrics(self)

    # -- reservations ------------------------------------------------------------------------------

    def _before_cycle(self, now: float) -> None:
        """Hand the engine the reservations, as the portal does each cycle; count work on those that
        ended against quota; note when a holder's work first waits on one under way."""
        self.engine.set_reservations(self.reservations)
        for held in self.held.values():
            reservation = held.reservation
            if now >= reservation.end and not held.ended:
                held.ended = True
                self.audit.reservation_ended(reservation.key)
            elif reservation.start <= now < reservation.end:
                if held.holder_ordinary_gpus is None:
                    held.holder_ordinary_gpus = self._held_by_holder(held)
                if held.waited_at is None:
                    held.waited_at, held.waiting_job = self._waiting_for(reservation)

    def _held_by_holder(self, held: _Held) -> int:
        """How many of the reservation's devices its holder's running ordinary work holds."""
        devices: set[tuple[str, int]] = set()
        for _, _, job_id in self.ends:
            progress = self.progress[job_id]
            admit = progress.admit
            if admit is None or admit.reservation is not None or progress.job.team != held.reservation.workspace:
                continue
            devices.update((r.node, index) for r in admit.placement for index, _ in r.devices)
        return len(devices & held.devices)

    def _waiting_for(self, reservation: Reservation) -> tuple[float | None, str | None]:
        """From the reservation's start: when the holder's waiting work that it can hold (no more GPUs
        than it has) was first queued, and the largest such job (the first queued among equals);
        (None, None) if none waits."""
        queue = self.engine.queues.get(reservation.workspace)
        fits = []
        for _, _, key, _ in queue.items if queue else ():
            progress = self.progress[key]
            gpus = progress.replicas * progress.gpus_per_replica
            if gpus <= reservation.gpus:
                fits.append((-gpus, progress.queued_at, key))
        if not fits:
            return None, None
        return max(reservation.start, min(queued for _, queued, _ in fits)), min(fits)[2]

    def _count_for_reservations(self, decisions: Decisions, now: float) -> None:
        for preempt in decisions.preempted:
            held = self.held.get(preempt.for_key)
            if held is not None:
                held.evicted += 1
        for admit in decisions.admitted:
            for held in self.held.values():
                if held.waiting_job == admit.key and held.waiting_job_started_at is None:
                    held.waiting_job_started_at = now
            if admit.reservation is not None:
                held = self.held[admit.reservation]
                held.admissions += 1
                if held.first_admitted_at is None:
                    held.first_admitted_at = now

    def _ran(self, progress: _Progress, now: float) -> None:
        """A run ended (finished or preempted): what of it fell on each reservation's devices within
        the reservation, its holder's use or another team's overlap."""
        assert progress.admit is not None
        began = progress.run_started_at
        for held in self.held.values():
            reservation = held.reservation
            start, end = max(began, reservation.start), min(now, reservation.end)
            if start >= end:
                continue
            shares = [
                share for replica in progress.admit.placement for index, share in replica.devices
                if (replica.node, index) in held.devices
            ]  # fmt: skip
            if not shares:
                continue
            if progress.job.team == reservation.workspace:
                held.used_gpu_s += float(sum(shares)) * (end - start)
            else:
                held.overlaps.append(progress.job.job_id)


# --- Metrics --------------------------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted values (0 for none)."""
    if not values:
        return 0.0
    rank = max(1, math.ceil(fraction * len(values)))
    return values[rank - 1]


def jain(values: list[float]) -> float:
    """Jain's index (sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one gets everything."""
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else 1.0


def compute_metrics(replay: Replay) -> dict[str, Any]:
    done = [p for p in replay.progress.values() if p.finished_at is not None]
    jct = [p.finished_at - p.job.submit_s for p in done if p.finished_at is not None]
    waits = sorted(j - p.job.duration_s for j, p in zip(jct, done, strict=True))
    speed: dict[str, list[float]] = defaultdict(list)  # per team: duration / JCT, 1 = no wait
    for j, p in zip(jct, done, strict=True):
        speed[p.job.team].append(p.job.duration_s / j if j > 0 else 1.0)
    first = min((p.job.submit_s for p in done), default=0.0)
    makespan = max((p.finished_at for p in done if p.finished_at is not None), default=first) - first
    capacity = sum(len(n.devices) for n in replay.nodes)
    useful = sum(float(p.job.num_gpus) * p.job.duration_s for p in done)
    counts, cpu = replay.counts, replay.engine_cpu_s
    result: dict[str, Any] = {
        "jobs": len(replay.progress),
        "avg_jct_s": sum(jct) / len(jct) if jct else 0.0,
        "avg_duration_s": sum(p.job.duration_s for p in done) / len(done) if done else 0.0,
        "p50_wait_s": percentile(waits, 0.50),
        "p95_wait_s": percentile(waits, 0.95),
        "p99_wait_s": percentile(waits, 0.99),
        "gpu_utilization": useful / (capacity * makespan) if makespan > 0 else 0.0,
        "makespan_s": makespan,
        "jain_fairness_across_teams": jain([sum(s) / len(s) for s in speed.values()]),
        "quota_violations": replay.audit.quota_violations,
        "partial_gangs": replay.audit.partial_gangs,
        "preemptions": counts["preempted"],
        "rejected": counts["rejected"],
        "decisions": counts["admitted"] + counts["preempted"] + counts["rejected"],
        "engine_cpu_s": cpu,
        "admissions_per_s": counts["admitted"] / cpu if cpu > 0 else 0.0,
        **estimate_metrics(replay),
    }
    result = {key: round(value, 6) if isinstance(value, float) else value for key, value in result.items()}
    result["per_workspace"] = per_workspace(replay)
    if replay.reservations:
        result["reservations"] = reservation_metrics(replay)
    return result


def reservation_metrics(replay: Replay) -> list[dict[str, Any]]:
    """Per reservation, in order of start: where and when it was placed; when its holder's work
    first waited for it (from its start), the largest job then waiting, and its start latency: from
    then until that job started (None if none waited or it never started); when its holder's work
    was first admitted on it; how many of its devices the holder's ordinary work
    still held at its start (not free for the holder's work on it until that ends); the GPU-hours
    it held and those its holder used on its devices within it; the jobs evicted for it; other
    teams' jobs that ran on its devices within it (must be none)."""
    result = []
    for held in replay.held.values():
        reservation = held.reservation
        waited, started = held.waited_at, held.waiting_job_started_at
        latency = started - waited if waited is not None and started is not None else None
        result.append({
            "key": reservation.key,
            "workspace": reservation.workspace,
            "gpus": reservation.gpus,
            "nodes": len({node for node, _ in reservation.devices}),
            "requested_start_s": held.requested_start_s,
            "start_s": reservation.start,
            "end_s": reservation.end,
            "holder_waited_at_s": waited,
            "holder_waiting_job": held.waiting_job,
            "holder_waiting_job_started_at_s": started,
            "start_latency_s": latency,
            "holder_first_admitted_at_s": held.first_admitted_at,
            "holder_admissions": held.admissions,
            "holder_ordinary_gpus_at_start": held.holder_ordinary_gpus,
            "evicted": held.evicted,
            "reserved_gpu_h": round(reservation.gpus * (reservation.end - reservation.start) / 3600, 6),
            "used_gpu_h": round(held.used_gpu_s / 3600, 6),
            "overlaps": sorted(held.overlaps),
        })  # fmt: skip
    return result


def per_workspace(replay: Replay) -> dict[str, dict[str, Any]]:
    """Per team: its jobs and how long they waited for their first start (jobs that started)."""
    waits: dict[str, list[float]] = defaultdict(list)
    jobs: dict[str, int] = defaultdict(int)
    for job_id, progress in replay.progress.items():
        jobs[progress.job.team] += 1
        if job_id in replay.first_start:
            waits[progress.job.team].append(replay.first_start[job_id] - progress.job.submit_s)
    result = {}
    for team in sorted(jobs):
        values = sorted(waits[team])
        result[team] = {
            "jobs": jobs[team],
            "mean_wait_s": round(sum(values) / len(values), 6) if values else 0.0,
            "p95_wait_s": round(percentile(values, 0.95), 6),
            "max_wait_s": round(values[-1], 6) if values else 0.0,
        }
    return result


def estimate_metrics(replay: Replay) -> dict[str, Any]:
    """How far each job's first estimated start, while it waited, was from its first actual start;
    all null unless the replay recorded estimates."""
    if not replay.options.estimates:
        return dict.fromkeys(ESTIMATE_KEYS)
    starts = replay.first_start
    errors = sorted(abs(starts[j] - estimate) for j, estimate in replay.estimated.items() if j in starts)
    return {
        "estimated_starts": len(errors),
        "unknown_starts": len(replay.waited_unknown - replay.estimated.keys()),
        "p50_estimate_error_s": percentile(errors, 0.50),
        "p90_estimate_error_s": percentile(errors, 0.90),
        "estimate_cpu_s": replay.estimate_cpu_s,
    }


# --- Command line ---------------------------------------------------------------------------------

EXAMPLES = """\
examples:
  python -m apps.scheduling.replay --trace traces/philly_vc_jobs.csv --quotas traces/philly_vc_quota.csv \\
      --gpus-per-node 8 --policy fifo --json fifo.json
  python -m apps.scheduling.replay --trace traces/philly_vc_jobs.csv --quotas traces/philly_vc_quota.csv \\
      --gpus-per-node 8 --policy portal --checkpoint-interval-s 3600 --restart-cost-s 300 --json -

The JSON keys are defined in docs/scheduler.md ("Metrics").
"""


# The portal policy the replay uses unless told otherwise: the portal's own limits (max_scan,
# max_preemption_tries), except min_runtime_s, 2 hours, not the portal's 10 minutes: fewer evictions
# of work that has barely checkpointed. docs/benchmarks.md shows how the Philly figures move with it.
PORTAL = Policy(name="portal", starvation_s=3600.0, min_runtime_s=7200.0)


def parser() -> argparse.ArgumentParser:
    defaults = Options()
    p = argparse.ArgumentParser(
        prog="python -m apps.scheduling.replay",
        description="Replay a job trace through the scheduling engine in simulated time and print its metrics.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--trace", type=Path, required=True, help="CSV: job_id,submit_time_s,duration_s,num_gpus,team[,status]"
    )
    p.add_argument("--quotas", type=Path, required=True, help="CSV: team,gpus[,cohort]; the cluster is the sum of gpus")
    p.add_argument(
        "--gpus-per-node", type=int, default=defaults.gpus_per_node, help="GPUs per node (default %(default)s)"
    )
    p.add_argument(
        "--policy",
        choices=("fifo", "portal", "shared"),
        default="portal",
        help="fifo: per-team quota and queue; shared: one queue, no quotas, backfill; default %(default)s",
    )
    p.add_argument(
        "--interval-s",
        type=float,
        default=defaults.interval_s,
        help="the scheduling period: a cycle every this many seconds while work waits (default %(default)s)",
    )
    p.add_argument("--json", required=True, metavar="OUT", help="where to write the metrics; - for stdout")
    p.add_argument(
        "--checkpoint-interval-s",
        type=float,
        default=defaults.checkpoint_interval_s,
        help="seconds of work between checkpoints; 0: none, a preempted job starts over (default %(default)s)",
    )
    p.add_argument(
        "--restart-cost-s",
        type=float,
        default=defaults.restart_cost_s,
        help="seconds a resumed job spends before it does work again (default %(default)s)",
    )
    p.add_argument("--limit", type=int, default=None, help="replay only the first LIMIT jobs of the trace file")
    p.add_argument(
        "--reservations",
        type=Path,
        default=None,
        help="CSV: workspace,gpus,start_time_s,duration_s[,gpu_type]: whole GPUs held for a team over a window",
    )
    p.add_argument(
        "--estimates",
        action="store_true",
        help="record each waiting job's first estimated start and report how far its actual start was from it",
    )
    _add_knobs(p.add_argument_group("portal policy knobs (docs/scheduler.md; fifo ignores them)"))
    return p  # fmt: skip


def _add_knobs(knobs: argparse._ArgumentGroup) -> None:
    knobs.add_argument(
        "--max-scan", type=int, default=PORTAL.max_scan, help="pending jobs examined per cycle (default %(default)s)"
    )
    knobs.add_argument(
        "--max-preemption-tries",
        type=int,
        default=PORTAL.max_preemption_tries,
        help="preemption searches per cycle (default %(default)s)",
    )
    knobs.add_argument(
        "--min-runtime-s",
        type=float,
        default=PORTAL.min_runtime_s,
        help="never preempt a job that has run less than this (default %(default)s)",
    )
    knobs.add_argument(
        "--starvation-s",
        type=float,
        default=PORTAL.starvation_s,
        help="a gang blocked longer than this has nodes held for it (default %(default)s)",
    )
    knobs.add_argument(
        "--half-life-s",
        type=float,
        default=PORTAL.half_life_s,
        help="fair share: half-life of past use (default %(default)s)",
    )
    knobs.add_argument("--no-preemption", action="store_true", help="never preempt")  # fmt: skip


def options_from(args: argparse.Namespace) -> Options:
    """The replay's options from the command line; TraceError for a value out of range."""
    for name, least in (("gpus_per_node", 1), ("max_scan", 1), ("max_preemption_tries", 0), ("limit", 0)):
        value = getattr(args, name)
        if value is not None and value < least:
            raise TraceError(f"--{name.replace('_', '-')} must be at least {least}")
    for name in (
        "checkpoint_interval_s",
        "restart_cost_s",
        "starvation_s",
        "min_runtime_s",
        "half_life_s",
        "interval_s",
    ):
        value, above = getattr(args, name), name == "half_life_s"
        if not math.isfinite(value) or value < 0 or (above and value == 0):
            raise TraceError(f"--{name.replace('_', '-')} must be a finite number {'above' if above else 'at least'} 0")
    if args.policy in ("fifo", "shared"):
        policy = Policy(name=args.policy, preemption=False, starvation_s=args.starvation_s)
    else:
        policy = Policy(
            name="portal", max_scan=args.max_scan, starvation_s=args.starvation_s, min_runtime_s=args.min_runtime_s,
            half_life_s=args.half_life_s, max_preemption_tries=args.max_preemption_tries,
            preemption=not args.no_preemption,
        )  # fmt: skip
    return Options(
        args.gpus_per_node, policy, args.checkpoint_interval_s, args.restart_cost_s, args.estimates, args.interval_s
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        options = options_from(args)
        jobs = read_trace(args.trace)
        if args.limit is not None:
            jobs = sorted(jobs, key=lambda j: j.seq)[: args.limit]
            jobs.sort(key=lambda j: (j.submit_s, j.seq))
        quotas = read_quotas(args.quotas)
        options = replace(options, cohorts=read_cohorts(args.quotas))
        if args.reservations is not None:
            options = replace(options, reservations=read_reservations(args.reservations))
        run = Replay(jobs, quotas, options)
    except TraceError as error:
        print(f"replay: error: {error}", file=sys.stderr)
        return 2
    result = run.run()
    text = json.dumps(result, indent=2) + "\n"
    if args.json == "-":
        sys.stdout.write(text)
    else:
        try:
            Path(args.json).write_text(text)
        except OSError as error:
            print(f"replay: error: cannot write {args.json}: {error.strerror or error}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
