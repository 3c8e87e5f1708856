"""What-if replay: the portal's own recorded workloads replayed in simulated time, under today's
settings and under an admin's changes (quotas, cohorts, policy, cluster size), side by side.

A window of history (workloads submitted in it, with their shapes, workspaces, priorities and the
time they actually held their GPUs) becomes a trace of replay jobs, and apps/scheduling/replay.py's
``Replay`` runs it twice through the scheduling engine: once as the portal is set up now, once with
the changes. Nothing live is read after the history is loaded, and nothing live is written: the
figures go to a ``WhatIfReplay`` row. docs/whatif.md says what is approximated.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from apps.audit.actions import SYSTEM, Origin, do_log_event
from apps.audit.events import Event
from apps.errors import ActionError
from apps.inventory.models import GPU
from apps.scheduling import adapter
from apps.scheduling.models import WhatIfReplay
from apps.scheduling.replay import Job, Options, Replay, compute_metrics, per_workspace, percentile
from apps.scheduling.trigger import run_here
from apps.scheduling.types import Policy, Workload
from apps.workloads.kinds import scheduled
from apps.workloads.models import Workload as Row
from apps.workspaces.models import GPUQuota, Workspace

logger = logging.getLogger(__name__)

POLICIES = ("portal", "fifo", "shared")
ALL = "(all)"  # the row of every workspace together; no workspace name has parentheses
FIGURES = ("jobs", "not_run", "mean_wait_s", "p95_wait_s", "mean_jct_s", "preemptions", "gpu_utilization")
# "team-b=+16", "team-b=-4", "team-b=24"; a cluster size alone: "+16", "64".
_SIZE = re.compile(r"^([+-]?)(\d{1,6})$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAX_CLUSTER_GPUS = 100_000
NO_SUCH_WORKSPACE = "There is no workspace named"


def names_no_workspace(message: str) -> bool:
    """Whether a problem (see `problems`) is a name that no workspace has."""
    return message.startswith(NO_SUCH_WORKSPACE)


PROGRESS_EVERY_S = 1.0  # how often a running replay writes its progress
# A running replay that wrote no progress for this long has lost its worker (`upkeep`).
LOST_AFTER = timedelta(minutes=10)


# --- Settings: today's and the admin's changes ------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What one replay runs under: whole GPUs of quota per workspace, each workspace's cohort, the
    policy, and the cluster (GPUs in all, GPUs per node)."""

    quotas: dict[str, int]
    cohorts: dict[str, str | None]
    policy: Policy
    cluster_gpus: int
    gpus_per_node: int
    interval_s: float

    def as_json(self) -> dict[str, Any]:
        rules = self.policy
        return {
            "quotas": dict(sorted(self.quotas.items())),
            "cohorts": {name: cohort for name, cohort in sorted(self.cohorts.items()) if cohort},
            "policy": rules.name,
            "preemption": rules.preemption,
            "min_runtime_s": rules.min_runtime_s,
            "starvation_s": rules.starvation_s,
            "cluster_gpus": self.cluster_gpus,
            "gpus_per_node": self.gpus_per_node,
        }


def today() -> Setup:
    """The portal's settings now: quotas summed over GPU types (to whole GPUs), cohorts, the
    scheduling policy, and the enabled clusters' GPUs as one pool of nodes as large as the largest."""
    quotas = {
        name: int(Decimal(total).to_integral_value(ROUND_HALF_UP))
        for name, total in GPUQuota.objects.values_list("workspace__name").annotate(total=Sum("gpus"))
    }
    cohorts = dict(Workspace.objects.values_list("name", "cohort__name"))
    gpus = GPU.objects.filter(node__pool__cluster__enabled=True)
    per_node = [n for _, n in gpus.values_list("node_id").annotate(n=Count("pk")).order_by()]
    rules = replace(adapter.policy(), placement_by_cluster=())
    if rules.name != "portal":
        rules = replace(rules, preemption=False)
    return Setup(
        quotas=quotas,
        cohorts=cohorts,
        policy=rules,
        cluster_gpus=sum(per_node) or sum(quotas.values()),
        gpus_per_node=max(per_node, default=8),
        interval_s=float(settings.PORTAL_SCHEDULER_INTERVAL_S),
    )


@dataclass(frozen=True)
class Changes:
    """An admin's changes to today's settings. Quotas and the cluster size are "+N", "-N" (more or
    fewer whole GPUs than today) or "N"; a cohort of None takes the workspace out of any cohort."""

    quotas: dict[str, str] = field(default_factory=dict)
    cohorts: dict[str, str | None] = field(default_factory=dict)
    policy: str | None = None
    preemption: bool | None = None
    min_runtime_s: float | None = None
    starvation_s: float | None = None
    cluster_gpus: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Changes:
        known = {name: data[name] for name in cls.__dataclass_fields__ if data.get(name) is not None}
        return cls(**known)

    def as_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return {name: value for name, value in data.items() if value not in (None, {})}

    def describe(self) -> list[str]:
        """Each change in words, for the page, the API and the command line."""
        lines = [f"quota of {name}: {_signed(value)} GPUs" for name, value in sorted(self.quotas.items())]
        lines += [f"cohort of {name}: {cohort or 'none'}" for name, cohort in sorted(self.cohorts.items())]
        if self.policy:
            lines.append(f"policy: {self.policy}")
        if self.preemption is not None:
            lines.append(f"preemption: {'on' if self.preemption else 'off'}")
        if self.min_runtime_s is not None:
            lines.append(f"min_runtime_s: {self.min_runtime_s:g}")
        if self.starvation_s is not None:
            lines.append(f"starvation_s: {self.starvation_s:g}")
        if self.cluster_gpus:
            lines.append(f"cluster: {_signed(self.cluster_gpus)} GPUs")
        return lines or ["no changes"]

    def apply(self, base: Setup) -> Setup:
        quotas = dict(base.quotas)
        for name, value in self.quotas.items():
            quotas[name] = resize(base.quotas.get(name, 0), value)
        rules = base.policy
        if self.policy:
            rules = replace(rules, name=self.policy)  # type: ignore[arg-type]  # checked: one of POLICIES
        for knob in ("preemption", "min_runtime_s", "starvation_s"):
            if getattr(self, knob) is not None:
                rules = replace(rules, **{knob: getattr(self, knob)})
        if rules.name != "portal":  # fifo and shared never preempt, as in the trace replay
            rules = replace(rules, preemption=False)
        size = resize(base.cluster_gpus, self.cluster_gpus) if self.cluster_gpus else base.cluster_gpus
        return replace(base, quotas=quotas, cohorts={**base.cohorts, **self.cohorts}, policy=rules, cluster_gpus=size)


def _signed(value: str) -> str:
    return value if value.startswith(("+", "-")) else f"set to {value}"


def resize(current: int, change: str) -> int:
    """`current` changed by "+N" or "-N", or replaced by "N"."""
    sign, number = _SIZE.match(change).groups()  # type: ignore[union-attr]  # checked by parse_size
    return current + int(number) if sign == "+" else current - int(number) if sign == "-" else int(number)


def parse_size(text: str) -> str | None:
    """A size change as stored ("+16", "-4", "24"), or None if `text` is not one."""
    text = text.strip().replace(" ", "")
    return text if _SIZE.match(text) else None


def parse_assignments(items: list[str], what: str, *, sizes: bool) -> tuple[dict[str, str], list[str]]:
    """ "WORKSPACE=VALUE" items as a mapping, and a message for each bad one."""
    found: dict[str, str] = {}
    errors: list[str] = []
    example = "team-b=+16, team-b=-4 or team-b=24" if sizes else "team-b=pool-1 (or team-b= for none)"
    for item in items:
        name, equals, value = item.strip().partition("=")
        name, value = name.strip(), value.strip()
        if not equals or not name:
            errors.append(f"{item!r} is not WORKSPACE=VALUE, such as {example}.")
        elif name in found:
            errors.append(f"{name} is given twice.")
        elif sizes and parse_size(value) is None:
            errors.append(f"{item!r}: the {what} must be +N, -N or N whole GPUs, such as {example}.")
        elif not sizes and value and not _NAME.match(value):
            errors.append(f"{item!r}: a cohort name is lowercase letters, digits and dashes.")
        else:
            found[name] = (parse_size(value) or "") if sizes else value
    return found, errors


def problems(changes: Changes, base: Setup, since: datetime, until: datetime) -> dict[str, list[str]]:
    """What is wrong with a request against today's settings, by field (empty: nothing)."""
    errors: dict[str, list[str]] = defaultdict(list)
    if since >= until:
        errors["until"].append("The window must end after it begins.")
    known = set(base.cohorts)
    for fieldname, names in (("quotas", changes.quotas), ("cohorts", changes.cohorts)):
        for name in sorted(set(names) - known):
            errors[fieldname].append(f"{NO_SUCH_WORKSPACE} {name}.")
    for name, value in changes.quotas.items():
        if name in known and resize(base.quotas.get(name, 0), value) < 0:
            errors["quotas"].append(
                f"{name} has {base.quotas.get(name, 0)} GPUs of quota: {value} leaves fewer than 0."
            )
    if changes.policy is not None and changes.policy not in POLICIES:
        errors["policy"].append(f"The policy is one of {', '.join(POLICIES)}.")
    if changes.cluster_gpus:
        size = resize(base.cluster_gpus, changes.cluster_gpus)
        if not 1 <= size <= MAX_CLUSTER_GPUS:
            errors["cluster_gpus"].append(
                f"The cluster has {base.cluster_gpus} GPUs: {changes.cluster_gpus} makes {size}; "
                f"give 1 to {MAX_CLUSTER_GPUS:,}."
            )
    return dict(errors)


# --- History ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    """One recorded workload as the replay runs it: the trace job, its gang's shape (None: reshaped
    by the trace replay's rule), its priority as the scheduler ranks it (its class first), and whether the
    scheduler may preempt it."""

    job: Job
    shape: tuple[int, Decimal] | None
    priority: int
    preemptible: bool


@dataclass
class History:
    workloads: list[Recorded]
    skipped: dict[str, int]  # why recorded workloads are not replayed, and how many


def load_history(since: datetime, until: datetime, now: datetime | None = None) -> History:
    """The workloads of scheduled kinds submitted in [since, until), in submission order, each run
    for as long as it actually held its GPUs (to `now` if it still does)."""
    now = now or timezone.now()
    kinds = scheduled()
    rows = (
        Row.objects.filter(kind__in=list(kinds), created_at__gte=since, created_at__lt=until)
        .select_related("workspace")
        .prefetch_related("podsets")
        .order_by("created_at", "id")
    )
    recorded: list[Recorded] = []
    skipped = {"never_started": 0, "no_gpus": 0}
    for seq, row in enumerate(rows.iterator(chunk_size=2000)):
        holding = adapter.gpu_pod_sets(row)
        started = row.started_at or row.admitted_at
        if not holding:
            skipped["no_gpus"] += 1
            continue
        if started is None:
            skipped["never_started"] += 1
            continue
        held_s = max(0.0, ((row.finished_at or now) - started).total_seconds())
        total = sum((p.gpus * p.replicas for p in holding), Decimal("0"))
        shape = (holding[0].replicas, holding[0].gpus) if len(holding) == 1 else None
        job = Job(
            f"{row.kind}:{row.pk}", (row.created_at - since).total_seconds(), held_s, total, row.workspace.name, seq
        )
        preemptible = kinds[row.kind].preempt is not None and row.preemptible
        recorded.append(Recorded(job, shape, row.scheduling_priority, preemptible))
    return History(recorded, skipped)


# --- The replay -------------------------------------------------------------------------------

Progress = Callable[[float], None]


class HistoryReplay(Replay):
    """The trace replay, fed recorded workloads: each keeps its own gang shape, priority and
    preemptibility, and preemptions are counted per workspace."""

    def __init__(self, history: History, setup: Setup, on_progress: Progress | None = None):
        options = Options(
            gpus_per_node=setup.gpus_per_node,
            policy=setup.policy,
            interval_s=setup.interval_s,
            cohorts=setup.cohorts,
            cluster_gpus=setup.cluster_gpus,
        )
        super().__init__([r.job for r in history.workloads], setup.quotas, options)
        self.recorded = {r.job.job_id: r for r in history.workloads}
        for job_id, progress in self.progress.items():
            shape = self.recorded[job_id].shape
            if shape is not None:
                progress.replicas, progress.gpus_per_replica = shape
        self.preempted_by: dict[str, int] = defaultdict(int)
        self.submitted: set[str] = set()
        self.finished = 0
        self.on_progress = on_progress

    def _workload(self, progress: Any, expected_runtime_s: float | None = None) -> Workload:
        recorded = self.recorded[progress.job.job_id]
        workload = super()._workload(progress, expected_runtime_s)
        return replace(workload, priority=recorded.priority, preemptible=recorded.preemptible)

    def _submit(self, progress: Any, now: float) -> None:
        job = progress.job
        if job.job_id in self.submitted:  # back in line after a preemption
            self.preempted_by[job.team] += 1
        self.submitted.add(job.job_id)
        super()._submit(progress, now)

    def _finish(self, job_id: str, now: float) -> None:
        super()._finish(job_id, now)
        self.finished += 1
        if self.on_progress is not None:
            self.on_progress(self.finished / len(self.progress))


def figures(run: HistoryReplay) -> dict[str, dict[str, Any]]:
    """Per workspace, and for all together (ALL): jobs, those that never ran (larger than the
    cluster or than any quota allows), mean and p95 wait for the first start, mean JCT, preemptions,
    and the share of the cluster's GPU time its work used over the replay's makespan."""
    metrics = compute_metrics(run)
    waits = per_workspace(run)
    capacity_s = sum(len(n.devices) for n in run.nodes) * metrics["makespan_s"]
    jct: dict[str, list[float]] = defaultdict(list)
    useful: dict[str, float] = defaultdict(float)
    for progress in run.progress.values():
        if progress.finished_at is not None:
            jct[progress.job.team].append(progress.finished_at - progress.job.submit_s)
            useful[progress.job.team] += float(progress.job.num_gpus) * progress.job.duration_s
    rows: dict[str, dict[str, Any]] = {}
    for team, wait in waits.items():
        rows[team] = {
            "jobs": wait["jobs"],
            "not_run": wait["jobs"] - len(jct[team]),
            "mean_wait_s": wait["mean_wait_s"],
            "p95_wait_s": wait["p95_wait_s"],
            "mean_jct_s": _mean(jct[team]),
            "preemptions": run.preempted_by.get(team, 0),
            "gpu_utilization": round(useful[team] / capacity_s, 6) if capacity_s > 0 else 0.0,
        }
    first = sorted(run.first_start[j] - p.job.submit_s for j, p in run.progress.items() if j in run.first_start)
    rows[ALL] = {
        "jobs": metrics["jobs"],
        "not_run": sum(row["not_run"] for row in rows.values()),
        "mean_wait_s": _mean(first),
        "p95_wait_s": round(percentile(first, 0.95), 6),
        "mean_jct_s": metrics["avg_jct_s"],
        "preemptions": metrics["preemptions"],
        "gpu_utilization": metrics["gpu_utilization"],
    }
    return rows


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 6) if values else 0.0


def compare(history: History, base: Setup, changed: Setup, on_progress: Progress | None = None) -> dict[str, Any]:
    """Both replays' figures, per workspace: {"baseline": {...}, "whatif": {...}}."""
    result: dict[str, Any] = {}
    for n, (name, setup) in enumerate((("baseline", base), ("whatif", changed))):
        report = None if on_progress is None else _part(on_progress, n, 2)
        result[name] = figures(_run(HistoryReplay(history, setup, report)))
    return result


def _run(run: HistoryReplay) -> HistoryReplay:
    run.run()
    return run


def _part(report: Progress, index: int, parts: int) -> Progress:
    return lambda fraction: report((index + fraction) / parts)


# --- Requests and the background run --------------------------------------------------------

REPLAY_TASK = "portal.whatif_replay"  # workers/tasks.py


@transaction.atomic(durable=True)
def check_start_whatif(
    since: datetime, until: datetime, changes: Changes, *, acting_user: Any, origin: Origin = SYSTEM
) -> WhatIfReplay:
    """Record an admin's what-if replay of the workloads submitted in [since, until) and, once
    committed, have a worker run it. ActionError (naming its field) for a request that makes no sense
    against today's settings. Changes nothing else: a replay never touches live state."""
    if not getattr(acting_user, "is_staff", False):
        raise ActionError("Only platform admins can run what-if replays.")
    found = problems(changes, today(), since, until)
    if found:
        name, messages = next(iter(found.items()))
        raise ActionError(messages[0], field=name)
    run = WhatIfReplay.objects.create(created_by=acting_user, since=since, until=until, changes=changes.as_json())
    do_log_event(
        Event.WHATIF_START,
        run,
        acting_user=acting_user,
        origin=origin,
        data={"since": since.isoformat(), "until": until.isoformat(), "changes": changes.describe()},
    )
    transaction.on_commit(lambda: _send(run.pk))
    return run


def _send(pk: int) -> None:
    """Run it here (the tests' "inline" trigger) or send it to a worker; with the trigger "off"
    nothing is sent and the row waits for `run_replay`."""
    mode = settings.PORTAL_WORKLOAD_TRIGGER
    if mode == "inline":
        run_here(REPLAY_TASK, pk)
    elif mode == "task":
        try:
            current_app.send_task(REPLAY_TASK, args=(pk,))  # routed by workers.tasks.route
        except Exception:
            logger.warning("could not queue what-if replay %s", pk, exc_info=True)
            WhatIfReplay.objects.filter(pk=pk, state=WhatIfReplay.State.QUEUED).update(
                state=WhatIfReplay.State.FAILED,
                message="The task queue could not be reached.",
                finished_at=timezone.now(),
            )


def run_replay(pk: int) -> None:
    """Run a queued what-if replay (the task's body): claimed once with a conditional update, so a
    second delivery does nothing; its progress and then its figures, or why it failed, written to
    its row only."""
    now = timezone.now()
    claimed = WhatIfReplay.objects.filter(pk=pk, state=WhatIfReplay.State.QUEUED).update(
        state=WhatIfReplay.State.RUNNING, started_at=now, heartbeat_at=now
    )
    if not claimed:
        return
    run = WhatIfReplay.objects.get(pk=pk)
    try:
        result = _replay(run)
    except Exception as error:  # recorded on the row for the admin; the worker goes on
        logger.exception("what-if replay %s failed", pk)
        WhatIfReplay.objects.filter(pk=pk, state=WhatIfReplay.State.RUNNING).update(
            state=WhatIfReplay.State.FAILED,
            message=str(error)[:500] or type(error).__name__,
            finished_at=timezone.now(),
        )
        return
    WhatIfReplay.objects.filter(pk=pk, state=WhatIfReplay.State.RUNNING).update(
        state=WhatIfReplay.State.SUCCEEDED, progress=1.0, result=result, finished_at=timezone.now()
    )


def upkeep() -> dict[str, int]:
    """Replays whose worker stopped mid-run (killed, its machine gone) end FAILED, saying so, rather
    than showing "running" for ever; the scheduler loop calls it. A replay that comes back to life
    after that writes nothing more: its progress and its end are written only while RUNNING. A replay
    no worker took within as long (its task lost with the broker's queue) is sent again, once each
    such period: the claim lets only one delivery run it."""
    now = timezone.now()
    cutoff = now - LOST_AFTER
    lost = WhatIfReplay.objects.filter(state=WhatIfReplay.State.RUNNING, heartbeat_at__lt=cutoff).update(
        state=WhatIfReplay.State.FAILED,
        message=f"Its worker stopped: no progress for {LOST_AFTER.seconds // 60} minutes. Start it again.",
        finished_at=now,
    )
    untaken = Q(state=WhatIfReplay.State.QUEUED) & (
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, created_at__lt=cutoff)
    )
    resent = 0
    for pk in list(WhatIfReplay.objects.filter(untaken).values_list("pk", flat=True)[:100]):
        if WhatIfReplay.objects.filter(untaken, pk=pk).update(heartbeat_at=now):  # this loop's, once a period
            _send(pk)
            resent += 1
    return {name: count for name, count in (("whatif_lost", lost), ("whatif_resent", resent)) if count}


def _replay(run: WhatIfReplay) -> dict[str, Any]:
    changes = Changes.from_json(run.changes)
    base = today()
    changed = changes.apply(base)
    history = load_history(run.since, run.until)
    if not history.workloads:
        raise ValueError("No workload in this window ever held GPUs: there is nothing to replay.")
    if base.cluster_gpus < 1:
        raise ValueError("The portal has no GPUs and no quotas: there is no cluster to replay on.")
    last = [0.0]

    def report(fraction: float) -> None:
        if time.monotonic() - last[0] >= PROGRESS_EVERY_S:
            last[0] = time.monotonic()
            WhatIfReplay.objects.filter(pk=run.pk, state=WhatIfReplay.State.RUNNING).update(
                progress=round(min(fraction, 0.999), 3), heartbeat_at=timezone.now()
            )

    figures = compare(history, base, changed, report)
    return {
        "workloads": len(history.workloads),
        "skipped": history.skipped,
        "changes": changes.describe(),
        "settings": {"baseline": base.as_json(), "whatif": changed.as_json()},
        **figures,
    }


# --- Side by side ------------------------------------------------------------------------------


def side_by_side(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per workspace (all together first), each figure as (baseline, what-if)."""
    base, changed = result["baseline"], result["whatif"]
    names = [ALL, *sorted((base.keys() | changed.keys()) - {ALL})]
    empty = dict.fromkeys(FIGURES, 0)
    return [
        {"workspace": name, **{f: (base.get(name, empty)[f], changed.get(name, empty)[f]) for f in FIGURES}}
        for name in names
    ]


def as_csv(result: dict[str, Any]) -> str:
    """The side-by-side figures as CSV: workspace, then each figure's baseline and what-if columns."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["workspace", *(f"{f}_{side}" for f in FIGURES for side in ("baseline", "whatif"))])
    for row in side_by_side(result):
        writer.writerow([row["workspace"], *(_cell(v) for f in FIGURES for v in row[f])])
    return out.getvalue()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") if math.isfinite(value) else ""
    return str(value)
