"""Loads the engine's snapshot from the database and applies its decisions in one transaction."""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from statistics import median
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, models, transaction
from django.db.models import F, Sum, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from apps.elastic.notes import starting_notes
from apps.inventory.models import GPU, Allocation, Cluster, Node
from apps.provisioning.models import ProvisioningRequest
from apps.scheduling import engine
from apps.scheduling.actions import Admission, AdmittedDevice, AdmittedReplica, do_admit_workload
from apps.scheduling.models import FairShareUsage
from apps.scheduling.types import OBSERVED_RUNS, OBSERVED_WITHIN_S, Reservation
from apps.workloads.kinds import scheduled
from apps.workloads.models import PodSet, Workload
from apps.workspaces.live import notify
from apps.workspaces.models import GPUQuota, Workspace

logger = logging.getLogger(__name__)

# Any fixed number: it names the advisory lock that keeps two cycles from running at once.
_CYCLE_LOCK_ID = 7_400_113

Row = Workload


@dataclass
class CycleResult:
    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    pending: int = 0


def policy() -> engine.Policy:
    """The cluster policy from settings, with each cluster's placement."""
    return engine.Policy(
        name=settings.PORTAL_SCHEDULER_POLICY,
        half_life_s=float(settings.PORTAL_FAIR_SHARE_HALF_LIFE_S),
        preemption=settings.PORTAL_PREEMPTION,
        min_runtime_s=float(settings.PORTAL_PREEMPTION_MIN_RUNTIME_S),
        grace_s=float(settings.PORTAL_PREEMPTION_GRACE_S),
        starvation_s=float(settings.PORTAL_STARVATION_S),
        placement_by_cluster=tuple(Cluster.objects.values_list("name", "placement")),
    )


def _key(row: Row) -> str:
    return f"{row.kind}:{row.pk}"


def gpu_pod_sets(row: Row) -> list[PodSet]:
    """Its pod sets that hold GPUs, in order: the engine places these (the others hold none)."""
    return [podset for podset in row.podsets.all() if podset.gpus > 0]


def _shape(row: Row) -> tuple[str, Decimal, int, tuple[tuple[Decimal, int], ...]]:
    """The engine's shape of a workload: GPU type, the first GPU pod set's GPUs per replica and
    replicas, and the others'. A workload without GPUs is one replica of none."""
    holding = gpu_pod_sets(row)
    if not holding:
        return "", Decimal("0"), 1, ()
    first, *others = holding
    return first.gpu_type, first.gpus, first.replicas, tuple((p.gpus, p.replicas) for p in others)


def _ts(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def _cluster_name(row: Row, *, pending: bool) -> str | None:
    """The cluster a running workload holds its devices on; for a pending one, the cluster its
    submitter asked for (None: any)."""
    if pending:
        return row.requested_cluster.name if row.requested_cluster_id else None
    return row.cluster.name if row.cluster_id else None


def observed_runtimes(rows: list[Row], now: datetime) -> dict[tuple[int, str], float]:
    """The median run time, in seconds, of the last OBSERVED_RUNS runs of each (workspace id, name)
    of `rows` (of kinds that estimate) that succeeded within OBSERVED_WITHIN_S: one query a kind."""
    runs: dict[tuple[int, str], list[float]] = defaultdict(list)
    for kind, traits in scheduled().items():
        if traits.succeeded is not None:
            _observe(kind, traits.succeeded, [r for r in rows if r.kind == kind], now, runs)
    return {key: median(seconds) for key, seconds in runs.items()}


def _observe(
    kind: str, succeeded: str, rows: list[Row], now: datetime, runs: dict[tuple[int, str], list[float]]
) -> None:
    wanted = {(row.workspace_id, row.name) for row in rows}
    if not wanted:
        return
    recent = (
        Workload.objects.filter(
            kind=kind,
            state=succeeded,
            workspace_id__in={workspace for workspace, _ in wanted},
            name__in={name for _, name in wanted},
            started_at__isnull=False,
            finished_at__gte=now - timedelta(seconds=OBSERVED_WITHIN_S),
        )
        .annotate(
            recency=Window(RowNumber(), partition_by=[F("workspace_id"), F("name")], order_by=F("finished_at").desc())
        )
        .filter(recency__lte=OBSERVED_RUNS)
        .order_by()
        .values_list("workspace_id", "name", "started_at", "finished_at")
    )
    for workspace, name, started_at, finished_at in recent:
        if (workspace, name) in wanted:  # the filter above matches every pairing of the two sets
            runs[workspace, name].append(max(0.0, (finished_at - started_at).total_seconds()))


def _as_workload(
    row: Row,
    allocations: dict[int, list[Allocation]] | None,
    observed: dict[tuple[int, str], float],
    details: dict[int, tuple[bool, float | None]],
) -> engine.Workload:
    """The engine's view of a row: pending when `allocations` is None, else running with its placement.
    Its runtime for estimates is what `observed` says of its name; `details` say whether it takes a
    grace signal and its declared limit, where its kind has them."""
    traits = scheduled()[row.kind]
    checkpointable, limit = details.get(row.pk, (False, None))
    gpu_type, gpus, replica_count, more = _shape(row)
    placement: tuple[engine.ReplicaPlacement, ...] = ()
    if allocations is not None:
        position = {podset.pk: podset.position for podset in row.podsets.all()}
        replicas: dict[tuple[int, int], list[Allocation]] = defaultdict(list)
        for allocation in allocations.get(row.pk, []):
            replicas[position.get(allocation.podset_id, 0), allocation.replica].append(allocation)
        placement = tuple(
            engine.ReplicaPlacement(
                _node_name(held[0].gpu.node_id, held[0].gpu.gpu_type), tuple((a.gpu.index, a.fraction) for a in held)
            )
            for _, held in sorted(replicas.items())
        )
    return engine.Workload(
        key=_key(row),
        workspace=row.workspace.name,
        gpu_type=gpu_type,
        gpus_per_replica=gpus,
        replicas=replica_count,
        more=more,
        priority=row.scheduling_priority,
        seq=int(row.created_at.timestamp() * 1_000_000) * 10 + (0 if traits.preempt is None else 1),
        submitted_at=row.created_at.timestamp(),
        # Kinds the scheduler never preempts (interactive instances); the others unless their owner said so.
        preemptible=traits.preempt is not None and row.preemptible,
        checkpointable=checkpointable,
        expected_runtime_s=observed.get((row.workspace_id, row.name)) if traits.succeeded else None,
        max_runtime_s=limit,
        eligible_at=_ts(row.eligible_at) or 0.0,
        started_at=_ts(row.started_at or row.admitted_at),
        cluster=_cluster_name(row, pending=allocations is None),
        placement=placement,
        reservation=f"gpr:{row.reservation_id}" if allocations is not None and row.reservation_id else None,
    )


@dataclass(frozen=True)
class NodeRef:
    """What an engine node stands for in the inventory: one node's GPUs of one type."""

    node_id: int
    gpu_type: str
    gpu_ids: dict[int, int]  # device index -> GPU id


def _node_name(node_id: int, gpu_type: str) -> str:
    """The engine's name for a node's GPUs of one type (a node may hold several types); a label the
    audit shows, never read back: `NodeRef` says what it stands for."""
    return f"{node_id}/{gpu_type}"


def _load_nodes() -> tuple[tuple[engine.NodeInfo, ...], dict[str, NodeRef]]:
    """The engine's nodes (one per node and GPU type) with each device's free share, and what each
    stands for, by its name.

    Drained, down and cordoned nodes (apps/inventory/maintenance.py) come with no free share:
    nothing is placed there, but work that needs them waits for them instead of being refused.
    """
    used = dict(Allocation.objects.values("gpu_id").annotate(total=Sum("fraction")).values_list("gpu_id", "total"))
    gpus = GPU.objects.filter(node__pool__cluster__enabled=True).values_list(
        "pk", "node_id", "index", "gpu_type", "node__pool__cluster__name", "node__state", "node__cordoned_at"
    )
    devices: dict[tuple[int, str, str], list[engine.Device]] = {}
    refs: dict[str, NodeRef] = {}
    for gpu_pk, node_pk, index, gpu_type, cluster, state, cordoned in gpus.order_by("node_id", "index"):
        free = max(Decimal("0"), Decimal("1") - used.get(gpu_pk, Decimal("0")))
        if state != Node.State.READY or cordoned is not None:
            free = Decimal("0")
        devices.setdefault((node_pk, gpu_type, cluster), []).append(engine.Device(index, free))
        name = _node_name(node_pk, gpu_type)
        refs.setdefault(name, NodeRef(node_pk, gpu_type, {})).gpu_ids[index] = gpu_pk
    nodes = tuple(
        engine.NodeInfo(name=_node_name(node_pk, gpu_type), cluster=cluster, gpu_type=gpu_type, devices=tuple(devs))
        for (node_pk, gpu_type, cluster), devs in devices.items()
    )
    return nodes, refs


def _update_history(now: datetime, half_life_s: float, running: list[Row]) -> dict[int, dict[str, float]]:
    """Decay each workspace's past use and add what ran since the last cycle; returns it per workspace."""
    in_use: dict[tuple[int, str], float] = defaultdict(float)
    for row in running:
        for podset in gpu_pod_sets(row):
            in_use[row.workspace_id, podset.gpu_type] += float(podset.gpus * podset.replicas)
    rows = {(u.workspace_id, u.gpu_type): u for u in FairShareUsage.objects.select_for_update()}
    for key in in_use.keys() - rows.keys():
        rows[key] = FairShareUsage(workspace_id=key[0], gpu_type=key[1], gpu_seconds=0.0, updated_at=now)
    history: dict[int, dict[str, float]] = defaultdict(dict)
    for (workspace_id, gpu_type), usage in rows.items():
        elapsed = max(0.0, (now - usage.updated_at).total_seconds())
        usage.gpu_seconds = (
            usage.gpu_seconds * 0.5 ** (elapsed / half_life_s) + in_use[workspace_id, gpu_type] * elapsed
        )
        usage.updated_at = now
        history[workspace_id][gpu_type] = usage.gpu_seconds
    FairShareUsage.objects.bulk_create(
        rows.values(),
        update_conflicts=True,
        unique_fields=["workspace", "gpu_type"],
        update_fields=["gpu_seconds", "updated_at"],
    )
    return history


def _load_workspaces(history: dict[int, dict[str, float]]) -> tuple[engine.WorkspaceInfo, ...]:
    quotas: dict[int, list[engine.Quota]] = defaultdict(list)
    for q in GPUQuota.objects.all():
        quotas[q.workspace_id].append(engine.Quota(q.gpu_type, q.gpus, q.borrowing_limit, q.lending_limit))
    # Names, not ids: the engine's reasons name the workspace and cohort to the user.
    rows = Workspace.objects.values_list("pk", "name", "cohort__name", "can_borrow", "fair_share_weight")
    return tuple(
        engine.WorkspaceInfo(
            name=name,
            quotas=tuple(quotas[pk]),
            cohort=cohort,
            can_borrow=can_borrow,
            weight=float(weight),
            history=tuple(sorted(history.get(pk, {}).items())),
        )
        for pk, name, cohort, can_borrow, weight in rows
    )


@dataclass
class Loaded:
    snapshot: engine.Snapshot
    rows: dict[str, Row]  # pending and running, by engine key
    nodes: dict[str, NodeRef]  # by engine node name


def load_snapshot(now: datetime | None = None) -> Loaded:
    now = now or timezone.now()
    rules = policy()
    kinds = scheduled()
    rows = Workload.objects.select_related("workspace", "cluster", "requested_cluster").prefetch_related("podsets")
    waiting, holding = models.Q(pk__in=[]), models.Q(pk__in=[])
    for kind, traits in kinds.items():
        waiting |= models.Q(kind=kind, state=traits.queued)
        holding |= models.Q(kind=kind, state__in=traits.holding)
    # Oldest first, as the engine's tie-break (seq) orders them too.
    pending: list[Row] = list(rows.filter(waiting).order_by("created_at", "id"))
    running: list[Row] = list(rows.filter(holding).order_by("created_at", "id"))
    allocations: dict[int, list[Allocation]] = defaultdict(list)
    # What runs on a cordoned node is left out of its placement: preempting it would free nothing
    # there for other work (the node has no free share), so the engine never evicts it for that.
    for allocation in Allocation.objects.select_related("gpu").filter(gpu__node__cordoned_at__isnull=True):
        allocations[allocation.workload_id].append(allocation)
    history = _update_history(now, rules.half_life_s, running)
    nodes, refs = _load_nodes()
    observed = observed_runtimes([*pending, *running], now) if pending else {}
    details: dict[int, tuple[bool, float | None]] = {}
    for kind, traits in kinds.items():
        if traits.details is not None:
            details.update(traits.details(r.pk for r in [*pending, *running] if r.kind == kind))
    snapshot = engine.Snapshot(
        workspaces=_load_workspaces(history),
        nodes=nodes,
        running=tuple(_as_workload(r, allocations, observed, details) for r in running if gpu_pod_sets(r)),
        pending=tuple(_as_workload(r, None, observed, details) for r in pending),
        now=now.timestamp(),
        policy=rules,
        reservations=reservations(now),
    )
    return Loaded(snapshot, {_key(r): r for r in [*pending, *running]}, refs)


def reservations(now: datetime) -> tuple[Reservation, ...]:
    """The approved provisioning requests not yet ended, as the engine's reservations: their
    devices by the engine's node names."""
    held = (
        ProvisioningRequest.objects.filter(state__in=ProvisioningRequest.HOLDING_STATES, held_end__gt=now)
        .select_related("workspace", "held_cluster")
        .prefetch_related("devices")
        .order_by("held_start", "id")
    )
    return tuple(as_reservation(gpr) for gpr in held if gpr.held_start is not None)


def as_reservation(gpr: ProvisioningRequest) -> Reservation:
    assert gpr.held_start is not None and gpr.held_end is not None and gpr.held_cluster is not None
    devices = sorted((_node_name(gpu.node_id, gpu.gpu_type), gpu.index) for gpu in gpr.devices.all())
    return Reservation(
        key=gpr.key,
        workspace=gpr.workspace.name,
        cluster=gpr.held_cluster.name,
        gpu_type=gpr.gpu_type,
        devices=tuple(devices),
        start=gpr.held_start.timestamp(),
        end=gpr.held_end.timestamp(),
        label=reservation_label(gpr.workspace.name, gpr.held_start, gpr.held_end),
    )


def reservation_label(workspace: str, start: datetime, end: datetime) -> str:
    """How the queue's reasons name a reservation: "team-b's reservation, Mon 27 Nov 09:00-Thu 30 Nov
    09:00 UTC"."""
    return f"{workspace}'s reservation, {start:%a %d %b %H:%M}-{end:%a %d %b %H:%M} UTC"


def _admit(row: Row, decision: engine.Admit, nodes: dict[str, NodeRef]) -> bool:
    """Apply one admission in a savepoint of the cycle (the action's transaction): if the database
    refuses its devices (shares of one GPU above one, see inventory's migration 0003), it stays
    queued and the cycle goes on."""
    try:
        return do_admit_workload(row, _admission(row, decision, nodes))
    except IntegrityError:
        logger.error("admission of %s refused: a device would be shared above one", _key(row))
        return False


def _admission(row: Row, decision: engine.Admit, nodes: dict[str, NodeRef]) -> Admission:
    """The engine's decision in the database's terms: the cluster's id, and each replica's pod set,
    index within it and devices' GPU ids (the engine places the GPU pod sets' replicas in order)."""
    places = [(podset.pk, index) for podset in gpu_pod_sets(row) for index in range(podset.replicas)]
    replicas = tuple(
        AdmittedReplica(
            replica.node,
            tuple(AdmittedDevice(index, nodes[replica.node].gpu_ids[index], share) for index, share in replica.devices),
            podset_id=places[n][0],
            index=places[n][1],
        )
        for n, replica in enumerate(decision.placement)
    )
    reservation = int(decision.reservation.removeprefix("gpr:")) if decision.reservation else None
    return Admission(_cluster_id(row, decision.cluster), replicas, decision.borrowed, reservation)


def _cluster_id(row: Row, cluster: str | None) -> int | None:
    """The cluster the engine placed the workload on; for work without GPUs (placed on none), the
    cluster asked for, else the default one."""
    cluster_id = Cluster.objects.filter(name=cluster).values_list("pk", flat=True).first() if cluster else None
    if cluster_id is None:
        cluster_id = row.requested_cluster_id
    if cluster_id is None:
        cluster_id = Cluster.objects.filter(is_default=True).values_list("pk", flat=True).first()
    return cluster_id


KEEP = math.nan  # an estimated start `_record_pending` leaves as stored (a cycle that did not estimate)


def _record_pending(row: Row, reason: str, workspace_position: int | None, cluster_position: int | None,
                    estimated_start: float | None) -> None:  # fmt: skip
    values: dict[str, Any] = {
        "wait_reason": reason[:500],
        "workspace_queue_position": workspace_position,
        "cluster_queue_position": cluster_position,
    }
    if estimated_start is not KEEP:
        # Whole seconds (an estimate that moves by a few milliseconds is not news), rounded up: the
        # engine's estimates lie after `now`, and so must the stored ones.
        values["estimated_start_at"] = (
            datetime.fromtimestamp(math.ceil(estimated_start), tz=UTC) if estimated_start is not None else None
        )
    if all(getattr(row, k) == v for k, v in values.items()):
        return
    Workload.objects.filter(pk=row.pk, state=scheduled()[row.kind].queued).update(**values)
    estimated = values.get("estimated_start_at", row.estimated_start_at)
    live = {**values, "estimated_start_at": estimated and estimated.isoformat()}
    notify(row.workspace_id, row.kind, {"id": row.pk, "state": row.state, **live})


class _EstimatesDue:
    """When a cycle works out estimated starts. Playing the line forward costs more than the rest of
    an explained pass where much waits (about 0.2 s of CPU at 150,000 pending), and estimates of
    starts minutes or hours away need not be new every few seconds: each cycle estimates while that
    costs under `EVERY_CYCLE_S`; past that, once the last estimates are older than `SHARE` times
    what they cost (so they take about 1% of the scheduler's time), and at the latest when they
    are `PORTAL_ESTIMATES_MAX_AGE_S` old. The cost is the lesser of the last two (one slow play, a
    garbage collection in it, does not space them out). The other cycles give reasons and
    positions and leave the stored estimates as they are. Kept per process (a restarted scheduler
    estimates at once)."""

    EVERY_CYCLE_S = 0.05
    SHARE = 100

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.at = -math.inf  # time.monotonic() of the last estimates
        self.costs_s = (0.0, 0.0)  # what the last two cost, in CPU seconds

    def now(self) -> bool:
        cost = min(self.costs_s)
        if cost < self.EVERY_CYCLE_S:
            return True
        return time.monotonic() - self.at >= min(self.SHARE * cost, float(settings.PORTAL_ESTIMATES_MAX_AGE_S))

    def done(self, cost_s: float) -> None:
        self.at, self.costs_s = time.monotonic(), (self.costs_s[1], cost_s)


estimates_due = _EstimatesDue()


def _lock_cycle() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CYCLE_LOCK_ID])


def run_cycle() -> CycleResult:
    """One scheduling cycle: snapshot, decide, apply. Safe to run concurrently: cycles serialise."""
    result = CycleResult()
    with transaction.atomic():
        _lock_cycle()
        loaded = load_snapshot()
        if not loaded.snapshot.pending and not loaded.snapshot.reservations:
            return result
        estimate = estimates_due.now()
        decisions = engine.schedule(replace(loaded.snapshot, estimate=estimate))
        if decisions.estimated:
            estimates_due.done(decisions.estimate_s)
        # Victims first: the workloads admitted for them take the devices they free.
        for preempt in decisions.preempted:
            row = loaded.rows[preempt.key]
            evict = scheduled()[row.kind].preempt
            if evict is not None:
                evict(row.pk, preempt.reason, preempt.grace_s)
                result.preempted.append(preempt.key)
        evicted = {preempt.key for preempt in decisions.preempted}
        for admit in decisions.admitted:
            if admit.key in evicted:  # the engine never decides both; never apply both either
                logger.error("%s was both admitted and evicted in one cycle; not admitted", admit.key)
                continue
            if _admit(loaded.rows[admit.key], admit, loaded.nodes):
                result.admitted.append(admit.key)
        starting = starting_notes(timezone.now()) if Node.objects.filter(state=Node.State.POWERING_UP).exists() else {}
        for pending in decisions.pending:
            note = starting.get(pending.key)
            _record_pending(
                loaded.rows[pending.key],
                f"{pending.reason}; {note}" if note else pending.reason,
                pending.workspace_position,
                pending.cluster_position,
                pending.estimated_start if decisions.estimated else KEEP,
            )
        for rejected in decisions.rejected:  # stays queued, saying why, until an admin changes quota
            _record_pending(loaded.rows[rejected.key], rejected.reason, None, None, None)
        result.pending = len(decisions.pending) + len(decisions.rejected)
    if result.admitted or result.preempted:
        logger.info("admitted %s; preempted %s", ", ".join(result.admitted), ", ".join(result.preempted) or "none")
    return result


def requeue_unready_gangs() -> list[int]:
    """Requeue admitted gangs whose replicas are not all running in time, with doubling backoff."""
    timeout = settings.PORTAL_GANG_READY_TIMEOUT_S
    requeued = []
    for traits in scheduled().values():
        if traits.requeue_unready is not None:
            requeued.extend(traits.requeue_unready(timeout))
    return requeued
